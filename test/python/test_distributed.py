"""The torch.distributed backend `emu`: values, time on the timeline, the
data rule and bad input, over real processes.

Ranks are spawned processes (distributed_ranks.run_ranks); DDP's own tests
are in test_ddp.py.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import distributed_ranks
import pytest
import torch
import torch.distributed as dist
from conftest import REPO
from distributed_ranks import PG_TIMEOUT

pytestmark = pytest.mark.slow  # multi-process runs: scripts/test.sh --fast leaves them out


def run_ranks(scenario: str, **kwargs: Any) -> dict[int, Any]:
    """distributed_ranks.run_ranks on one of this module's SCENARIOS, by name."""
    return distributed_ranks.run_ranks(SCENARIOS[scenario], **kwargs)


# --- scenarios (module level, so spawned children can import them) ----------


# Handshakes through the group's store put the ranks in an order that host
# load cannot change: a rank that arrives only after its peer signalled proves
# the peer went on without it (had the peer waited, both would hang until the
# store's timeout and the test fail), where wall-clock bounds would not.
def _signal(key: str) -> None:
    dist.distributed_c10d._get_default_store().set(key, "1")


def _await(key: str) -> None:
    dist.distributed_c10d._get_default_store().wait([key])


def _values(rank: int, world: int) -> None:
    """Every implemented collective's values (real bytes: compute mode, or
    small tensors copied in from the host in timing mode)."""
    dev = torch.device("emugpu", rank)
    base = torch.arange(1.0, 5.0)

    def t(x: torch.Tensor) -> torch.Tensor:
        return x.to(dev)  # an H2D copy: real bytes in either mode

    expected = {
        dist.ReduceOp.SUM: base * 1 + base * 2,
        dist.ReduceOp.AVG: (base * 1 + base * 2) / 2,
        dist.ReduceOp.PRODUCT: (base * 1) * (base * 2),
        dist.ReduceOp.MIN: base * 1,
        dist.ReduceOp.MAX: base * 2,
    }
    for op, want in expected.items():
        x = t(base * (rank + 1))
        dist.all_reduce(x, op=op)
        assert torch.equal(x.cpu(), want), (op, x.cpu(), want)
    bits = torch.tensor([0b1100, 0b1010], dtype=torch.int32)
    for op, want in (
        (dist.ReduceOp.BAND, bits & (bits + 1)),
        (dist.ReduceOp.BOR, bits | (bits + 1)),
        (dist.ReduceOp.BXOR, bits ^ (bits + 1)),
    ):
        x = t(bits + rank)
        dist.all_reduce(x, op=op)
        assert torch.equal(x.cpu(), want), (op, x.cpu(), want)

    x = t(base * (rank + 1))
    dist.broadcast(x, src=1)
    assert torch.equal(x.cpu(), base * 2)

    x = t(base * (rank + 1))
    dist.reduce(x, dst=0, op=dist.ReduceOp.SUM)
    if rank == 0:
        assert torch.equal(x.cpu(), base * 3)

    outs = [torch.zeros(4, device=dev) for _ in range(world)]
    dist.all_gather(outs, t(base * (rank + 1)))
    assert [o.cpu().tolist() for o in outs] == [(base * (r + 1)).tolist() for r in range(world)]

    out = torch.zeros(world * 4, device=dev)
    dist.all_gather_into_tensor(out, t(base * (rank + 1)))
    assert torch.equal(out.cpu(), torch.cat([base * (r + 1) for r in range(world)]))

    chunks = [t(base * (rank + 1) + 10 * i) for i in range(world)]
    got = torch.zeros(4, device=dev)
    dist.reduce_scatter(got, chunks)
    assert torch.equal(got.cpu(), sum(base * (r + 1) + 10 * rank for r in range(world)))

    got = torch.zeros(2, device=dev)
    dist.reduce_scatter_tensor(got, t(base * (rank + 1)), op=dist.ReduceOp.AVG)
    assert torch.equal(got.cpu(), (base[2 * rank : 2 * rank + 2] * 3) / 2)

    gathered = [torch.zeros(4, device=dev) for _ in range(world)] if rank == 0 else None
    dist.gather(t(base * (rank + 1)), gathered, dst=0)
    if rank == 0:
        assert [g.cpu().tolist() for g in gathered] == [(base * (r + 1)).tolist() for r in range(world)]

    got = torch.zeros(4, device=dev)
    dist.scatter(got, [t(base + 10 * r) for r in range(world)] if rank == 0 else None, src=0)
    assert torch.equal(got.cpu(), base + 10 * rank)

    # all_to_all_single with uneven splits: rank r sends r + j + 1 values 100 r + j to rank j
    send = torch.cat([torch.full((rank + j + 1,), 100.0 * rank + j) for j in range(world)])
    recv = torch.zeros(sum(s + rank + 1 for s in range(world)), device=dev)
    dist.all_to_all_single(
        recv,
        t(send),
        output_split_sizes=[s + rank + 1 for s in range(world)],
        input_split_sizes=[rank + j + 1 for j in range(world)],
    )
    assert torch.equal(recv.cpu(), torch.cat([torch.full((s + rank + 1,), 100.0 * s + rank) for s in range(world)]))

    outs = [torch.zeros(2, device=dev) for _ in range(world)]
    dist.all_to_all(outs, [t(torch.full((2,), 10.0 * rank + j)) for j in range(world)])
    assert [o.cpu().tolist() for o in outs] == [[10.0 * s + rank] * 2 for s in range(world)]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the coalesced forms are deprecated in torch
        pair = [t(base * (rank + 1)), t(torch.tensor([rank + 1.0]))]
        dist.all_reduce_coalesced(pair)
        assert pair[0].cpu().tolist() == (base * 3).tolist() and pair[1].cpu().tolist() == [3.0]
        lists = [[torch.zeros(4, device=dev) for _ in range(world)], [torch.zeros(1, device=dev) for _ in range(world)]]
        dist.all_gather_coalesced(lists, [t(base * (rank + 1)), t(torch.tensor([rank + 5.0]))])
        assert [o.cpu().tolist() for o in lists[0]] == [(base * (r + 1)).tolist() for r in range(world)]
        assert [o.cpu().tolist() for o in lists[1]] == [[r + 5.0] for r in range(world)]

    # the tensor-coalesced forms, as c10d's coalescing manager issues them
    from torch.distributed.distributed_c10d import _coalescing_manager

    outs = [torch.zeros(world * 4, device=dev), torch.zeros(world * 2, device=dev)]
    with _coalescing_manager():
        dist.all_gather_into_tensor(outs[0], t(base * (rank + 1)))
        dist.all_gather_into_tensor(outs[1], t(base[:2] + rank))
    assert torch.equal(outs[0].cpu(), torch.cat([base * (r + 1) for r in range(world)]))
    assert torch.equal(outs[1].cpu(), torch.cat([base[:2] + r for r in range(world)]))
    outs = [torch.zeros(2, device=dev), torch.zeros(1, device=dev)]
    with _coalescing_manager():
        dist.reduce_scatter_tensor(outs[0], t(base * (rank + 1)))
        dist.reduce_scatter_tensor(outs[1], t(base[:2] * (rank + 1)))
    assert torch.equal(outs[0].cpu(), base[2 * rank : 2 * rank + 2] * 3)
    assert torch.equal(outs[1].cpu(), base[rank : rank + 1] * 3)

    # send / recv, and batch_isend_irecv swapping tensors with the peer
    peer = 1 - rank
    if rank == 0:
        dist.send(t(base * 7), dst=1)
    else:
        got = torch.zeros(4, device=dev)
        dist.recv(got, src=0)
        assert torch.equal(got.cpu(), base * 7)
    got = torch.zeros(4, device=dev)
    ops = [dist.P2POp(dist.isend, t(base + 100 * rank), peer), dist.P2POp(dist.irecv, got, peer)]
    for work in dist.batch_isend_irecv(ops):  # both ranks send first: a send pairs with the peer's recv
        work.wait()
    assert torch.equal(got.cpu(), base + 100 * peer)

    dist.barrier()

    # async_op: wait() and the future's value (the output tensors)
    x = t(base * (rank + 1))
    work = dist.all_reduce(x, async_op=True)
    assert work.wait()
    value = work.get_future().wait()
    assert isinstance(value, list) and value[0] is x or torch.equal(value[0].cpu(), x.cpu())
    assert torch.equal(x.cpu(), base * 3)

    # a second group over the same ranks gets its own backend and exchange
    group = dist.new_group([0, 1])
    x = t(base * (rank + 1))
    dist.all_reduce(x, group=group)
    assert torch.equal(x.cpu(), base * 3)

    # dist.all_gather_object goes through the backend with emugpu tensors
    objs: list[Any] = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(world)]


