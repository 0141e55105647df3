"""The torch.distributed backend `emu` for emugpu tensors.

Every collective is a barrier plus a sleep on the emulated timeline: it is
launched on the backend's own stream of the device (which first waits for the
caller's current stream, as NCCL's does), starts on rank r when that stream
reaches it (t_r), and ends on every rank at max_r t_r plus its modelled
duration (core/collective_cost.h). The host does not wait for it (except
`barrier`, which blocks the host as ProcessGroupNCCL's does); `Work.wait()`
and the Work's future make the caller's current stream wait, so compute
launched in between overlaps it. Ranks exchange t_r through
`_exchange.Exchange`.

Data: tensors of at most DATA_THRESHOLD_BYTES bytes whose bytes are real on
every rank, and every tensor in compute mode, carry their real bytes (the
data rule of core/exchange/words.h): every rank all-gathers its payload
through the exchange (over CPU views of the device bytes, charging the
emulated GPU nothing) and computes its own result from every rank's
payload. Larger tensors in timing mode move no bytes: what a rank receives
is a placeholder (reads as zeros), as timing mode's computed values are.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import functools
import hashlib
import os
import socket
import weakref
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

from ._exchange import Exchange

# Per-tensor size up to which timing mode moves real bytes: covers DDP's
# parameter-shape check and buffers of small models, losses and metrics.
DATA_THRESHOLD_BYTES = 64 * 1024

_R = dist.ReduceOp.RedOpType
_BITWISE = (_R.BAND, _R.BOR, _R.BXOR)
# In-place combiners of the gathered payloads, by op (AVG: SUM, then divided).
_REDUCERS = {_R.SUM: torch.add, _R.AVG: torch.add, _R.PRODUCT: torch.mul, _R.MIN: torch.minimum,
             _R.MAX: torch.maximum, _R.BAND: torch.bitwise_and, _R.BOR: torch.bitwise_or,
             _R.BXOR: torch.bitwise_xor}
# Writes this rank's result of a collective from every rank's payload (rank order).
_Combine = Callable[[list[torch.Tensor]], None]
_OP_NAMES = {_R.SUM: "SUM", _R.AVG: "AVG", _R.PRODUCT: "PRODUCT", _R.MIN: "MIN", _R.MAX: "MAX",
             _R.BAND: "BAND", _R.BOR: "BOR", _R.BXOR: "BXOR", _R.PREMUL_SUM: "PREMUL_SUM"}


def _C():  # noqa: N802  (the extension, imported late: this module loads during torch_emugpu's import)
    from .. import _C as ext

    return ext


class EmuWork(dist._Work):
    """A barrier, send/recv or batch: done on the device at `end_ns`
    (emulated time). (Collectives get the C++ Work of group_collectives.h.)

    wait() makes the caller's current stream wait for it (as WorkNCCL's
    does); for a barrier it blocks the host until then. The future's value is
    the output tensors. A send/recv or batch placed by the group's ordered
    runner (`resolved`: its ticket and its end, which the runner learns when
    the peer's start arrives) does not block the host in wait(): the device
    holds the stream's later work until the end is known. A send whose post
    waits on the post lane has not copied its bytes yet: `pending` runs the
    lane through it (the host awaits that before it touches them). Its
    future completes on the runner."""

    def __init__(self, outputs: list[torch.Tensor], device: int, end_ns: int | None = None, blocks_host: bool = False,
                 pending: Callable[[], None] | None = None, resolved: object = None,
                 future: torch.futures.Future | None = None, group: object = None) -> None:
        super().__init__()
        self._group = group
        self._pending = pending  # a send whose bytes are not copied yet (waited for by wait())
        self._outputs = outputs
        self._device = device
        self._end_ns = end_ns
        self._resolved, self._end = resolved if resolved is not None else (None, None)
        self._blocks_host = blocks_host
        if future is None:
            # Made on the collective's stream: waiting on the future (DDP's
            # Reducer does) makes the waiter's current stream wait for the
            # collective, as a CUDA future's events do.
            future = torch.futures.Future(devices=[torch.device("emugpu", device)])
            future.set_result(outputs)
        self._future = future

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self._blocks_host:
            _C()._collective_wait_host(self._device, self.end_ns)
            return True
        if self._pending is not None:  # after the launches so far: a ring's recvs come first
            pending, self._pending = self._pending, None
            resolved, group = self._resolved, self._group

            def sent() -> int:
                pending()
                return group.run_through(resolved)  # its end (done: it ran before this call)

            self._resolved, self._end = group.submit_timed(sent, self._outputs)
        _C()._stream_wait_pending(self._device, self._end)
        return True

    def is_completed(self) -> bool:
        if self._resolved is not None and not self._resolved.done:
            return False
        return self._resolved is not None and self._resolved.failed or _C()._host_now_ns() >= self.end_ns

    def is_success(self) -> bool:
        return self._resolved is None or not self._resolved.failed

    def result(self) -> list[torch.Tensor]:
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        return self._future

    @property
    def end_ns(self) -> int:
        """When the collective ends on the emulated device (steady-clock ns);
        for a deferred one, waits until that is known."""
        if self._end_ns is None:
            assert self._resolved is not None and self._group is not None
            self._end_ns = self._group.run_through(self._resolved)
        return self._end_ns


def _node_key() -> int:
    """Which node this rank runs on: torchrun's node rank (GROUP_RANK), one
    per torchrun; -1 where no launcher says (then LOCAL_WORLD_SIZE, if set,
    else one node for all)."""
    try:
        return int(os.environ["GROUP_RANK"])
    except (KeyError, ValueError):
        return -1


def _topology(nodes_of_ranks: list[int], size: int) -> tuple[int, int]:
    """(ranks per node, nodes) for the cost model, from every rank's node
    key; by node rather than by LOCAL_WORLD_SIZE alone, so a subgroup that
    spans nodes pays the network and one within a node does not."""
    if -1 in nodes_of_ranks:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", size))
        per_node = local if 0 < local <= size and size % local == 0 else size
        return per_node, size // per_node
    counts = [nodes_of_ranks.count(n) for n in set(nodes_of_ranks)]
    # The cost model needs whole, equal nodes; for uneven ones, the largest
    # equal split no wider than the smallest node never hides a network hop.
    per_node = max(d for d in range(1, min(counts) + 1) if size % d == 0)
    return per_node, size // per_node


def _clock_key() -> int:
    """Equal for processes that read the same CLOCK_MONOTONIC: one boot of
    one kernel, and one time namespace's offset (containers may set one)."""
    parts = []
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/timens_offsets"):
        try:
            with open(path) as f:
                parts.append(f.read())
        except OSError:
            parts.append("")
    if not parts[0]:  # no boot id to compare: trust nothing, measure
        parts.append(str(os.getpid()) + socket.gethostname())
    return _signature(parts)


def _signature(parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _disagree(rank: int, mine: object, other: int, theirs: object) -> str:
    return (f"emu backend: ranks disagree on a collective: rank {rank} called {mine} but rank {other} called "
            f"{theirs}; every rank must call the same collective with the same shapes and dtypes")


def _describe(tensors: Sequence[torch.Tensor]) -> str:
    return ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in tensors) or "no tensors"


def _env_int(name: str, minimum: int) -> int | None:
    text = os.environ.get(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ValueError(f"emu backend: {name} (set by torchrun) expected an integer >= {minimum}, got {text!r}")
    return value


def _check_layout(size: int) -> None:
    """Checks that torchrun's layout fits the emulated devices for a group
    of `size` ranks: each of a node's LOCAL_WORLD_SIZE ranks drives its own
    GPU, emugpu:LOCAL_RANK (NCCL refuses two ranks on one GPU), and the world
    is whole nodes."""
    local = _env_int("LOCAL_WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    devices = int(_C()._device_count())
    fix = "set EMUGPU_DEVICE_COUNT to LOCAL_WORLD_SIZE or more (unset, it defaults to LOCAL_WORLD_SIZE)"
    if local is not None and local > devices:
        raise ValueError(f"emu backend: expected an emulated GPU per rank of the node (LOCAL_WORLD_SIZE={local}), "
                         f"got {devices} emulated device(s); {fix}")
    if local_rank is not None and local_rank >= devices:
        raise ValueError(f"emu backend: LOCAL_RANK={local_rank} expected an emulated device emugpu:{local_rank}, "
                         f"got {devices} emulated device(s); {fix}")
    world = _env_int("WORLD_SIZE", 1)
    if local is not None and size == world and size % local:  # the default group (a subgroup may span nodes partly)
        raise ValueError(f"emu backend: expected whole nodes of LOCAL_WORLD_SIZE={local} ranks (torchrun's "
                         f"--nproc-per-node), got a world of {size}; make WORLD_SIZE a multiple of LOCAL_WORLD_SIZE")


class EmuBackend(_C10dBackend):
    """Backend `emu`: see the module docstring."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self._timeout = timeout
        # Before the exchange's rendezvous, so every rank raises at once instead of waiting for the others.
        _check_layout(size)
        self._exchange = Exchange(store, rank, size, timeout)
        words = self._exchange.gather_words([_node_key(), _clock_key()], "process group set-up")
        self._ranks_per_node, self._nodes = _topology([int(k) for k in words[:, 0]], size)
        self._clock_offset_ns = self._align_clocks([int(k) for k in words[:, 1]])
        self._comm_streams: dict[int, torch.Stream] = {}
        # The C++ side: the hot path over shared memory, and the runner that
        # places deferred collectives (both paths') in launch order.
        self._group = _C()._GroupCollectives(
            rank, size, self._ranks_per_node, self._clock_offset_ns, self._exchange.words, self._exchange.tcp,
            timeout.total_seconds(), DATA_THRESHOLD_BYTES, functools.partial(_mismatch_message, self._exchange, rank))
        _backends.add(self)
        self._batch: _P2PBatch | None = None  # between start_coalescing and end_coalescing
        self._last_post: object = None  # the latest send/recv post deferred to the post lane (its ticket)

    def shutdown(self) -> None:
        """destroy_process_group's call: the deferred collectives finish
        first. The other ranks need this rank's part of each, and the runner
        must not be the one to drop the last reference to this backend (its
        gloo group's teardown would then run on the runner's thread, which
        the interpreter may end mid-teardown while it exits). Their errors
        reached the host at its waits, or are dropped, as NCCL's are when a
        group is destroyed."""
        with contextlib.suppress(Exception):
            self.drain()

    @property
    def payload_bytes_moved(self) -> int:
        """Bytes of this rank's tensors that collectives carried (the data rule's real bytes), for benchmarks."""
        return int(self._group.payload_bytes_moved)

    def _align_clocks(self, keys: list[int]) -> int:
        """This rank's steady clock minus rank 0's: 0 where both read one
        clock (one machine, one time namespace), else measured once by one
        rank per clock against rank 0, so that ranks sharing a clock share
        the same offset and keep exact times among themselves."""
        if len(set(keys)) == 1:
            return 0
        leaders: dict[int, int] = {}
        for r, key in enumerate(keys):
            leaders.setdefault(key, r)
        mine = 0
        if self._rank == 0:
            for key, leader in leaders.items():
                if key != keys[0]:
                    self._exchange.serve_clock(leader)
        elif leaders[keys[self._rank]] == self._rank and keys[self._rank] != keys[0]:
            mine = self._exchange.clock_offset(0)
        offsets = self._exchange.gather_words([mine], "process group set-up (clock offsets)")
        return int(offsets[leaders[keys[self._rank]], 0])

    # c10d splits groups through this (DeviceMesh with a bound device, split_group).
    supports_splitting = property(lambda self: True)

    @property
    def options(self) -> _C10dBackend.Options:
        """What a split copies (the base property would recurse through the trampoline)."""
        return _C10dBackend.Options("emu", self._timeout)

    def perform_nocolor_split(self, device: torch.device) -> None:
        """new_group's call on ranks outside the new group (NCCL's split needs
        every rank): each group's exchange is its own, so they take no part."""

    def split(self, store: dist.Store, ranks: list[int], opts: object = None) -> EmuBackend | None:
        """The backend of the sub-group `ranks` (ranks of this group), or
        None where this rank is not one of them."""
        if self._rank not in ranks:
            return None
        timeout = getattr(opts, "_timeout", None) or self._timeout
        return EmuBackend(store, list(ranks).index(self._rank), len(ranks), timeout)

    def _comm_stream(self, dev: int) -> torch.Stream:
        stream = self._comm_streams.get(dev)
        if stream is None:
            device_type = torch.emugpu.current_stream(dev).device_type
            stream = self._comm_streams[dev] = torch.Stream(stream_id=self._group.comm_stream(dev), device_index=dev,
                                                            device_type=device_type)
        return stream

    @contextlib.contextmanager
    def _on_comm_stream(self, dev: int) -> Iterator[None]:
        """Collectives run on the backend's own stream of each device, as
        NCCL's do: it first waits for the caller's current stream, so compute
        launched after a collective overlaps it (DDP's buckets overlap the
        backward pass); Work.wait() and the Work's future order the caller's
        stream after it."""
        comm = self._comm_stream(dev)
        comm.wait_stream(torch.emugpu.current_stream(dev))
        with torch.emugpu.stream(comm):
            yield

    def getBackendName(self) -> str:  # noqa: N802  (c10d's name)
        return "emu"

    # c10d's capability flags. A Python subclass must define them as
    # properties: the trampoline reads them by attribute, and the base
    # class's property would call back into the trampoline forever.
    supports_coalescing = property(lambda self: True)  # see start_coalescing
    supports_time_estimate = property(lambda self: False)
    supports_shrinking = property(lambda self: False)
    supports_reconfigure = property(lambda self: False)
    supports_window = property(lambda self: False)

    # -- the one path every collective takes ---------------------------------

    def _check(self, name: str, tensors: Sequence[torch.Tensor]) -> int:
        device: int | None = None
        for t in tensors:
            if t.device.type != "emugpu":
                raise ValueError(f"emu backend: {name} expected emugpu tensors, got one on {t.device}; move it with "
                                 f".to('emugpu') or use a 'cpu:gloo,emugpu:emu' process group for CPU tensors")
            if t.layout != torch.strided or not t.is_contiguous():
                raise ValueError(f"emu backend: {name} expected dense contiguous tensors (as NCCL does), got "
                                 f"shape {tuple(t.shape)} strides {t.stride()}; call .contiguous() first")
            if device is not None and t.device.index != device:
                raise ValueError(f"emu backend: {name} expected every tensor on one device, got emugpu:{device} "
                                 f"and {t.device}")
            device = t.device.index
        return _C()._current_device() if device is None else device

    def _run(self, name: str, model_kind: str, model_bytes: float, inputs: Sequence[torch.Tensor],
             received: Sequence[torch.Tensor], outputs: list[torch.Tensor], combine: _Combine,
             extra: object = None, blocks_host: bool = False, device: int | None = None,
             signed: Sequence[torch.Tensor] | None = None, pack: Callable[[], torch.Tensor] | None = None,
             payload: int | None = None) -> dist._Work:
        """Exchanges start times (and checks the ranks agree), moves bytes
        where the data rule says so, and launches the modelled duration:
        deferred to the group's runner (the host goes on) unless it blocks
        the host (barrier).
        `inputs` are the tensors whose bytes this rank contributes, `received`
        those it writes; `signed` (default: both) and `extra` (root, op) must
        match across ranks. Sizes that may differ across ranks (all_to_all's
        splits) are exchanged: every rank decides and times from the same
        maxima. Where bytes move, every rank gathers every rank's payload
        (`pack()`, `payload` bytes long; default: the inputs' bytes one after
        the other) and `combine(rows)` writes this rank's result from them."""
        tensors = list(inputs) + list(received)
        dev = self._check(name, tensors) if device is None else device
        ext = _C()
        compute = ext._mode() == "compute"
        largest = max((t.numel() * t.element_size() for t in tensors), default=0)
        if signed is None:
            signed = tensors
        extra = "" if extra is None else str(extra)  # the signature's and the error report's form
        signature = ext._collective_signature(name, extra, list(signed))
        if payload is None:
            payload = sum(t.numel() * t.element_size() for t in inputs)
        if pack is None:
            def pack() -> torch.Tensor:
                return self._payload(inputs)
        if blocks_host:  # barrier: the host waits for it, as ProcessGroupNCCL's does
            with self._on_comm_stream(dev):
                self.drain()  # the deferred collectives before it gather their words on the runner first
                start = ext._collective_begin(dev) - self._clock_offset_ns  # rank 0's clock (_align_clocks)
                end = self._exchange_and_place(name, model_kind, model_bytes, inputs, received, combine, pack, dev,
                                               compute, largest, payload, signature, signed, extra, start)
            return EmuWork(outputs, dev, end, blocks_host)
        if not compute and largest > DATA_THRESHOLD_BYTES:
            # No rank can move these bytes: the runner only places it.
            real = all(ext._is_materialized(t) for t in inputs)
            return self._group.defer(name, model_kind, float(model_bytes), largest, payload, real,
                                     list(received), outputs, list(signed), extra, dev)
        comm = self._comm_stream(dev)

        def place(start: int) -> int:
            with torch.emugpu.stream(comm):
                return self._exchange_and_place(name, model_kind, model_bytes, inputs, received, combine, pack, dev,
                                                compute, largest, payload, signature, signed, extra, start)

        # Deferred too (the host goes on, as NCCL's does): the runner moves the bytes, and the host
        # waits for it where it touches these tensors (await_collective_writes).
        return self._group.defer_call(dev, outputs, place, tensors)

    def _exchange_and_place(self, name: str, model_kind: str, model_bytes: float, inputs: Sequence[torch.Tensor],
                            received: Sequence[torch.Tensor], combine: _Combine,
                            pack: Callable[[], torch.Tensor], dev: int, compute: bool, largest: int, payload: int,
                            signature: int, signed: Sequence[torch.Tensor], extra: str, start: int) -> int:
        """Exchanges the ranks' words from this rank's `start` (rank 0's
        clock), checks they agree, moves the bytes where the data rule says
        so, and places the collective on the current stream; returns its end.
        Whether the bytes are real is read here: on the runner, after the
        collectives launched before it."""
        ext = _C()
        real = compute or all(ext._is_materialized(t) for t in inputs)
        mine = ext._collective_words(start, real, compute, signature, int(model_bytes), largest, payload)
        gathered, key = self._exchange.start_gather_words(mine, name)
        begins, model_bytes, moves, other, longest = ext._collective_outcome(gathered(), signature,
                                                                             DATA_THRESHOLD_BYTES)
        if other >= 0:
            raise ValueError(_mismatch_message(self._exchange, self._rank, f"mismatch/{key}", name, extra, signed,
                                               other))
        if moves:
            combine(self._exchange.gather_bytes(pack(), longest, name))
            self._group.add_payload_bytes_moved(payload)
        if not compute:
            for t in received:
                ext._set_materialized(t, moves)
        duration = ext._collective_duration(dev, model_kind, float(model_bytes), self._size,
                                            self._ranks_per_node) if self._size > 1 else 0
        return ext._collective_end(dev, begins + self._clock_offset_ns, duration)

    def drain(self) -> None:
        """Waits until every deferred collective launched so far is placed
        on the timeline (raising the last one's error)."""
        self._group.drain()

    def _host(self, t: torch.Tensor) -> torch.Tensor:
        return _C()._host_view(t)

    def _bytes(self, t: torch.Tensor) -> torch.Tensor:
        """The host view as raw bytes: what collectives that only copy need,
        whatever the dtype (int16, uint16, float8, ...)."""
        return self._host(t).reshape(-1).view(torch.uint8)

    def _payload(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """The inputs' bytes, one after the other, as a CPU uint8 tensor."""
        if not inputs:
            return torch.empty(0, dtype=torch.uint8)
        return torch.cat([self._bytes(t) for t in inputs])

    @staticmethod
    def _unpack(row: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """A rank's payload cut back into tensors shaped and typed as `like`."""
        out, offset = [], 0
        for t in like:
            n = t.numel() * t.element_size()
            chunk = row[offset:offset + n]
            if offset % t.element_size():  # a wider dtype after a narrower one: view() needs alignment
                chunk = chunk.clone()
            out.append(chunk.view(t.dtype).view(t.shape))
            offset += n
        return out

    @staticmethod
    def _combine(parts: Sequence[torch.Tensor], op: dist.ReduceOp, average: bool, size: int) -> torch.Tensor:
        """Reduces the ranks' tensors in rank order: every rank computes the
        same sums in the same order, so all hold identical results."""
        fn = _REDUCERS[getattr(op, "op", op)]  # a ReduceOp or its RedOpType
        acc = parts[0].clone()
        for p in parts[1:]:
            fn(acc, p, out=acc)
        if average:
            acc.div_(size)
        return acc

    def _reduce_op(self, name: str, op: dist.ReduceOp, dtypes: Sequence[torch.dtype]) -> tuple[dist.ReduceOp, bool]:
        """The combining op for `op`, and whether to divide by the world size (AVG)."""
        kind = op.op
        if kind == _R.PREMUL_SUM:
            raise NotImplementedError(f"emu backend: {name} with ReduceOp.PREMUL_SUM is not supported yet; "
                                      f"scale the tensor and use ReduceOp.SUM")
        for dtype in dtypes:
            if kind in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
                raise ValueError(f"emu backend: {name} with ReduceOp.{_OP_NAMES[kind]} expected an integer or "
                                 f"bool dtype, got {dtype}")
            if kind == _R.AVG and not (dtype.is_floating_point or dtype.is_complex):
                raise ValueError(f"emu backend: {name} with ReduceOp.AVG expected a floating dtype (as NCCL), got "
                                 f"{dtype}")
        if kind == _R.AVG:
            return dist.ReduceOp.SUM, True
        return dist.ReduceOp(kind), False

    @staticmethod
    def _framed(chunks: Sequence[torch.Tensor]) -> torch.Tensor:
        """Byte chunks of different lengths as one payload: their count and
        lengths (int64) first, so that any rank can cut another's apart."""
        header = torch.tensor([len(chunks)] + [c.numel() for c in chunks], dtype=torch.int64).view(torch.uint8)
        return torch.cat([header, *chunks])

    @staticmethod
    def _framed_bytes(lengths: Sequence[int]) -> int:
        return 8 * (1 + len(lengths)) + sum(lengths)

    @staticmethod
    def _unframe(row: torch.Tensor) -> list[torch.Tensor]:
        count = int(row[:8].view(torch.int64)[0])
        lengths = row[8:8 * (1 + count)].view(torch.int64).tolist()
        out, offset = [], 8 * (1 + count)
        for n in lengths:
            out.append(row[offset:offset + n])
            offset += n
        return out

    # -- collectives -----------------------------------------------------------

    # all_reduce goes to C++ (GroupCollectives::all_reduce); None: the Python
    # path takes it, to report its arguments.
    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions) -> dist.Work:
        return (self._group.all_reduce("all_reduce", tensors, opts.reduceOp.op)
                or self._allreduce("all_reduce", tensors, opts.reduceOp))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: dist.AllreduceCoalescedOptions) -> dist.Work:
        return (self._group.all_reduce("all_reduce_coalesced", tensors, opts.reduceOp.op)
                or self._allreduce("all_reduce_coalesced", tensors, opts.reduceOp))

    def _allreduce(self, name: str, tensors: list[torch.Tensor], reduce_op: dist.ReduceOp) -> EmuWork:
        op, average = self._reduce_op(name, reduce_op, [t.dtype for t in tensors])

        def combine(rows: list[torch.Tensor]) -> None:
            parts = [self._unpack(row, tensors) for row in rows]
            for i, t in enumerate(tensors):
                self._host(t).copy_(self._combine([p[i] for p in parts], op, average, self._size))

        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        return self._run(name, "all_reduce", nbytes, tensors, tensors, tensors, combine, extra=_OP_NAMES[reduce_op.op])

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> EmuWork:
        root = opts.rootRank

        def combine(rows: list[torch.Tensor]) -> None:
            if self._rank != root:
                for t, part in zip(tensors, self._unpack(rows[root], tensors), strict=True):
                    self._host(t).copy_(part)

        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        received = [] if self._rank == root else tensors
        return self._run("broadcast", "broadcast", nbytes, tensors if self._rank == root else [], received, tensors,
                         combine, extra=f"root {root}", device=self._check("broadcast", tensors), signed=tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: dist.ReduceOptions) -> EmuWork:
        root = opts.rootRank
        op, average = self._reduce_op("reduce", opts.reduceOp, [t.dtype for t in tensors])

        def combine(rows: list[torch.Tensor]) -> None:
            if self._rank == root:
                parts = [self._unpack(row, tensors) for row in rows]
                for i, t in enumerate(tensors):
                    self._host(t).copy_(self._combine([p[i] for p in parts], op, average, self._size))

        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        received = tensors if self._rank == root else []
        return self._run("reduce", "reduce", nbytes, tensors, received, tensors, combine,
                         extra=f"root {root} {_OP_NAMES[opts.reduceOp.op]}", signed=tensors)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: object = None) -> EmuWork:
        flat = [t for group in output_tensors for t in group]

        def combine(rows: list[torch.Tensor]) -> None:
            for r, row in enumerate(rows):
                for group, part in zip(output_tensors, self._unpack(row, input_tensors), strict=True):
                    self._host(group[r]).copy_(part)

        nbytes = sum(t.numel() * t.element_size() for t in input_tensors) * self._size
        return self._run("all_gather", "all_gather", nbytes, input_tensors, flat, flat, combine)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: object = None) -> EmuWork:
        def combine(rows: list[torch.Tensor]) -> None:
            self._bytes(output).copy_(torch.cat(rows))

        return self._run("all_gather_into_tensor", "all_gather", input.numel() * input.element_size() * self._size,
                         [input], [output], [output], combine)

    _allgather_base = all_gather_single

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: dist.ReduceScatterOptions) -> EmuWork:
        flat = [t for group in input_tensors for t in group]
        op, average = self._reduce_op("reduce_scatter", opts.reduceOp, [t.dtype for t in output_tensors])

        def combine(rows: list[torch.Tensor]) -> None:
            parts = [self._unpack(row, flat) for row in rows]
            for i, t in enumerate(output_tensors):
                mine = i * self._size + self._rank
                self._host(t).copy_(self._combine([p[mine] for p in parts], op, average, self._size))

        nbytes = sum(t.numel() * t.element_size() for t in output_tensors) * self._size
        return self._run("reduce_scatter", "reduce_scatter", nbytes, flat, output_tensors, output_tensors, combine,
                         extra=_OP_NAMES[opts.reduceOp.op])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: dist.ReduceScatterOptions) -> EmuWork:
        op, average = self._reduce_op("reduce_scatter_tensor", opts.reduceOp, [output.dtype])

        def combine(rows: list[torch.Tensor]) -> None:
            chunks = [self._unpack(row, [input])[0].reshape(self._size, -1)[self._rank] for row in rows]
            self._host(output).copy_(self._combine(chunks, op, average, self._size).view(output.shape))

        return self._run("reduce_scatter_tensor", "reduce_scatter", input.numel() * input.element_size(), [input],
                         [output], [output], combine, extra=_OP_NAMES[opts.reduceOp.op])

    _reduce_scatter_base = reduce_scatter_single

    def barrier(self, opts: dist.BarrierOptions) -> EmuWork:
        ids = list(getattr(opts, "device_ids", []) or [])
        device = ids[0] if ids else _C()._current_device()
        return self._run("barrier", "barrier", 4, [], [], [], lambda rows: None, device=device, blocks_host=True)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: object = None) -> EmuWork:
        flat = [t for group in output_lists for t in group]

        def combine(rows: list[torch.Tensor]) -> None:
            for r, row in enumerate(rows):
                for group, part in zip(output_lists, self._unpack(row, inputs), strict=True):
                    self._host(group[r]).copy_(part)

        nbytes = sum(t.numel() * t.element_size() for t in inputs) * self._size
        return self._run("all_gather_coalesced", "all_gather", nbytes, inputs, flat, flat, combine)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: object = None) -> EmuWork:
        def combine(rows: list[torch.Tensor]) -> None:
            for r, row in enumerate(rows):
                for out, part in zip(outputs, self._unpack(row, inputs), strict=True):
                    self._bytes(out).view(self._size, -1)[r].copy_(part.reshape(-1).view(torch.uint8))

        nbytes = sum(t.numel() * t.element_size() for t in inputs) * self._size
        return self._run("all_gather_into_tensor_coalesced", "all_gather", nbytes, inputs, outputs, outputs, combine)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: dist.ReduceScatterOptions) -> EmuWork:
        name = "reduce_scatter_tensor_coalesced"
        op, average = self._reduce_op(name, opts.reduceOp, [t.dtype for t in outputs])

        def combine(rows: list[torch.Tensor]) -> None:
            parts = [self._unpack(row, inputs) for row in rows]
            for i, out in enumerate(outputs):
                chunks = [p[i].reshape(self._size, -1)[self._rank] for p in parts]
                self._host(out).copy_(self._combine(chunks, op, average, self._size).view(out.shape))

        nbytes = sum(t.numel() * t.element_size() for t in inputs)
        return self._run(name, "reduce_scatter", nbytes, inputs, outputs, outputs, combine,
                         extra=_OP_NAMES[opts.reduceOp.op])

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: dist.GatherOptions) -> EmuWork:
        root = opts.rootRank
        flat = [t for group in output_tensors for t in group]

        def combine(rows: list[torch.Tensor]) -> None:
            if self._rank == root:
                for r, row in enumerate(rows):
                    for group, part in zip(output_tensors, self._unpack(row, input_tensors), strict=True):
                        self._host(group[r]).copy_(part)

        nbytes = sum(t.numel() * t.element_size() for t in input_tensors) * self._size
        return self._run("gather", "gather", nbytes, input_tensors, flat, flat, combine, extra=f"root {root}",
                         signed=input_tensors)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: dist.ScatterOptions) -> EmuWork:
        root = opts.rootRank
        flat = [t for group in input_tensors for t in group]  # on the root: per output, one chunk per rank

        def combine(rows: list[torch.Tensor]) -> None:
            offset = 0
            for out in output_tensors:  # every rank's outputs have the root's chunk shapes
                n = out.numel() * out.element_size()
                self._bytes(out).copy_(rows[root][offset + self._rank * n:offset + (self._rank + 1) * n])
                offset += n * self._size

        nbytes = sum(t.numel() * t.element_size() for t in output_tensors) * self._size
        return self._run("scatter", "scatter", nbytes, flat, output_tensors, output_tensors, combine,
                         extra=f"root {root}", signed=output_tensors)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: object = None) -> EmuWork:
        def cuts(t: torch.Tensor, splits: list[int]) -> list[int]:
            """Byte lengths of the rank-by-rank chunks of `t` along dim 0."""
            rows = list(splits) or [t.shape[0] // self._size if t.dim() else 0] * self._size
            per_row = t.numel() // t.shape[0] * t.element_size() if t.dim() and t.shape[0] else 0
            return [n * per_row for n in rows]

        sent, got = cuts(input, input_split_sizes), cuts(output, output_split_sizes)

        def pack() -> torch.Tensor:
            return self._framed(list(self._bytes(input).split(sent)))

        def combine(rows: list[torch.Tensor]) -> None:
            out = self._bytes(output).split(got)
            for r, row in enumerate(rows):
                out[r].copy_(self._unframe(row)[self._rank])

        return self._run("all_to_all_single", "all_to_all", input.numel() * input.element_size(), [input],
                         [output], [output], combine, extra=str(input.dtype), signed=[], pack=pack,
                         payload=self._framed_bytes(sent))

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: object = None) -> EmuWork:
        sent = [t.numel() * t.element_size() for t in input_tensors]

        def pack() -> torch.Tensor:
            return self._framed([self._bytes(t) for t in input_tensors])

        def combine(rows: list[torch.Tensor]) -> None:
            for out, row in zip(output_tensors, rows, strict=True):
                self._bytes(out).copy_(self._unframe(row)[self._rank])

        nbytes = sum(sent)
        return self._run("all_to_all", "all_to_all", nbytes, input_tensors, output_tensors, output_tensors, combine,
                         extra=str(input_tensors[0].dtype if input_tensors else None), signed=[], pack=pack,
                         payload=self._framed_bytes(sent))

    # -- not supported yet -----------------------------------------------------

    def _unsupported(self, name: str) -> None:
        raise NotImplementedError(f"emu backend: {name} is not supported yet (implemented: every collective, "
                                  f"send and recv but recv from any source and sparse all_reduce)")

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> EmuWork:
        return self._p2p("send", tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> EmuWork:
        return self._p2p("recv", tensors, src, tag)

    def _p2p(self, kind: str, tensors: list[torch.Tensor], peer: int, tag: int) -> EmuWork:
        """send or recv, deferred like a collective that moves no bytes: the
        host goes on at once (so batch_isend_irecv's rings cannot deadlock),
        and the message ends on both ranks at the later of their starts plus
        its modelled time. A send pairs with the peer's recv in order per peer
        and tag, as NCCL's do. The bytes travel when the sender's rule says
        so (compute mode, or small real tensors); the receiver takes what
        the sender's words announce."""
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"emu backend: {kind} expected a peer rank in [0, {self._size}) other than "
                             f"{self._rank}, got {peer}")
        if not 0 <= tag < Exchange.P2P_TAGS:
            raise ValueError(f"emu backend: {kind} expected a tag in [0, {Exchange.P2P_TAGS}), got {tag}")
        dev = self._check(kind, tensors)
        ext = _C()
        compute = ext._mode() == "compute"
        sends = kind == "send"
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        shape = _signature([(tuple(t.shape), t.dtype) for t in tensors])
        carries = sends and (compute or (nbytes <= DATA_THRESHOLD_BYTES
                                         and all(ext._is_materialized(t) for t in tensors)))
        what = f"{kind} {'to' if sends else 'from'} rank {peer}"
        with self._on_comm_stream(dev):
            return self._point_to_point(kind, peer, tag, tensors, dev, compute, carries, nbytes, shape, what)

    def _point_to_point(self, kind: str, peer: int, tag: int, tensors: Sequence[torch.Tensor], dev: int,
                        compute: bool, carries: bool, nbytes: int, shape: int, what: str) -> EmuWork:
        ext = _C()
        exchange = self._exchange
        sends = kind == "send"
        mine, back = ("to_receiver", "to_sender") if sends else ("to_sender", "to_receiver")
        bytes_tag = exchange.p2p_tag(tag, "bytes")
        future = torch.futures.Future(devices=[torch.device("emugpu", dev)])
        comm = self._comm_stream(dev)
        batch = self._batch
        if batch is not None:
            batch.add(dev, list(tensors), carries)
        posted = _P2PPost()

        def post(start: int) -> None:
            """Tells the peer this rank's start (rank 0's clock, as in _launch) and starts moving the bytes."""
            posted.start = start
            exchange.post_words([start, int(carries), shape, nbytes], peer, exchange.p2p_tag(tag, mine))
            posted.theirs = exchange.expect_words(4, peer, exchange.p2p_tag(tag, back), what)
            if carries:  # copied now: the host may change the tensors once the post ran
                for t in tensors:
                    exchange.send_bytes(self._host(t), peer, bytes_tag)
                self._group.add_payload_bytes_moved(nbytes)
            if batch is not None:
                batch.started(start + self._clock_offset_ns)

        # Behind held work (an earlier collective's end not known yet) the start is not known either: the
        # post waits for it on a lane of its own and the host goes on. Posts keep their launch order (the
        # peer pairs them in order).
        last = self._last_post
        if ext._device_held(dev) or (last is not None and not last.done):
            ticket = self._last_post = self._group.defer_post(dev, post)
            if batch is not None:
                batch.posts = ticket
        else:
            ticket = None
            post(ext._collective_begin(dev) - self._clock_offset_ns)

        def resolve() -> int:
            try:
                if ticket is not None:
                    self._group.run_through_post(ticket)
                theirs = posted.theirs().tolist()
                if theirs[2] != shape:
                    other = "receives" if sends else "sends"
                    raise ValueError(f"emu backend: rank {self._rank} {kind}s [{_describe(tensors)}] but rank "
                                     f"{peer} {other} {theirs[3]} bytes of another shape or dtype; the two must "
                                     f"match")
                if not sends:
                    arrived = bool(theirs[1])
                    if arrived:
                        for t in tensors:
                            exchange.recv_bytes(self._host(t), peer, bytes_tag, what)
                    if not compute:
                        for t in tensors:
                            ext._set_materialized(t, arrived)
                duration = ext._collective_duration(dev, "send_recv", float(max(nbytes, theirs[3])), self._size,
                                                    self._ranks_per_node)
                begins = max(posted.start, theirs[0]) + self._clock_offset_ns
                if batch is not None:  # placed with its batch (end_coalescing)
                    batch.ends.append(begins + duration)
                    future.set_result(list(tensors))
                    return begins + duration
                with torch.emugpu.stream(comm):
                    end = ext._collective_end(dev, begins, duration)
                    future.set_result(list(tensors))
                return end
            except BaseException as e:
                future.set_exception(e)
                raise

        def pending() -> None:
            self._group.run_through_post(ticket)

        # A recv's bytes arrive on the runner: the host awaits them before it touches the tensors.
        resolved = self._group.submit_timed(resolve, [] if sends else list(tensors))
        return EmuWork(list(tensors), dev, pending=pending if carries and ticket is not None else None,
                       resolved=resolved, future=future, group=self._group)

    # c10d's NCCL-style coalescing: batch_isend_irecv (and _coalescing_manager
    # with a device) brackets its ops with these. NCCL runs a batch's sends
    # and recvs as one fused kernel, so here they overlap: the batch starts
    # where the stream was and ends at its latest message's end. Coalesced
    # collectives run as they come; the batch's Work also waits for them.
    def start_coalescing(self) -> None:
        # A batch still open was abandoned by an error inside c10d's coalescing manager: its ops stand alone.
        self._batch = _P2PBatch()

    def end_coalescing(self) -> EmuWork:
        batch, self._batch = self._batch, None
        if batch is None:
            raise ValueError("emu backend: end_coalescing expected a batch started by start_coalescing, got none")
        ext = _C()
        dev = batch.device if batch.device is not None else ext._current_device()
        comm = self._comm_stream(dev)
        future = torch.futures.Future(devices=[torch.device("emugpu", dev)])
        if batch.device is None:  # collectives only: placed already, or earlier in the runner's order
            comm.wait_stream(torch.emugpu.current_stream(dev))

        def resolve() -> int:
            try:
                with torch.emugpu.stream(comm):
                    if batch.ends:
                        if batch.start is None:  # every op's post runs before its resolve
                            raise RuntimeError("emu backend: a batch of sends and recvs ended before any of them "
                                               "was posted; please report this")
                        end = ext._collective_end(dev, batch.start, max(batch.ends) - batch.start)
                    else:
                        end = ext._collective_ready(dev)  # where the stream is, past what it holds
                    future.set_result(batch.tensors)
                return end
            except BaseException as e:
                future.set_exception(e)
                raise

        def pending() -> None:
            self._group.run_through_post(batch.posts)

        return EmuWork(batch.tensors, dev, pending=pending if batch.carries and batch.posts is not None else None,
                       resolved=self._group.submit_timed(resolve, []), future=future, group=self._group)

    def recv_anysource(self, *args: object) -> EmuWork:
        self._unsupported("recv from any source")

    def allreduce_sparse(self, *args: object) -> EmuWork:
        self._unsupported("all_reduce of sparse tensors")


