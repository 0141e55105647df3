"""The ranks' exchange for backend `emu`: one all-gather of a few int64 words
per rank per collective (emulated start times, flags, a signature of the
tensors), the real bytes of small (or compute-mode) tensors, point-to-point
messages and clock offsets.

The transports are the core's (csrc/core/exchange): a TCP transport on
Boost.Asio, bootstrapped from the process group's Store under its own prefix
(no port is fixed; the rendezvous is the one the user configured), is always
there: it carries send/recv, clock measurements, payloads too large for
shared memory, and everything where ranks span machines. Where every rank of
the group shares this machine (the usual emulated node), the word gathers and
payloads up to the segment's capacity go through one shared-memory segment
instead: a store and a futex wake rather than TCP round trips, which is most
of a collective's host cost when eight ranks share two cores.
EMUGPU_EXCHANGE=tcp keeps everything on TCP.
"""

from __future__ import annotations

import datetime
import hashlib
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
    """All-gathers words and bytes, and carries point-to-point messages,
    among the `size` ranks of one process group."""

    # Point-to-point channels per user tag: a sender's words to its receiver,
    # the receiver's words back, and the message's bytes. Messages on one
    # channel arrive in the order sent, so a rank's k-th send to a peer pairs
    # with that peer's k-th recv from it (NCCL's rule), whatever else is in flight.
    P2P_TAGS = 1 << 28
    CLOCK_ROUNDS = 16

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        from .. import _C as ext

        self.rank = rank
        self.size = size
        self.timeout = timeout
        self._seconds = timeout.total_seconds()
        # The prefix keeps the transport's keys apart from c10d's own, and
        # from those of this group's earlier instances (see _fresh_namespace).
        base = dist.PrefixStore("emu_exchange/", store)
        namespace = _fresh_namespace(base, rank, size, timeout)
        prefixed = dist.PrefixStore(namespace + "/", base)
        self._reports = dist.PrefixStore("reports/", prefixed)
        # The namespace is random hex: its first 64 bits tell this group instance's connections apart.
        token = int(namespace[:16], 16)
        self._tcp = self._guard("process group set-up", lambda: ext._TcpTransport(
            prefixed, rank, size, _listen_address(store), "tcp/", token, self._seconds))
        self._shm = None  # the set-up's own gathers go over TCP
        self._shm = _shared_memory(dist.PrefixStore("shm/", prefixed), rank, size, self.gather_words)
        # Bytes per rank the shared-memory transport carries (0: none, all goes over TCP).
        self.shm_capacity = int(self._shm.capacity) if self._shm is not None else 0

    @property
    def words(self) -> Any:
        """The transport of the word gathers: shared memory where there is one, else TCP."""
        return self._shm if self._shm is not None else self._tcp

    @property
    def tcp(self) -> Any:
        """The TCP transport (core TcpTransport), always there."""
        return self._tcp

    @property
    def transport(self) -> str:
        return "shm" if self._shm is not None else "tcp"

    def _guard(self, what: str, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except RuntimeError as e:
            raise ExchangeError(
                f"emu backend: rank {self.rank} of {self.size}: {what} failed: another rank exited or did not "
                f"arrive within the process group's timeout ({self._seconds:g} s). "
                f"Check the other ranks' output for their error. Transport said: {e}"
            ) from e

    def gather_words(self, words: Sequence[int], what: str) -> torch.Tensor:
        """Every rank's `words` (same count on every rank), as a [size, len(words)] int64 tensor."""
        return self.start_gather_words(words, what)[0]()

    def start_gather_words(self, words: Sequence[int], what: str) -> tuple[Callable[[], torch.Tensor], str]:
        """gather_words without waiting: returns the call that waits and
        gives the result (from any thread), and the gather's key (the same
        on every rank: error reports about it go under it). Gathers pair up
        across ranks in the order they are started, whoever starts them
        (the backend's C++ side starts its own on the same transport)."""
        transport, count, seconds = self.words, len(words), self._seconds
        ticket = self._guard(what, lambda: transport.start(list(words), seconds))
        return lambda: self._guard(what, lambda: transport.finish(ticket, count, seconds)), str(ticket)

    def gather_bytes(self, mine: torch.Tensor, largest: int, what: str) -> list[torch.Tensor]:
        """Every rank's bytes (a contiguous CPU uint8 tensor; lengths may
        differ). `largest` is the longest rank's length, the same on every
        rank: it picks the transport (shared memory where they fit)."""
        transport = self._shm if self._shm is not None and largest <= self.shm_capacity else self._tcp
        seconds = self._seconds
        return self._guard(what, lambda: transport.gather_bytes(mine, seconds))

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

    @staticmethod
    def p2p_tag(tag: int, channel: str) -> int:
        return 4 * tag + {"to_receiver": 0, "to_sender": 1, "bytes": 2}[channel]

    def post_words(self, words: Sequence[int], peer: int, tag: int) -> None:
        """Sends `words` to `peer` on channel `tag` (queued: returns at once)."""
        self._tcp.send(peer, tag, torch.tensor(list(words), dtype=torch.int64).view(torch.uint8))

    def expect_words(self, count: int, peer: int, tag: int, what: str) -> Callable[[], torch.Tensor]:
        """The call that waits for `count` words from `peer` on `tag` (from any thread)."""
        def finish() -> torch.Tensor:
            got = self._guard(what, lambda: self._tcp.recv(peer, tag, self._seconds))
            if got.numel() != 8 * count:
                raise ExchangeError(f"emu backend: rank {self.rank}: {what} expected {count} words from rank "
                                    f"{peer}, got {got.numel()} bytes; every rank must run the same torch-emugpu")
            return got.view(torch.int64)

        return finish

    def send_bytes(self, host: torch.Tensor, peer: int, tag: int) -> None:
        """Sends a contiguous CPU tensor's bytes on `tag` (copied: the tensor may change after)."""
        self._tcp.send(peer, tag, host.reshape(-1).view(torch.uint8))

    def recv_bytes(self, host: torch.Tensor, peer: int, tag: int, what: str) -> None:
        """Receives the next message from `peer` on `tag` into a contiguous CPU tensor of its size."""
        got = self._guard(what, lambda: self._tcp.recv(peer, tag, self._seconds))
        target = host.reshape(-1).view(torch.uint8)
        if got.numel() != target.numel():
            raise ValueError(f"emu backend: rank {self.rank}: {what} expected {target.numel()} bytes from rank "
                             f"{peer}, got {got.numel()}; the send and the recv must have the same size")
        target.copy_(got)

    def clock_offset(self, peer: int) -> int:
        """This rank's steady clock minus `peer`'s (nanoseconds) while `peer`
        runs serve_clock(self.rank): NTP's estimate from the shortest round trip."""
        return int(self._guard(f"clock offset to rank {peer}",
                               lambda: self._tcp.clock_offset(peer, self.CLOCK_ROUNDS, self._seconds)))

    def serve_clock(self, peer: int) -> None:
        """The other side of `peer`'s clock_offset()."""
        self._guard(f"clock offset for rank {peer}",
                    lambda: self._tcp.serve_clock(peer, self.CLOCK_ROUNDS, self._seconds))


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


def _listen_address(store: dist.Store) -> str:
    """The local address the TCP transport listens on and advertises: the
    one from which this host reaches the process group's TCPStore, which the
    other nodes reach too (they all reach the store); loopback when the store
    is on this machine. Without a TCPStore (a FileStore), the address this
    host's name resolves to."""
    from .. import _C as ext

    host = _tcp_store_host(store)
    if host:
        address = ext._TcpTransport.address_towards(host)
        if address:
            return address
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