def _three_ranks(rank: int, world: int) -> str:
    """The shared-memory path's own arithmetic with three ranks: rank-order
    chunks, reductions over every dtype family, and a coalesced payload whose
    second tensor starts at an odd byte offset."""
    dev = torch.device("emugpu", rank)
    x = torch.tensor([1.5, -2.0, 4.0]).mul(rank + 1).to(dev)
    dist.all_reduce(x)
    assert torch.equal(x.cpu(), torch.tensor([1.5, -2.0, 4.0]) * 6)
    for dtype, op, want in (
        (torch.int64, dist.ReduceOp.MAX, [2, 3, 4]),
        (torch.bool, dist.ReduceOp.SUM, [True, True, True]),
    ):
        x = (torch.arange(3) + rank).to(dtype).to(dev)
        dist.all_reduce(x, op=op)
        assert x.cpu().tolist() == want, (dtype, x.cpu())
    got = torch.zeros(2, device=dev)
    dist.reduce_scatter_tensor(got, torch.arange(6.0).add(10 * rank).to(dev))
    assert got.cpu().tolist() == [3 * (2 * rank) + 30, 3 * (2 * rank + 1) + 30]
    out = torch.zeros(9, dtype=torch.int16, device=dev)
    dist.all_gather_into_tensor(out, torch.full((3,), rank, dtype=torch.int16).to(dev))
    assert out.cpu().tolist() == [0] * 3 + [1] * 3 + [2] * 3
    x = torch.full((2,), float(rank)).to(dev)
    dist.broadcast(x, src=2)
    assert x.cpu().tolist() == [2.0, 2.0]
    from torch.distributed.distributed_c10d import _coalescing_manager

    pair = [torch.tensor([rank == 1, False, rank == 2]).to(dev), torch.tensor([rank, 1.0]).to(dev)]
    with _coalescing_manager():  # one all_reduce_coalesced over both dtypes
        for x in pair:
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
    assert pair[0].cpu().tolist() == [True, False, True] and pair[1].cpu().tolist() == [2.0, 1.0]
    backend = dist.distributed_c10d._get_default_group()._get_backend(dev)
    return backend.transport


def _backend_chosen(rank: int, world: int) -> str:
    dev = torch.device("emugpu", rank)
    x = torch.ones(2, device=dev)
    dist.all_reduce(x)
    assert x.cpu().tolist() == [2.0, 2.0]
    chosen = dist.group.WORLD._get_backend(dev).name()
    if "gloo" in dist.get_backend():  # "cpu:gloo,emugpu:emu": CPU tensors go to gloo
        y = torch.ones(2)
        dist.all_reduce(y)
        assert y.tolist() == [2.0, 2.0]
        chosen = f"cpu:{dist.group.WORLD._get_backend(torch.device('cpu')).name()},emugpu:{chosen}"
    return chosen