class _P2PPost:
    """What a send's or recv's post did, read by its resolve on the runner."""

    def __init__(self) -> None:
        self.start = 0  # rank 0's clock
        self.theirs: Callable[[], torch.Tensor] = lambda: torch.empty(0)


class _P2PBatch:
    """The sends and recvs between start_coalescing and end_coalescing."""

    def __init__(self) -> None:
        self.device: int | None = None
        self.start: int | None = None  # the earliest op's start on this rank's clock, once posted
        self.tensors: list[torch.Tensor] = []
        self.carries = False  # whether some send moves bytes
        self.posts: object = None  # the ticket of its last post deferred to the post lane
        self.ends: list[int] = []  # each message's end, as the runner learns it

    def add(self, device: int, tensors: list[torch.Tensor], carries: bool) -> None:
        """At launch."""
        if self.device is not None and device != self.device:
            raise ValueError(f"emu backend: a batch of sends and recvs expected one device, got emugpu:{self.device} "
                             f"and emugpu:{device}")
        self.device = device
        self.tensors += tensors
        self.carries = self.carries or carries

    def started(self, start: int) -> None:
        """When an op's post learnt its start (at launch, or later on the post lane)."""
        self.start = start if self.start is None else min(self.start, start)


# torch.emugpu.synchronize() drains every backend's deferred collectives, as
# cudaDeviceSynchronize waits for NCCL's streams too.
_backends: weakref.WeakSet[EmuBackend] = weakref.WeakSet()


