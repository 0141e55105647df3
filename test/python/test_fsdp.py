"""FSDP2 (`fully_shard`) and DTensor over backend `emu`, unmodified:
values against a one-process CPU reference (compute mode), a 2-D mesh with
tensor parallelism, per-rank memory showing the sharding, and FSDP's
all-gathers overlapping compute on the emulated timeline (timing mode).

The model is examples/fsdp_gpt.py's GPT at a tiny size, so the example's
sharding code is what is tested."""

from __future__ import annotations

import functools
import importlib.util
import pathlib
from types import ModuleType

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from distributed_ranks import run_ranks

pytestmark = pytest.mark.slow  # multi-process runs: scripts/test.sh --fast leaves them out

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "fsdp_gpt.py"
TINY = {"vocab": 64, "dim": 32, "layers": 2, "heads": 4, "context": 8}
BATCH = 2  # sequences per data-parallel rank


@functools.cache
def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fsdp_gpt", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _batches(dp: int, steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, TINY["vocab"], (dp * BATCH, TINY["context"] + 1), generator=g) for _ in range(steps)]


def _loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())


def _reference(dp: int, steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same training on the CPU in one process, over the whole batch."""
    torch.manual_seed(0)
    model = _example().GPT(**TINY)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for batch in _batches(dp, steps):
        loss = _loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model.state_dict()


def _train(rank: int, world: int, tp: int, bf16: bool, steps: int = 3) -> tuple[list[float], dict[str, object]]:
    """Scenario: the example's sharding on a (world / tp, tp) mesh; returns
    this rank's losses (averaged over the data-parallel ranks) and the full
    parameters."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    example = _example()
    dp = world // tp
    mesh = init_device_mesh("emugpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = example.GPT(**TINY)
    if bf16:
        example.shard(model, mesh, tp)
    else:
        policy = MixedPrecisionPolicy()  # fp32 throughout: comparable to the CPU bit for bit, almost
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"], mp_policy=policy)
        fully_shard(model, mesh=mesh["dp"], mp_policy=policy)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    me = mesh["dp"].get_local_rank()
    losses = []
    for batch in _batches(dp, steps):
        loss = _loss(model, batch[me * BATCH : (me + 1) * BATCH].to("emugpu"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG, group=mesh["dp"].get_group())
        losses.append(mean.item())
    # numpy pickles by value; a tensor would travel as shared memory the exiting child takes along.
    full = {k: v.full_tensor().cpu().numpy() for k, v in model.state_dict().items()}
    return losses, full


def test_fully_shard_matches_one_process() -> None:
    out = run_ranks(functools.partial(_train, tp=1, bf16=False), world=2, init="device_id")
    want_losses, want = _reference(dp=2, steps=3)
    for rank, (losses, params) in out.items():
        assert torch.allclose(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-4), (rank, losses, want_losses)
        for name, value in want.items():
            assert torch.allclose(torch.from_numpy(params[name]), value, atol=1e-5), (rank, name)


def test_two_dimensional_mesh_with_tensor_parallelism_and_bf16() -> None:
    out = run_ranks(functools.partial(_train, tp=2, bf16=True), world=4, init="device_id")
    want_losses, want = _reference(dp=2, steps=3)
    for rank, (losses, params) in out.items():
        # bf16 parameters and activations: a percent or so off the fp32 reference.
        assert torch.allclose(torch.tensor(losses), torch.tensor(want_losses), rtol=3e-2), (rank, losses, want_losses)
        moved = sum((torch.from_numpy(params[k]) - want[k]).abs().max().item() for k in want)
        assert moved < 0.5, (rank, moved)  # trained the same way (a wrong gradient drifts by far more)
    assert out[0][0] == out[1][0]  # tensor-parallel peers of one data-parallel rank agree


def _memory(rank: int, world: int) -> dict[str, int]:
    """Scenario (timing mode): bytes on the device after sharding, and the
    full model's parameter bytes."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = _example().GPT(vocab=4096, dim=512, layers=4, heads=8, context=64)
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    before = torch.emugpu.memory_allocated()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return {"full": full, "sharded": torch.emugpu.memory_allocated() - before}


def test_each_rank_holds_its_shard_of_the_parameters() -> None:
    for world in (2, 4):
        out = run_ranks(_memory, world=world, mode="timing", init="device_id")
        for rank, m in out.items():
            # A 1/world share, rounded up per parameter (FSDP pads dim 0) and per allocation (512 B).
            assert m["full"] / world <= m["sharded"] <= m["full"] / world * 1.05 + 64 * 1024, (world, rank, m)


def _overlap(rank: int, world: int) -> dict[str, float]:
    """Scenario (timing mode): one training iteration's emulated time and
    the compute and collective engines' busy time in it, each rank an
    emulated node of its own behind a slow network, so the collectives take
    about as long as the compute."""
    import os

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from torch_emugpu import _C

    os.environ["GROUP_RANK"] = str(rank)  # torchrun's node rank: a group made now spans two nodes
    mesh = DeviceMesh.from_group(dist.new_group(backend="emu"), "emugpu")
    torch.manual_seed(0)
    model = _example().GPT(vocab=8192, dim=1024, layers=6, heads=16, context=512)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = torch.randint(0, 8192, (32, 513)).to("emugpu")

    def step() -> None:
        _loss(model, batch).backward()
        opt.step()
        opt.zero_grad()

    step()  # warm-up: shape caches, FSDP's lazy init
    torch.emugpu.synchronize()
    dev = torch.emugpu.current_device()
    _C._reset_engine_stats(dev)
    start = _C._device_ready_ns(dev)
    step()
    torch.emugpu.synchronize()
    stats = _C._engine_stats(dev)
    return {
        "iteration": (_C._device_ready_ns(dev) - start) / 1e9,
        "compute": stats["compute"][1] / 1e9,
        "collective": stats["collective"][1] / 1e9,
        "launches": stats["collective"][0],
    }


def test_all_gathers_and_reduce_scatters_overlap_compute() -> None:
    # A V100 PCIe (slow compute) and 0.5 GB/s between the two nodes: a second of each per iteration,
    # far above what the host takes to launch it.
    out = run_ranks(
        _overlap, world=2, mode="timing", init="device_id", env={"EMUGPU_GPU": "v100-pcie", "EMUGPU_NET_GBPS": "0.5"}
    )
    for rank, t in out.items():
        # Forward all-gathers of the blocks and the root, backward ones of the blocks, a reduce-scatter each.
        assert t["launches"] >= 7 + 6 + 7, (rank, t)
        assert 0.5 * t["compute"] < t["collective"] < 2 * t["compute"], (rank, t)
        serial = t["compute"] + t["collective"]
        assert t["iteration"] < 0.85 * serial, (rank, t)  # prefetching overlaps them
        assert t["iteration"] >= max(t["compute"], t["collective"]) * 0.999, (rank, t)