def _timeline(rank: int, world: int) -> dict[str, int]:
    """Rank 1 queues a 0.2 s kernel before the all_reduce, only once rank 0
    has returned from its call: the collective starts when rank 1's stream
    reaches it and ends at the same time on both ranks, its modelled duration
    later; rank 0's host does not wait."""
    from torch_emugpu import _C

    x = torch.ones(256).to(torch.device("emugpu", rank))  # 1 KiB of real bytes
    dist.barrier()
    torch.emugpu.synchronize()  # an idle device: `before` is stamped with the host's time
    torch.emugpu.reset_engine_stats()
    if rank == 1:
        _await("rank 0 called")
    kernel_end = _C._emulate_kernel(rank, 0.2) if rank == 1 else 0
    before = torch.emugpu.Event(enable_timing=True)
    host_before = _C._host_now_ns()
    before.record()
    host_recorded = _C._host_now_ns()
    dist.all_reduce(x)
    after = torch.emugpu.Event(enable_timing=True)
    after.record()
    host_after_call = _C._host_now_ns()
    if rank == 0:
        _signal("rank 0 called")
    end = _C._device_ready_ns(rank)
    torch.emugpu.synchronize()
    host_after_sync = _C._host_now_ns()
    assert x.cpu().tolist() == [2.0] * 256
    return {
        "kernel_end": kernel_end,
        "end": end,
        "host_before": host_before,
        "host_recorded": host_recorded,
        "host_after_call": host_after_call,
        "host_after_sync": host_after_sync,
        "elapsed_us": before.elapsed_time(after) * 1000,
        "collective_busy_ns": int(torch.emugpu.engine_stats()["collective_busy_s"] * 1e9),
    }


def _work_wait(rank: int, world: int) -> dict[str, float]:
    """async_op on a side stream: the current stream goes on until
    work.wait(), which makes it wait for the collective (as WorkNCCL's).
    Rank 1 reaches the all_reduce 0.1 s (of its device's time) after rank 0
    launched it."""
    from torch_emugpu import _C

    x = torch.ones(256).to(torch.device("emugpu", rank))
    dist.barrier()
    torch.emugpu.synchronize()  # an idle device: events are stamped with the host's time
    if rank == 1:
        _await("rank 0 launched")
        _C._emulate_kernel(rank, 0.1)
    before = torch.emugpu.Event(enable_timing=True)
    host_before = _C._host_now_ns()
    before.record()
    host_recorded = _C._host_now_ns()
    side = torch.emugpu.Stream()
    side.wait_stream(torch.emugpu.current_stream())
    with torch.emugpu.stream(side):
        work = dist.all_reduce(x, async_op=True)
    launched = torch.emugpu.Event(enable_timing=True)
    launched.record()
    host_launched = _C._host_now_ns()
    if rank == 0:
        _signal("rank 0 launched")
    work.wait()
    waited = torch.emugpu.Event(enable_timing=True)
    waited.record()
    end = _C._device_ready_ns(rank)  # the collective's end (before the copy below adds to the timeline)
    value = work.get_future().value()
    assert value[0].cpu().tolist() == [2.0] * 256
    return {
        "launched_ms": before.elapsed_time(launched),
        "waited_ms": before.elapsed_time(waited),
        "host_before": host_before,
        "host_recorded": host_recorded,
        "host_launched": host_launched,
        "end": end,
    }


def _overlap(rank: int, world: int) -> dict[str, float]:
    """An async all_reduce and compute launched after it overlap: the
    collective runs on the backend's own stream (as NCCL's); work.wait()
    joins them. Rank 1 launches first, so that rank 0's launch starts the
    collective."""
    from torch_emugpu import _C

    big = torch.empty(1 << 30, device=torch.device("emugpu", rank))  # 4 GiB: tens of ms on the link
    dist.barrier()
    torch.emugpu.synchronize()
    if rank == 0:
        _await("rank 1 launched")
    before = torch.emugpu.Event(enable_timing=True)
    host_before = _C._host_now_ns()
    before.record()
    work = dist.all_reduce(big, async_op=True)
    host_collective = _C._host_now_ns()
    if rank == 1:
        _signal("rank 1 launched")
    _C._emulate_kernel(rank, 0.05)  # 50 ms of compute on the current stream
    host_kernel = _C._host_now_ns()
    work.wait()
    after = torch.emugpu.Event(enable_timing=True)
    after.record()
    after.synchronize()
    return {
        "elapsed_ms": before.elapsed_time(after),
        "host_before": host_before,
        "host_collective": host_collective,
        "host_kernel": host_kernel,
    }


def _large_placeholder(rank: int, world: int) -> dict[str, Any]:
    """Timing mode: a 4 MiB tensor moves no bytes (its result is a placeholder),
    a 1 KiB one moves its real bytes."""
    from torch_emugpu import _C

    dev = torch.device("emugpu", rank)
    big = torch.full((1 << 20,), float(rank + 1)).to(dev)
    small = torch.full((256,), float(rank + 1)).to(dev)
    assert _C._is_materialized(big) and _C._is_materialized(small)
    torch.emugpu.reset_engine_stats()
    dist.all_reduce(big)
    dist.all_reduce(small)
    torch.emugpu.synchronize()
    return {
        "big_real": _C._is_materialized(big),
        "small_real": _C._is_materialized(small),
        "small": small[:2].cpu().tolist(),
        "busy_ns": int(torch.emugpu.engine_stats()["collective_busy_s"] * 1e9),
    }


def _mismatch(rank: int, world: int) -> str:
    x = torch.ones(4 + rank, device=torch.device("emugpu", rank))
    try:
        dist.all_reduce(x)  # compute mode: deferred too, its bytes reduced on the group's runner
        x.cpu()  # reading the result waits for it, and raises its error
    except ValueError as e:
        return str(e)
    raise AssertionError("expected a ValueError for shapes that differ across ranks")


def _dtype_mismatch(rank: int, world: int) -> str:
    x = torch.ones(4, device=torch.device("emugpu", rank), dtype=torch.float32 if rank == 0 else torch.float64)
    try:
        dist.all_reduce(x)  # deferred (placeholders): its error comes at the next host wait, as NCCL's async ones
        torch.emugpu.synchronize()
    except ValueError as e:
        return str(e)
    raise AssertionError("expected a ValueError for dtypes that differ across ranks")


def _path_mismatch(rank: int, world: int) -> str:
    """Timing mode: rank 0's 1 MiB all_reduce moves no bytes, rank 1's 1
    KiB one of real bytes would reduce them: the two take different paths
    and must still meet in one error."""
    x = torch.ones(1 << 18 if rank == 0 else 256, device=torch.device("emugpu", rank))
    try:
        dist.all_reduce(x)
        torch.emugpu.synchronize()  # where the deferred rank learns it
    except ValueError as e:
        return str(e)
    raise AssertionError("expected a ValueError for shapes that differ across ranks")