def drain_all() -> None:
    """Places every deferred collective of this process on the timeline."""
    for backend in list(_backends):
        backend.drain()


@atexit.register
def _drain_at_exit() -> None:
    """Lets each group's runner finish before the interpreter does: a
    deferred collective's Python callbacks, run or dropped on the runner's
    thread during finalization, would end that thread inside a destructor
    (std::terminate). The other ranks reached those collectives too (or
    exited, which the exchange notices)."""
    for backend in list(_backends):
        backend.shutdown()


def _mismatch_message(exchange: Exchange, rank: int, key: str, name: str, extra: str,
                      signed: Sequence[torch.Tensor], other: int) -> str:
    """The error of a collective the ranks disagree on: this rank's call and
    `other`'s, exchanged through the store under `key` (also called from C++,
    GroupCollectives::check_signatures)."""
    described = f"{name} on [{_describe(signed)}]" + (f", {extra}" if extra else "")
    theirs = exchange.report(key, described, other, f"{name} (mismatch report)")
    return _disagree(rank, described, other, theirs)


def create_backend(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> EmuBackend:
    """The creator c10d calls for backend `emu` (Backend.register_backend)."""
    _C()._set_drain_hook(drain_all)  # torch.accelerator.synchronize() drains too
    return EmuBackend(store, rank, size, timeout)
