"""Timing mode computes the values of small ops whose inputs all hold real
bytes (every tensor at most 64 KiB): control paths get the values a GPU
would give. Object collectives (broadcast_object_list, all_gather_object,
scatter/gather_object), which distributed checkpointing uses, depend on it.
Larger ops, or ops on placeholders, stay placeholders."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from distributed_ranks import run_ranks

from torch_emugpu import _C

LIMIT = 64 * 1024  # bytes per tensor


def test_small_ops_on_copied_in_bytes_are_real():
    x = torch.arange(6.0).to("emugpu")
    y = (x * 2 + 1).sum()
    assert y.item() == 36.0
    sizes = torch.cat([torch.LongTensor([3]).to("emugpu"), torch.LongTensor([5]).to("emugpu")])
    assert sizes.tolist() == [3, 5] and torch.sum(sizes).item() == 8
    assert (x > 2).any().item() is True and int(max(x[1:2], x[3:4]).item()) == 3


def test_factories_and_fills_are_real():
    assert torch.arange(5, device="emugpu").tolist() == [0, 1, 2, 3, 4]
    assert torch.full((3,), 7.0, device="emugpu").tolist() == [7.0, 7.0, 7.0]
    assert _C._is_materialized(torch.zeros(4, device="emugpu"))


def test_the_limit_is_per_tensor():
    at_limit = torch.ones(LIMIT // 4).to("emugpu")
    assert (at_limit * 2).sum().item() == LIMIT // 2
    above = torch.ones(LIMIT // 4 + 1).to("emugpu")
    doubled = above * 2
    assert not _C._is_materialized(doubled) and doubled.sum().item() == 0.0  # a placeholder reads as zeros


def test_placeholders_stay_placeholders():
    big = torch.ones(LIMIT).to("emugpu") * 3  # above the limit: a placeholder
    small = big[:4] + 1  # small, but reads a placeholder
    assert not _C._is_materialized(small)
    assert torch.equal(small.cpu(), torch.zeros(4))


def test_random_ops_are_real_and_follow_the_device_generator():
    torch.emugpu.manual_seed(5)
    a = torch.rand(16, device="emugpu")
    torch.emugpu.manual_seed(5)
    b = torch.rand(16, device="emugpu")
    assert _C._is_materialized(a) and torch.equal(a.cpu(), b.cpu()) and a.min().item() >= 0 and a.max().item() < 1
    assert a.sum().item() > 0


# --- object collectives over 2 ranks in timing mode ---------------------------


def _objects(rank: int, world: int) -> dict[str, object]:
    payload = {"rank": rank, "words": ["x" * (100 * (rank + 1))], "nested": {"step": 7 + rank}}
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, payload)
    blist: list[object] = [{"from": "rank0", "n": 3}, "second", list(range(50))] if rank == 0 else [None, None, None]
    dist.broadcast_object_list(blist, src=0)
    scattered: list[object] = [None]
    dist.scatter_object_list(scattered, [f"to {r}" for r in range(world)] if rank == 0 else None, src=0)
    gathered_at_0: list[object] | None = [None] * world if rank == 0 else None
    dist.gather_object({"r": rank}, gathered_at_0, dst=0)
    return {"all_gather": gathered, "broadcast": blist, "scatter": scattered[0], "gather": gathered_at_0}


@pytest.mark.slow
def test_object_collectives_work_in_timing_mode():
    out = run_ranks(_objects, world=2, mode="timing", timeout=60)
    for rank in (0, 1):
        assert out[rank]["all_gather"] == [
            {"rank": r, "words": ["x" * (100 * (r + 1))], "nested": {"step": 7 + r}} for r in (0, 1)
        ]
        assert out[rank]["broadcast"] == [{"from": "rank0", "n": 3}, "second", list(range(50))]
        assert out[rank]["scatter"] == f"to {rank}"
    assert out[0]["gather"] == [{"r": 0}, {"r": 1}]


def test_an_op_the_host_cannot_compute_stays_a_placeholder():
    """The CPU has no float16 Cholesky, which a GPU has: timing mode keeps the op, as a placeholder."""
    a = torch.eye(2, dtype=torch.float16).to("emugpu")
    out = torch.linalg.cholesky(a)
    assert out.shape == (2, 2) and not _C._is_materialized(out)