def _bad_input(rank: int, world: int) -> dict[str, str]:
    dev = torch.device("emugpu", rank)
    errors: dict[str, str] = {}
    with pytest.raises(RuntimeError) as info:  # c10d: no backend for CPU in an emu-only group
        dist.all_reduce(torch.ones(2))
    errors["cpu_c10d"] = str(info.value)
    emu = dist.group.WORLD._get_backend(dev)
    with pytest.raises(ValueError) as info:  # the backend itself, handed a CPU tensor
        emu.allreduce([torch.ones(2)], dist.AllreduceOptions())
    errors["cpu_backend"] = str(info.value)
    with pytest.raises(NotImplementedError) as info:
        dist.all_reduce(torch.ones(2, device=dev), op=dist._make_nccl_premul_sum(2.0))
    errors["premul"] = str(info.value)
    with pytest.raises(ValueError) as info:
        dist.all_reduce(torch.ones(2, device=dev), op=dist.ReduceOp.BAND)
    errors["band_float"] = str(info.value)
    with pytest.raises(NotImplementedError) as info:
        dist.recv(torch.ones(2, device=dev))  # from any source
    errors["unsupported"] = str(info.value)
    # the group still works after every refusal above (none reached the exchange)
    x = torch.ones(2, device=dev)
    dist.all_reduce(x)
    assert x.cpu().tolist() == [2.0, 2.0]
    return errors


