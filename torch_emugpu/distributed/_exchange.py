"""The ranks' exchange for backend `emu`: one all-gather of a few int64 words
per rank per collective (emulated start times, flags, a signature of the
tensors), and the real bytes of small (or compute-mode) tensors.

Two transports. An internal gloo group over TCP, bootstrapped from the
process group's Store under its own prefix (no port is fixed; the rendezvous
is the one the user configured), is always there: it carries large payloads,
send/recv and clock measurements, and everything where ranks span machines.
Where every rank of the group shares this machine (the usual emulated node),
the word gathers and payloads up to `ShmExchange::kDataCapacity` go through
one shared-memory segment instead (core/shm_exchange.h): a store and a futex
wake rather than TCP round trips, which is most of a collective's host cost
when eight ranks share two cores. EMUGPU_EXCHANGE=tcp keeps everything on
TCP. The exchange knows nothing of the timeline: a later mode that does not
sleep at all reuses it as is (clocks come in as functions).
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import pickle
import secrets
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist


class ExchangeError(dist.DistBackendError):
    """A rank left, or did not arrive within the timeout, during an exchange."""


class Exchange:
    """All-gathers words and objects, and runs gloo collectives on CPU tensors,
    among the `size` ranks of one process group."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        self.rank = rank
        self.size = size
        self.timeout = timeout
        # The prefix keeps gloo's rendezvous keys apart from c10d's own, and
        # from those of this group's earlier instances (see _fresh_namespace).
        base = dist.PrefixStore("emu_exchange/", store)
        prefixed = dist.PrefixStore(_fresh_namespace(base, rank, size, timeout) + "/", base)
        self._reports = dist.PrefixStore("reports/", prefixed)
        address = _address_towards_store(store)
        if address is None:
            self._gloo = dist.ProcessGroupGloo(prefixed, rank, size, timeout)
        else:
            opts = dist.ProcessGroupGloo._Options()
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
            opts._timeout = timeout
            opts._threads = 2  # what the timeout-only constructor gives one device
            self._gloo = dist.ProcessGroupGloo(prefixed, rank, size, opts)
        self._shm = None  # the set-up's own gathers go over TCP
        self._tcp_gathers = 0
        self._shm = _shared_memory(dist.PrefixStore("shm/", prefixed), rank, size, self.gather_words)
        # Bytes per rank the shared-memory transport carries (0: none, all goes over TCP).
        self.shm_capacity = int(self._shm.capacity) if self._shm is not None else 0

    @property
    def shm(self) -> Any:
        """The shared-memory transport (core ShmExchange), or None."""
        return self._shm

    @property
    def transport(self) -> str:
        return "shm" if self._shm is not None else "tcp"

    def _guard(self, what: str, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except RuntimeError as e:
            raise ExchangeError(
                f"emu backend: rank {self.rank} of {self.size}: {what} failed: another rank exited or did not "
                f"arrive within the process group's timeout ({self.timeout.total_seconds():g} s). "
                f"Check the other ranks' output for their error. Transport said: {e}"
            ) from e

    def _wait(self, work: dist.Work, what: str) -> None:
        self._guard(what, work.wait)

    def gather_words(self, words: Sequence[int], what: str) -> torch.Tensor:
        """Every rank's `words` (same count on every rank), as a [size, len(words)] int64 tensor."""
        return self.start_gather_words(words, what)[0]()

    def start_gather_words(self, words: Sequence[int], what: str) -> tuple[Callable[[], torch.Tensor], str]:
        """gather_words without waiting: returns the call that waits and
        gives the result (from any thread), and the gather's key (the same
        on every rank: error reports about it go under it). Gathers pair up
        across ranks in the order they are started, whoever starts them
        (the backend's C++ side starts its own on the same segment)."""
        if self._shm is not None:
            shm, count, seconds = self._shm, len(words), self.timeout.total_seconds()
            ticket = self._guard(what, lambda: shm.start(list(words), seconds))
            return lambda: self._guard(what, lambda: shm.finish(ticket, count, seconds)), str(ticket)
        mine = torch.tensor(list(words), dtype=torch.int64)
        out = torch.empty(self.size * mine.numel(), dtype=torch.int64)
        work = self._gloo._allgather_base(out, mine)
        self._tcp_gathers += 1

        def finish() -> torch.Tensor:
            self._wait(work, what)
            return out.view(self.size, mine.numel())

        return finish, f"tcp{self._tcp_gathers}"

    def gather_bytes(self, mine: torch.Tensor, what: str) -> list[torch.Tensor]:
        """Every rank's bytes (a contiguous CPU uint8 tensor of at most
        `shm_capacity` bytes; lengths may differ), through shared memory."""
        assert self._shm is not None and mine.numel() <= self.shm_capacity
        shm, seconds = self._shm, self.timeout.total_seconds()
        return self._guard(what, lambda: shm.gather_bytes(mine, seconds))

    def report(self, key: str, obj: object, peer: int, what: str) -> object:
        """Posts this rank's picklable `obj` under `key` and returns `peer`'s,
        through the store: a side channel that works while gathers are in
        flight (error reports of collectives already launched)."""
        self._reports.set(f"{key}/{self.rank}", pickle.dumps(obj))
        try:
            return pickle.loads(self._reports.get(f"{key}/{peer}"))
        except RuntimeError as e:
            raise ExchangeError(f"emu backend: rank {self.rank} of {self.size}: {what} failed: rank {peer} did not "
                                f"report within the store's timeout. Transport said: {e}") from e

    # Point-to-point channels per user tag: a sender's words to its receiver,
    # the receiver's words back, and the message's bytes. gloo matches each
    # channel in order per peer, so a rank's k-th send to a peer pairs with
    # that peer's k-th recv from it (NCCL's rule), whatever else is in flight.
    P2P_TAGS = 1 << 28

    @staticmethod
    def p2p_tag(tag: int, channel: str) -> int:
        return 4 * tag + {"to_receiver": 0, "to_sender": 1, "bytes": 2}[channel]

    def post_words(self, words: Sequence[int], peer: int, tag: int) -> dist.Work:
        """Starts sending `words` to `peer` on gloo tag `tag`; wait with run()."""
        return self._gloo.send([torch.tensor(list(words), dtype=torch.int64)], peer, tag)

    def expect_words(self, count: int, peer: int, tag: int, what: str) -> Callable[[], torch.Tensor]:
        """Starts receiving `count` words from `peer` on `tag`; returns the
        call that waits for them (from any thread)."""
        theirs = torch.empty(count, dtype=torch.int64)
        work = self._gloo.recv([theirs], peer, tag)

        def finish() -> torch.Tensor:
            self._wait(work, what)
            return theirs

        return finish

    def send_bytes(self, host: torch.Tensor, peer: int, tag: int) -> dist.Work:
        """Starts sending a CPU tensor's bytes on `tag`; wait with run()."""
        return self._gloo.send([host], peer, tag)

    def recv_bytes(self, host: torch.Tensor, peer: int, tag: int, what: str) -> None:
        self._wait(self._gloo.recv([host], peer, tag), what)

    def clock_offset(self, peer: int, clock: Callable[[], int], rounds: int = 16) -> int:
        """This rank's `clock` minus `peer`'s, in its units, while `peer` runs
        serve_clock(self.rank, ...): NTP's estimate from the round trip with
        the shortest time (its error is at most half that round trip)."""
        best_rtt, best = None, 0
        what = f"clock offset to rank {peer}"
        for _ in range(rounds):
            mine = torch.tensor([clock()], dtype=torch.int64)
            theirs = torch.empty_like(mine)
            self._wait(self._gloo.send([mine], peer, _CLOCK_TAG), what)
            self._wait(self._gloo.recv([theirs], peer, _CLOCK_TAG), what)
            back = clock()
            sent = int(mine[0])
            if best_rtt is None or back - sent < best_rtt:
                best_rtt, best = back - sent, (sent + back) // 2 - int(theirs[0])
        return best

    def serve_clock(self, peer: int, clock: Callable[[], int], rounds: int = 16) -> None:
        """The other side of `peer`'s clock_offset()."""
        what = f"clock offset for rank {peer}"
        for _ in range(rounds):
            asked = torch.empty(1, dtype=torch.int64)
            self._wait(self._gloo.recv([asked], peer, _CLOCK_TAG), what)
            self._wait(self._gloo.send([torch.tensor([clock()], dtype=torch.int64)], peer, _CLOCK_TAG), what)

    def run(self, work: dist.Work, what: str) -> None:
        """Waits for a gloo collective started on `self.gloo`, with the exchange's error."""
        self._wait(work, what)

    @property
    def gloo(self) -> dist.ProcessGroupGloo:
        return self._gloo


# Above every tag the point-to-point channels derive from c10d's (small) ones (Exchange.P2P_TAGS).
_CLOCK_TAG = 1 << 30
_T = TypeVar("_T")


def _namespace_id(kind: str) -> int:
    try:
        link = os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return os.getpid()  # unknown: counts as a namespace of its own
    digest = hashlib.blake2b(link.encode(), digest_size=7).digest()
    return int.from_bytes(digest, "little")


def _shared_memory(store: dist.Store, rank: int, size: int,
                   gather_words: Callable[[Sequence[int], str], torch.Tensor]) -> Any:
    """The shared-memory transport of a group whose ranks all share this
    machine, else None (EMUGPU_EXCHANGE=shm: else an error). Rank 0 creates
    the segment; each rank says whether it could open it, and in which pid
    namespace it runs (a rank that exits is noticed by its pid), over TCP;
    then the segment's name is removed, so no crash leaves it behind."""
    from .. import _C as ext

    wanted = ext._config()["exchange"]
    if size == 1 or wanted == "tcp":
        return None
    shm, name, token = None, "", 0
    if rank == 0:
        name, token = f"/emugpu-{uuid.uuid4().hex}", secrets.randbits(63)
        try:
            shm = ext._ShmExchange.create(name, size, token)
        except RuntimeError:
            name = ""
        store.set("segment", f"{name} {token}")
    else:
        name, _, token_text = store.get("segment").decode().partition(" ")
        token = int(token_text)
        if name:
            try:
                shm = ext._ShmExchange.open(name, rank, size, token)
            except RuntimeError:
                shm = None
    words = gather_words([int(shm is not None), _namespace_id("pid")], "process group set-up (shared memory)")
    if rank == 0 and name:
        ext._ShmExchange.unlink(name)
    if bool(words[:, 0].all()) and len(set(words[:, 1].tolist())) == 1:
        return shm
    if wanted == "shm":
        missing = [r for r in range(size) if not int(words[r, 0])]
        why = (f"rank(s) {missing} could not open rank 0's segment (another machine, or another /dev/shm)"
               if missing else "the ranks run in different pid namespaces")
        raise ValueError(f"emu backend: EMUGPU_EXCHANGE=shm expected every rank of the group on this machine, "
                         f"but {why}; unset EMUGPU_EXCHANGE (auto) or set it to tcp")
    return None


def _fresh_namespace(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> str:
    """A key prefix that no earlier instance of this process group used, the
    same on every rank.

    torchrun's agent keeps one TCPStore for all its restarts, so the keys of
    the failed attempt's group are still there: without a new prefix, gloo
    reads the dead ranks' addresses and the restarted job hangs (torch's own
    gloo groups fail the same way; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 avoids
    it for them). TORCHELASTIC_RESTART_COUNT cannot name the attempt: each
    agent counts its own restarts, and they differ across nodes. So rank 0
    draws a random id, and gives it to each rank that asks with a nonce of its
    own (a key only this attempt can have written); a stale request is
    answered too, to no one. Rank 0 goes on once every rank has acknowledged
    under the new id."""
    if size == 1:
        return uuid.uuid4().hex
    deadline = time.monotonic() + timeout.total_seconds()

    def too_late(waiting_for: str) -> ExchangeError:
        return ExchangeError(
            f"emu backend: rank {rank} of {size}: process group set-up failed: {waiting_for} did not arrive within "
            f"the process group's timeout ({timeout.total_seconds():g} s). Check the other ranks' output for their "
            f"error.")

    if rank != 0:
        nonce = uuid.uuid4().hex
        store.set(f"hello/{rank}", nonce)
        try:
            store.wait([f"welcome/{rank}/{nonce}"], timeout)
        except RuntimeError as e:
            raise too_late("rank 0") from e
        namespace = store.get(f"welcome/{rank}/{nonce}").decode()
        store.set(f"{namespace}/joined/{rank}", "1")
        return namespace
    namespace = uuid.uuid4().hex
    answered: dict[int, bytes] = {}
    waiting = set(range(1, size))
    while waiting:
        for r in sorted(waiting):
            if store.check([f"{namespace}/joined/{r}"]):
                waiting.discard(r)
            elif store.check([f"hello/{r}"]):
                nonce = store.get(f"hello/{r}")
                if answered.get(r) != nonce:
                    store.set(f"welcome/{r}/{nonce.decode()}", namespace)
                    answered[r] = nonce
        if waiting and time.monotonic() > deadline:
            raise too_late("rank " + ", ".join(map(str, sorted(waiting))))
        if waiting:
            time.sleep(0.002)
    return namespace


def _tcp_store_host(store: dist.Store) -> str | None:
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store.host if isinstance(store, dist.TCPStore) else None


def _address_towards_store(store: dist.Store) -> str | None:
    """The local address from which this host reaches the process group's
    TCPStore, for gloo to bind and advertise; None keeps gloo's own choice
    (GLOO_SOCKET_IFNAME, else the address the hostname resolves to).

    gloo's own choice fails across machines (or network namespaces) when the
    hostname resolves to a loopback address, as Debian's /etc/hosts makes it
    (127.0.1.1): every rank then advertises an address the others cannot
    reach. The address facing the store is one the other nodes reach, since
    they all reach the store."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return None
    host = _tcp_store_host(store)
    if not host:
        return None
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, 1, type=socket.SOCK_DGRAM)[0]
        if ipaddress.ip_address(sockaddr[0]).is_loopback:
            return None  # one machine: gloo's own choice works
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(sockaddr)  # UDP: picks the route, sends nothing
            return probe.getsockname()[0]
    except (OSError, ValueError):
        return None