def _rank_dies(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 exits while rank 0 already waits for an all_reduce."""
    from torch_emugpu import _C

    x = torch.ones(4, device=torch.device("emugpu", rank))
    dist.all_reduce(x)  # both ranks connected
    if rank == 1:
        time.sleep(1.0)
        dist.distributed_c10d._get_default_store().set("exited at", str(_C._host_now_ns()))
        os._exit(3)
    start = time.monotonic()
    try:
        dist.all_reduce(x)
        x.cpu()  # the all_reduce is deferred: reading its result raises its error
    except dist.DistBackendError as e:
        raised_at = _C._host_now_ns()
        exited_at = int(dist.distributed_c10d._get_default_store().get("exited at"))
        return {"seconds": time.monotonic() - start, "error": str(e), "after_exit_s": (raised_at - exited_at) / 1e9}
    raise AssertionError("expected a DistBackendError when a rank exits")


def _rank_hangs(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 stays alive but never joins the all_reduce (process group timeout 3 s)."""
    x = torch.ones(4, device=torch.device("emugpu", rank))
    dist.all_reduce(x)
    if rank == 1:
        time.sleep(8)
        return {}
    start = time.monotonic()
    try:
        dist.all_reduce(x)
        x.cpu()  # the all_reduce is deferred: reading its result raises its error
    except dist.DistBackendError as e:
        return {"seconds": time.monotonic() - start, "error": str(e)}
    raise AssertionError("expected a DistBackendError when a rank does not arrive")


def _host_goes_on(rank: int, world: int) -> dict[str, float]:
    """Rank 1 reaches an async all_reduce of a large tensor only once rank 0
    has launched it, waited on its future and on wait(), and launched a
    kernel after it (timing mode: no bytes move), as with NCCL; that kernel
    is held until the collective's end is known, and then runs right after
    it."""
    from torch_emugpu import _C

    big = torch.empty(1 << 24, device=torch.device("emugpu", rank))  # 64 MiB
    dist.barrier()
    if rank == 1:
        _await("rank 0 went on")
    work = dist.all_reduce(big, async_op=True)
    work.get_future().wait()
    work.wait()
    kernel_end = _C._emulate_kernel(rank, 0.05) if rank == 0 else 0  # -1: held behind the collective
    if rank == 0:
        _signal("rank 0 went on")
    end = _C._device_ready_ns(rank)  # resolves: the collective's end (then rank 0's kernel)
    torch.emugpu.synchronize()
    return {"kernel_end": kernel_end, "end": end, "now": _C._host_now_ns()}


def _freed_before_placed(rank: int, world: int) -> dict[str, int]:
    """Timing mode, large tensors (no bytes move): rank 0 launches an
    all_reduce, an all_gather_into_tensor and a reduce_scatter_tensor, as
    FSDP does, drops its tensors and reads its allocated bytes before rank 1
    has reached any of them, so before any is placed. As with NCCL's, the
    memory is the host's to free at once: peak memory must not follow how
    fast the other ranks' hosts are."""
    dev = torch.device("emugpu", rank)
    dist.barrier()
    if rank == 1:
        _await("rank 0 freed")
    before = torch.emugpu.memory_allocated(dev)
    shard = torch.empty(1 << 22, device=dev)  # 16 MiB
    full = torch.empty(world << 22, device=dev)
    dist.all_gather_into_tensor(full, shard)
    dist.reduce_scatter_tensor(shard, full)
    dist.all_reduce(full)
    del shard, full
    after = torch.emugpu.memory_allocated(dev)
    if rank == 0:
        _signal("rank 0 freed")
    torch.emugpu.synchronize()
    return {"before": before, "after": after}


def _bytes_host_goes_on(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 reaches an all_reduce of real bytes (compute mode, or a small
    tensor copied in, timing mode) only once rank 0 has launched it and run
    work that does not touch the tensor; rank 0 waits only where it reads the
    result; an op that writes the tensor after the launch is ordered after
    the reduction, as on a stream."""
    from torch_emugpu import _C

    dev = torch.device("emugpu", rank)
    x = torch.full((4,), float(rank + 1)).to(dev)
    other = torch.ones(1024).to(dev)
    other.mul_(2)  # its first call imports PyTorch's meta kernels (a second or so here)
    dist.barrier()
    if rank == 1:
        _await("rank 0 launched")
    arrived = _C._host_now_ns()
    dist.all_reduce(x)
    other.mul_(2)  # another tensor: no wait
    if rank == 0:
        _signal("rank 0 launched")
    value = x.cpu().tolist()  # waits for the other rank
    read = _C._host_now_ns()
    y = torch.full((2,), float(rank + 1)).to(dev)
    dist.all_reduce(y)
    y.mul_(10)  # written after the launch: waits, then scales the sum
    dist.all_reduce(y, op=dist.ReduceOp.MAX)  # reads what mul_ wrote (stream order)
    after = y.cpu().tolist()
    # The collectives Python checks (here a broadcast and an all_gather) are deferred the same way.
    b = torch.full((3,), float(rank + 1)).to(dev)
    gathered = torch.zeros(2 * 3, device=dev)
    dist.barrier()
    if rank == 1:
        _await("rank 0 launched the broadcast")
    python_arrived = _C._host_now_ns()
    dist.broadcast(b, src=1)
    dist.all_gather_into_tensor(gathered, b)
    if rank == 0:
        _signal("rank 0 launched the broadcast")
    broadcast = b.cpu().tolist()
    return {
        "arrived": arrived,
        "read": read,
        "value": value,
        "after": after,
        "python_arrived": python_arrived,
        "broadcast": broadcast,
        "gathered": gathered.cpu().tolist(),
        "python_read": _C._host_now_ns(),
    }


def _p2p_host_goes_on(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 sends to rank 0 only once rank 0 has posted its recv and
    returned from wait() (compute mode: real bytes), as NCCL's does; rank 0
    waits where it reads the tensor. Rank 0 then sends a tensor and scales it
    right after wait(): the scaling waits until the send's bytes are out, so
    rank 1 receives the value sent."""
    from torch_emugpu import _C

    dev = torch.device("emugpu", rank)
    got = torch.zeros(4, device=dev)
    got.add_(0)  # its first call imports PyTorch's meta kernels (a second or so here)
    dist.barrier()
    if rank == 1:
        _await("rank 0 waited")
        sent = _C._host_now_ns()
        dist.send(torch.full((4,), 7.0).to(dev), dst=0)
        back = torch.zeros(3, device=dev)
        dist.recv(back, src=0)
        return {"back": back.cpu().tolist(), "sent": sent}
    dist.irecv(got, src=1).wait()
    _signal("rank 0 waited")
    value = got.cpu().tolist()
    read = _C._host_now_ns()
    out = torch.full((3,), 5.0).to(dev)
    dist.isend(out, dst=1).wait()
    out.mul_(10)
    return {"read": read, "value": value, "out": out.cpu().tolist()}


def _p2p_behind_held_work(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 reaches an all_reduce only once rank 0 has launched everything
    below (compute mode). Rank 0's stream then waits for an end not known
    yet, and the sends and recvs it launches behind it (alone and in a batch)
    learn their start only once that end is known: the host goes on at once,
    as over NCCL, and the bytes still travel in order."""
    dev = torch.device("emugpu", rank)
    x = torch.ones(4, device=dev)
    x.add_(0)  # its first call imports PyTorch's meta kernels (a second or so here)
    mine = torch.full((4,), 3.0 + rank, device=dev)
    first, second = torch.zeros(4, device=dev), torch.zeros(4, device=dev)
    dist.barrier()
    if rank == 1:
        _await("rank 0 launched")
    dist.all_reduce(x)
    peer = 1 - rank
    sent = dist.isend(mine, dst=peer) if rank == 0 else None
    received = dist.irecv(first, src=peer) if rank == 1 else None
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, second, peer)])
    if rank == 0:
        _signal("rank 0 launched")
    for work in [sent, received, *reqs]:
        if work is not None:
            work.wait()
    mine.mul_(10)  # after the sends' bytes are out
    return {
        "x": x.cpu().tolist(),
        "first": first.cpu().tolist(),
        "second": second.cpu().tolist(),
        "mine": mine.cpu().tolist(),
    }


def _accelerator_synchronize(rank: int, world: int) -> dict[str, float]:
    """As _host_goes_on, but rank 0 only launches the async all_reduce and then
    calls torch.accelerator.synchronize(), which must wait for it as
    cudaDeviceSynchronize waits for NCCL's streams."""
    from torch_emugpu import _C

    big = torch.empty(1 << 24, device=torch.device("emugpu", rank))
    dist.barrier()
    if rank == 1:
        time.sleep(0.5)  # late, so that returning early would show
    arrived = _C._host_now_ns()
    work = dist.all_reduce(big, async_op=True)
    torch.accelerator.synchronize()
    synchronized = _C._host_now_ns()
    work.wait()
    return {"arrived": arrived, "synchronized": synchronized}


def _ring(rank: int, world: int) -> dict[str, Any]:
    """A ring exchange (pipeline parallelism's pattern): every rank sends to
    the next and receives from the previous in one batch_isend_irecv, send
    first; then a large placeholder the same way in timing mode, rank 1
    launching only once the others have. Returns the value received and when
    each message ended."""
    from torch_emugpu import _C

    dev = torch.device("emugpu", rank)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    got = torch.zeros(4, device=dev)
    ops = [dist.P2POp(dist.isend, torch.full((4,), float(rank)).to(dev), nxt), dist.P2POp(dist.irecv, got, prev)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    value = got.cpu().tolist()
    _C._set_mode("timing")
    big, into = torch.empty(1 << 22, device=dev), torch.empty(1 << 22, device=dev)  # 16 MiB placeholders
    dist.barrier()
    if rank == 1:  # the latest sender: its message ends after it launched it
        for other in range(world):
            if other != rank:
                _await(f"rank {other} launched")
    launch = _C._host_now_ns()
    send, recv = (dist.P2POp(dist.isend, big, nxt), dist.P2POp(dist.irecv, into, prev))
    works = dist.batch_isend_irecv([send, recv])
    if rank != 1:
        _signal(f"rank {rank} launched")
    assert len(works) == 1  # coalesced, as NCCL's: one Work for the batch
    works[0].wait()
    # The batch's end: its recv's (this rank's send went to a rank that launched as early as this one).
    recv_end = _C._device_ready_ns(rank)
    torch.emugpu.synchronize()
    return {"value": value, "recv_end": recv_end, "launch": launch, "materialized": _C._is_materialized(into)}


def _batch_overlap(rank: int, world: int) -> dict[str, int]:
    """A ring of 64 MiB placeholders in one batch_isend_irecv, every rank its
    own node: the batch's send and recv overlap (NCCL fuses them), so it
    takes about one message's modelled time, not two."""
    from torch_emugpu import _C

    dev = torch.device("emugpu", rank)
    big, into = torch.empty(1 << 24, device=dev), torch.empty(1 << 24, device=dev)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    dist.barrier()
    torch.emugpu.synchronize()
    launch = _C._host_now_ns()
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, big, nxt), dist.P2POp(dist.irecv, into, prev)])
    for work in works:
        work.wait()
    torch.emugpu.synchronize()
    one = _C._collective_duration(rank, "send_recv", float(1 << 26), world, 1)
    return {"launch": launch, "end": _C._device_ready_ns(rank), "one_message": one}


def _coalesced_all_reduces(rank: int, world: int) -> list[list[float]]:
    """c10d's coalescing manager with a device (as FSDP1 and others use it):
    two all_reduces recorded, run as one all_reduce_coalesced, one Work."""
    dev = torch.device("emugpu", rank)
    a, b = torch.full((3,), float(rank + 1)).to(dev), torch.full((2,), 10.0 * (rank + 1)).to(dev)
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    return [a.cpu().tolist(), b.cpu().tolist()]


def _large_values(rank: int, world: int) -> list[bool]:
    """All-reduces of real bytes beyond the shared-memory slots (a reduce-scatter, then an all-gather): odd
    element counts that do not split evenly over the ranks, three dtypes, AVG and MAX, and a coalesced batch."""
    dev = torch.device("emugpu", rank)
    x = (torch.arange(100003, dtype=torch.float32) * (rank + 1)).to(dev)
    dist.all_reduce(x)
    ok = [torch.equal(x.cpu(), torch.arange(100003, dtype=torch.float32) * sum(range(1, world + 1)))]
    y = torch.full((70001,), rank, dtype=torch.int64).to(dev)
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    ok.append(bool((y.cpu() == world - 1).all()))
    z = torch.full((3, 50001), float(rank), dtype=torch.float64).to(dev)
    dist.all_reduce(z, op=dist.ReduceOp.AVG)
    ok.append(torch.allclose(z.cpu(), torch.full((3, 50001), (world - 1) / 2, dtype=torch.float64)))
    # Every element differs, so that a slice reduced or copied home to the wrong place shows.
    parts = [(torch.arange(40000 + k, dtype=torch.float32) + float(rank + k)).to(dev) for k in range(3)]
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:
        for t in parts:
            dist.all_reduce(t)
    cm.wait()
    want = [
        torch.arange(40000 + k, dtype=torch.float32) * world + float(sum(r + k for r in range(world))) for k in range(3)
    ]
    ok.append(all(torch.equal(t.cpu(), w) for t, w in zip(parts, want, strict=True)))
    return ok


SCENARIOS: dict[str, Callable[[int, int], Any]] = {
    "large_values": _large_values,
    "ring": _ring,
    "batch_overlap": _batch_overlap,
    "coalesced_all_reduces": _coalesced_all_reduces,
    "host_goes_on": _host_goes_on,
    "freed_before_placed": _freed_before_placed,
    "accelerator_synchronize": _accelerator_synchronize,
    "bytes_host_goes_on": _bytes_host_goes_on,
    "p2p_host_goes_on": _p2p_host_goes_on,
    "p2p_behind_held_work": _p2p_behind_held_work,
    "values": _values,
    "backend_chosen": _backend_chosen,
    "timeline": _timeline,
    "large_placeholder": _large_placeholder,
    "work_wait": _work_wait,
    "overlap": _overlap,
    "mismatch": _mismatch,
    "dtype_mismatch": _dtype_mismatch,
    "path_mismatch": _path_mismatch,
    "bad_input": _bad_input,
    "rank_dies": _rank_dies,
    "rank_hangs": _rank_hangs,
    "three_ranks": _three_ranks,
}


# --- tests ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode,transport", [("compute", "auto"), ("timing", "auto"), ("compute", "tcp"), ("timing", "tcp")]
)
def test_collective_values(mode: str, transport: str) -> None:
    run_ranks("values", mode=mode, env={"EMUGPU_EXCHANGE": transport})


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_three_ranks_reduce_in_rank_order_on_either_transport(transport: str) -> None:
    out = run_ranks("three_ranks", world=3, mode="timing", env={"EMUGPU_EXCHANGE": transport})
    # One machine: auto picks shared memory.
    assert set(out.values()) == {"shm" if transport == "auto" else "tcp"}


@pytest.mark.parametrize(
    "init,backend", [("emu", "emu"), ("default", "emu"), ("device_id", "emu"), ("mixed", "cpu:gloo,emugpu:emu")]
)
def test_backend_chosen(init: str, backend: str) -> None:
    out = run_ranks("backend_chosen", init=init)
    assert out[0] == out[1] == backend


def test_backend_registered_for_emugpu() -> None:
    import torch_emugpu  # noqa: F401

    assert dist.Backend.default_device_backend_map["emugpu"] == "emu"
    assert dist.Backend.backend_capability["emu"] == ["emugpu"]


def test_completion_is_latest_start_plus_modelled_duration() -> None:
    import torch_emugpu

    out = run_ranks("timeline", mode="timing")
    duration = round(
        torch_emugpu._C._collective_time("all_reduce", 1024, torch_emugpu._C.DEFAULT_GPU, 2, 1)["seconds"] * 1e9
    )
    assert out[0]["end"] == out[1]["end"], "the collective must end at the same time on every rank"
    assert out[1]["end"] - out[1]["kernel_end"] == pytest.approx(duration, abs=2)
    assert out[0]["collective_busy_ns"] == pytest.approx(duration, abs=2)
    # rank 0's host returned before rank 1 even queued its 0.2 s kernel, and synchronize() waited for the end
    assert out[0]["host_after_call"] < out[0]["end"] - 200_000_000
    assert out[0]["host_after_sync"] >= out[0]["end"]
    # rank 0's events see the wait for rank 1's kernel: `after` is the collective's end, `before` the
    # host's time at its record (an idle device), which lies between the two host times read around it
    r0 = out[0]
    assert (r0["end"] - r0["host_recorded"]) / 1e3 - 1 <= r0["elapsed_us"] <= (r0["end"] - r0["host_before"]) / 1e3 + 1


def test_work_wait_orders_the_current_stream() -> None:
    out = run_ranks("work_wait", mode="timing")
    r0 = out[0]
    # Emulated times against the host's: `launched` is stamped with the host's time (the current stream
    # did not wait), `waited` with the collective's end, which rank 1's 0.1 s kernel put after both.
    assert r0["launched_ms"] * 1e6 <= r0["host_launched"] - r0["host_before"] + 1e3, (
        "the current stream must not wait before work.wait()"
    )
    assert r0["end"] >= r0["host_launched"] + 100_000_000, r0
    assert (
        (r0["end"] - r0["host_recorded"]) / 1e6 - 1e-3
        <= r0["waited_ms"]
        <= (r0["end"] - r0["host_before"]) / 1e6 + 1e-3
    ), "work.wait() must make the current stream wait for the collective"


def test_compute_overlaps_an_async_collective() -> None:
    import torch_emugpu

    collective_ms = (
        torch_emugpu._C._collective_time("all_reduce", 4 << 30, torch_emugpu._C.DEFAULT_GPU, 2, 1)["seconds"] * 1e3
    )
    assert collective_ms > 10  # comparable to the 50 ms kernel, so serializing them would show
    out = run_ranks("overlap", mode="timing")
    # Rank 0 launched last, so its launch started the collective; overlapped, each rank's iteration ends at
    # the later of the collective's end and its kernel's (each about where the host times read after their
    # launches put it, whatever the skew between the ranks' hosts); serialized, the shorter of the two
    # would come on top.
    collective_end = out[0]["host_collective"] + collective_ms * 1e6
    for rank in (0, 1):
        r = out[rank]
        latest = (max(collective_end, r["host_kernel"] + 50e6) - r["host_before"]) / 1e6
        assert 50 <= r["elapsed_ms"] <= latest + 0.25 * min(collective_ms, 50), out


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_host_does_not_wait_for_other_ranks_when_launching_or_waiting(transport: str) -> None:
    # Rank 1 arrives only once rank 0 launched, waited and launched a kernel after it: getting here at all
    # shows rank 0's host went on (NCCL's does not wait for the peers either, nor in wait() or its future's).
    out = run_ranks("host_goes_on", mode="timing", env={"EMUGPU_EXCHANGE": transport})
    assert out[0]["kernel_end"] == -1, out[0]
    assert out[0]["end"] == out[1]["end"] + 50_000_000  # the held kernel ran right after the collective
    assert out[0]["now"] >= out[0]["end"]  # synchronize waited for it


def test_tensors_of_a_collective_not_yet_placed_are_freed_when_the_host_drops_them() -> None:
    # Rank 1 arrives only after rank 0 read its memory, so none of the three collectives was placed then.
    out = run_ranks("freed_before_placed", mode="timing")
    for rank, m in out.items():
        assert m["after"] == m["before"], (rank, m)


@pytest.mark.parametrize("mode", ["compute", "timing"])
def test_host_does_not_wait_for_an_all_reduce_of_real_bytes_until_it_reads_them(mode: str) -> None:
    # Rank 1 arrives only once rank 0 launched (and ran unrelated work): NCCL's host goes on too.
    out = run_ranks("bytes_host_goes_on", mode=mode)
    r0 = out[0]
    # Reading the result waited for rank 1: the same host's clock orders the two.
    assert r0["read"] >= out[1]["arrived"] and r0["python_read"] >= out[1]["python_arrived"], out
    for rank in (0, 1):
        assert out[rank]["value"] == [3.0] * 4, out[rank]
        assert out[rank]["broadcast"] == [2.0] * 3 and out[rank]["gathered"] == [2.0] * 6, out[rank]
        if mode == "compute":  # timing mode computes no mul_: its result is a placeholder
            assert out[rank]["after"] == [30.0, 30.0], out[rank]


def test_host_does_not_wait_for_a_recv_until_it_reads_the_tensor() -> None:
    # Rank 1 sends only once rank 0's wait() returned: wait() orders the stream only.
    out = run_ranks("p2p_host_goes_on", mode="compute")
    assert out[0]["read"] >= out[1]["sent"] and out[0]["value"] == [7.0] * 4, out
    assert out[0]["out"] == [50.0] * 3 and out[1]["back"] == [5.0] * 3, out


def test_sends_and_recvs_behind_a_collective_not_yet_placed_do_not_block_the_host() -> None:
    # Rank 1 arrives only once rank 0 launched the all_reduce, a send and a batch.
    out = run_ranks("p2p_behind_held_work", mode="compute")
    for rank in (0, 1):
        assert out[rank]["x"] == [2.0] * 4, out
        assert out[rank]["second"] == [3.0 + (1 - rank)] * 4, out
        assert out[rank]["mine"] == [10 * (3.0 + rank)] * 4, out
    assert out[1]["first"] == [3.0] * 4, out


def test_torch_accelerator_synchronize_waits_for_async_collectives() -> None:
    out = run_ranks("accelerator_synchronize", mode="timing")
    assert out[0]["synchronized"] >= out[1]["arrived"], out  # the same host's clock: it waited for rank 1


def test_a_ring_of_sends_and_recvs_pairs_each_send_with_its_recv() -> None:
    out = run_ranks("ring", world=3, mode="compute")
    for rank in range(3):
        assert out[rank]["value"] == [float((rank - 1) % 3)] * 4, out[rank]
        assert not out[rank]["materialized"]  # a 16 MiB placeholder moves no bytes
    # Rank 2 receives from rank 1, the late sender: the message ends after rank 1 launched it.
    assert out[2]["recv_end"] > out[1]["launch"] > out[2]["launch"], out


def test_a_batch_of_sends_and_recvs_overlaps_them() -> None:
    out = run_ranks("batch_overlap", world=3, mode="timing", env={"LOCAL_WORLD_SIZE": "1", "EMUGPU_NET_GBPS": "1"})
    for rank in range(3):
        one = out[rank]["one_message"]
        assert one > 50e6, out  # 64 MiB at 1 GB/s
        # The batch starts once this rank and its two peers have posted it and takes about one message's
        # time; serialized, it would take two. Measured from the last of the three to launch (the same
        # host's clock), so that skew between the ranks' hosts does not count.
        last = max(out[r]["launch"] for r in ((rank - 1) % 3, rank, (rank + 1) % 3))
        assert 0.95 * one <= out[rank]["end"] - last <= 1.4 * one, out


def test_coalesced_all_reduces_give_the_right_values() -> None:
    out = run_ranks("coalesced_all_reduces", mode="compute")
    for rank in (0, 1):
        assert out[rank] == [[3.0] * 3, [30.0] * 2], out


@pytest.mark.parametrize("exchange", ["auto", "tcp"])
def test_large_all_reduces_of_real_bytes_give_the_right_values(exchange: str) -> None:
    out = run_ranks("large_values", world=3, mode="compute", env={"EMUGPU_EXCHANGE": exchange})
    for rank in range(3):
        assert out[rank] == [True] * 4, (rank, out[rank])


def test_large_tensors_move_no_bytes_in_timing_mode() -> None:
    import torch_emugpu

    out = run_ranks("large_placeholder", mode="timing")
    model = torch_emugpu._C._collective_time
    gpu = torch_emugpu._C.DEFAULT_GPU
    for rank in (0, 1):
        assert out[rank]["big_real"] is False
        assert out[rank]["small_real"] is True
        assert out[rank]["small"] == [3.0, 3.0]
        want = model("all_reduce", 4 << 20, gpu, 2, 1)["seconds"] + model("all_reduce", 1024, gpu, 2, 1)["seconds"]
        assert out[rank]["busy_ns"] == pytest.approx(want * 1e9, abs=4)


def test_mismatched_shapes_name_both() -> None:
    out = run_ranks("mismatch")
    for rank in (0, 1):
        assert "(4,) float32" in out[rank] and "(5,) float32" in out[rank], out[rank]
        assert "rank 0" in out[rank] and "rank 1" in out[rank]


def test_mismatched_dtypes_name_both() -> None:
    out = run_ranks("dtype_mismatch", mode="timing")
    for rank in (0, 1):
        assert "float32" in out[rank] and "float64" in out[rank], out[rank]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_deferred_and_a_waiting_rank_that_disagree_both_raise(transport: str) -> None:
    out = run_ranks("path_mismatch", mode="timing", env={"EMUGPU_EXCHANGE": transport})
    for rank in (0, 1):
        assert "(262144,) float32" in out[rank] and "(256,) float32" in out[rank], out[rank]


def test_bad_input_errors() -> None:
    out = run_ranks("bad_input")
    for rank in (0, 1):
        e = out[rank]
        assert "cpu" in e["cpu_c10d"].lower()
        assert "expected emugpu tensors, got one on cpu" in e["cpu_backend"]
        assert "PREMUL_SUM is not supported yet" in e["premul"]
        assert "BAND expected an integer or bool dtype" in e["band_float"]
        assert "recv from any source is not supported yet" in e["unsupported"]


# A torchrun layout that does not fit the emulated devices: every rank raises
# at construction, before the rendezvous (a hang here means it came after).
@pytest.mark.parametrize(
    "env,size,message",
    [
        (
            {"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4"},
            4,
            "expected an emulated GPU per rank of the node (LOCAL_WORLD_SIZE=4), got 2 emulated device(s); "
            "set EMUGPU_DEVICE_COUNT",
        ),
        ({"LOCAL_RANK": "2"}, 2, "LOCAL_RANK=2 expected an emulated device emugpu:2, got 2 emulated device(s)"),
        (
            {"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "3"},
            3,
            "expected whole nodes of LOCAL_WORLD_SIZE=2 ranks (torchrun's --nproc-per-node), got a world of 3",
        ),
        ({"LOCAL_WORLD_SIZE": "two"}, 2, "LOCAL_WORLD_SIZE (set by torchrun) expected an integer >= 1, got 'two'"),
    ],
)
def test_layout_that_does_not_fit_the_emulated_devices(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], size: int, message: str
) -> None:
    from torch_emugpu.distributed import create_backend

    assert torch.emugpu.device_count() == 2
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as info:
        create_backend(dist.HashStore(), 0, size, datetime.timedelta(seconds=5))
    assert message in str(info.value)


def test_torchrun_with_too_few_emulated_devices_fails_at_init(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "init.py"
    script.write_text("import torch.distributed as dist\nimport torch_emugpu\n\ndist.init_process_group('emu')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    env["EMUGPU_DEVICE_COUNT"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    start = time.monotonic()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode != 0
    # Each rank raises at init, not at the process group's timeout; the first to fail has torchrun
    # stop the other, which may not get to print its own error.
    assert (
        r.stderr.count(
            "ValueError: emu backend: expected an emulated GPU per rank of the node "
            "(LOCAL_WORLD_SIZE=2), got 1 emulated device(s)"
        )
        >= 1
    ), r.stderr[-3000:]
    assert time.monotonic() - start < 120


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_rank_exit_raises_within_timeout(transport: str) -> None:
    out = run_ranks("rank_dies", dying=(1,), env={"EMUGPU_EXCHANGE": transport})
    # Raised after rank 1 exited (the same host's clock orders them) and before the timeout (a generous
    # bound: the subject is real time).
    assert 0 <= out[0]["after_exit_s"] and out[0]["seconds"] < PG_TIMEOUT.total_seconds(), out[0]
    assert "rank 0 of 2: all_reduce failed" in out[0]["error"]
    if transport == "shm":  # noticed by its pid, well before the timeout
        assert "rank 1 (pid" in out[0]["error"] and "exited" in out[0]["error"]
        assert out[0]["after_exit_s"] < PG_TIMEOUT.total_seconds() / 2, out[0]


def test_rank_that_never_arrives_raises_at_the_timeout() -> None:
    out = run_ranks("rank_hangs", timeout=3.0)
    # The 3 s timeout, not the store's 20 s: the upper bound is generous for a loaded host.
    assert 2.5 < out[0]["seconds"] < 15, out[0]
    assert "did not arrive within the process group's timeout (3 s)" in out[0]["error"]
