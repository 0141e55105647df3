"""DistributedDataParallel, unmodified, over backend `emu` on 2 spawned ranks
(emugpu:rank each): no_sync, find_unused_parameters, static_graph,
gradient_as_bucket_view and the default comm hooks.

Compute mode: every rank trains on its half of each batch and returns its
gradients and parameters; the test trains the same model on the whole batch
in one CPU process (same seeds, same data) and compares. Timing mode: every
configuration runs a few iterations and its collectives take time on the
emulated timeline.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch
import torch.distributed as dist
from conftest import write_synthetic_profile
from distributed_ranks import run_ranks
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

pytestmark = pytest.mark.slow  # multi-process runs: scripts/test.sh --fast leaves them out

SEED = 100  # rank 0's initial parameters, and the reference's
STEPS = 3
BATCH = 8  # per step (per micro-batch with no_sync), split evenly over the 2 ranks
LR = 0.1

# DDP's keyword arguments per configuration; "plain" is DDP's defaults.
CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {},
    "no_sync": {},
    "find_unused": {"find_unused_parameters": True},
    "static_graph": {"static_graph": True},
    "bucket_view": {"gradient_as_bucket_view": True},
    "fp16_hook": {},
    "bf16_hook": {},
    "allreduce_hook": {},
}


class _Net(torch.nn.Module):
    """Two layers and a branch that forward uses only when told to."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 5)
        self.b = torch.nn.Linear(5, 3)
        self.branch = torch.nn.Linear(5, 3)

    def forward(self, x: torch.Tensor, use_branch: bool) -> torch.Tensor:
        h = torch.relu(self.a(x))
        y = self.b(h)
        return y + self.branch(h) if use_branch else y


def _uses_branch(config: str, step: int) -> bool:
    """DDP without find_unused_parameters needs every parameter used in every
    step; with it, the branch sits out odd steps; a static graph may leave
    parameters unused as long as it is always the same ones."""
    if config == "find_unused":
        return step % 2 == 0
    return config != "static_graph"


def _batches(step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The step's micro-batches (two with no_sync, else one), whole."""
    g = torch.Generator().manual_seed(7 + step)
    return [(torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 3, generator=g)) for _ in range(2)]


def _grads(model: torch.nn.Module) -> list[list[float] | None]:
    return [None if p.grad is None else p.grad.detach().cpu().reshape(-1).tolist() for p in model.parameters()]


def _params(model: torch.nn.Module) -> list[list[float]]:
    return [p.detach().cpu().reshape(-1).tolist() for p in model.parameters()]


def _register_hook(ddp: torch.nn.parallel.DistributedDataParallel, config: str) -> None:
    # None and the process group are both valid hook states (the group to use).
    if config == "fp16_hook":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif config == "bf16_hook":
        ddp.register_comm_hook(dist.group.WORLD, default_hooks.bf16_compress_hook)
    elif config == "allreduce_hook":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)


@contextlib.contextmanager
def _counting_collectives() -> Iterator[Mapping[str, int]]:
    """Counts the collectives c10d hands backend `emu`, by method name (the
    backend's own tally of its calls, read live)."""
    backend = dist.distributed_c10d._get_default_group()._get_backend(
        torch.device("emugpu", torch.emugpu.current_device())
    )
    before = collections.Counter(backend.calls())

    class Since(Mapping[str, int]):
        def _now(self) -> collections.Counter[str]:
            return collections.Counter(backend.calls()) - before

        def __getitem__(self, name: str) -> int:
            return self._now()[name]

        def __iter__(self) -> Iterator[str]:
            return iter(self._now())

        def __len__(self) -> int:
            return len(self._now())

    yield Since()


def _train(config: str, rank: int, world: int) -> dict[str, Any]:
    """STEPS steps of SGD under DDP with `config` on this rank's half of each
    batch; returns what the test compares (values only in compute mode)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torch_emugpu import _C

    dev = torch.device("emugpu", rank)
    compute = _C._mode() == "compute"
    torch.manual_seed(SEED + rank)  # rank 1 starts elsewhere: DDP's broadcast must overwrite it
    net = _Net().to(dev)
    ddp = DDP(net, device_ids=[rank], **CONFIGS[config])
    _register_hook(ddp, config)
    out: dict[str, Any] = {
        "initial": _params(net) if compute else None,
        "grads": [],
        "in_no_sync": [],
        "launches_per_step": [],
        "all_reduces_per_step": [],
    }
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    mine = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    torch.emugpu.synchronize()
    torch.emugpu.reset_engine_stats()
    start = torch.emugpu.Event(enable_timing=True)
    start.record()

    def backward(x: torch.Tensor, y: torch.Tensor, use_branch: bool) -> None:
        loss = torch.nn.functional.mse_loss(ddp(x[mine].to(dev), use_branch=use_branch), y[mine].to(dev))
        loss.backward()

    def launches() -> int:
        torch.emugpu.synchronize()  # deferred all-reduces are on the timeline once the host waited
        return int(torch.emugpu.engine_stats()["collective_launches"])

    for step in range(STEPS):
        opt.zero_grad()
        batches = _batches(step)
        use_branch = _uses_branch(config, step)
        before = launches()
        with _counting_collectives() as counts:
            if config == "no_sync":  # accumulate the first micro-batch locally, reduce with the second
                with ddp.no_sync():
                    backward(*batches[0], use_branch)
                out["in_no_sync"].append({"launches": launches() - before, **counts})
                backward(*batches[1], use_branch)
            else:
                backward(*batches[0], use_branch)
        out["launches_per_step"].append(launches() - before)
        out["all_reduces_per_step"].append(counts["allreduce"])
        if config == "bucket_view":
            # Every gradient is a view into the one bucket (a small model fits the first).
            storages = {p.grad.untyped_storage().data_ptr() for p in net.parameters()}
            offsets = {p.grad.storage_offset() for p in net.parameters()}
            assert len(storages) == 1 and len(offsets) == len(list(net.parameters())), (storages, offsets)
        if compute:
            out["grads"].append(_grads(net))
        opt.step()
    end = torch.emugpu.Event(enable_timing=True)
    end.record()
    end.synchronize()
    stats = torch.emugpu.engine_stats()
    out.update(
        params=_params(net) if compute else None,
        elapsed_s=start.elapsed_time(end) / 1e3,
        collective_launches=stats["collective_launches"],
        collective_busy_s=stats["collective_busy_s"],
    )
    return out


def _reference(config: str) -> dict[str, Any]:
    """The same training in one CPU process on whole batches."""
    torch.manual_seed(SEED)
    net = _Net()
    out: dict[str, Any] = {"initial": _params(net), "grads": []}
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        for x, y in _batches(step)[: 2 if config == "no_sync" else 1]:
            torch.nn.functional.mse_loss(net(x, _uses_branch(config, step)), y).backward()
        out["grads"].append(_grads(net))
        opt.step()
    out["params"] = _params(net)
    return out


def _assert_close(got: list[list[float] | None], want: list[list[float] | None], what: str, **tol: float) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g is None) == (w is None), f"{what}, parameter {i}: gradient {g} but the reference has {w}"
        if g is not None:
            torch.testing.assert_close(
                torch.tensor(g), torch.tensor(w), msg=lambda m, i=i: f"{what}, parameter {i}: {m}", **tol
            )


# fp16/bf16 hooks reduce gradients rounded to 11/8 significant bits.
TOLERANCE: dict[str, dict[str, float]] = {
    "fp16_hook": {"rtol": 2e-3, "atol": 1e-3},
    "bf16_hook": {"rtol": 2e-2, "atol": 1e-2},
}
COMPRESSED = {"fp16_hook": torch.float16, "bf16_hook": torch.bfloat16}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_ddp_matches_one_process_in_compute_mode(config: str) -> None:
    out = run_ranks(functools.partial(_train, config), mode="compute")
    ref = _reference(config)
    tol = TOLERANCE.get(config, {"rtol": 1e-5, "atol": 1e-6})
    for rank in (0, 1):
        _assert_close(out[rank]["initial"], ref["initial"], f"rank {rank} after DDP's broadcast", rtol=0, atol=0)
        for step in range(STEPS):
            _assert_close(out[rank]["grads"][step], ref["grads"][step], f"rank {rank} step {step}", **tol)
        _assert_close(out[rank]["params"], ref["params"], f"rank {rank} after {STEPS} steps", **tol)
    assert out[0]["params"] == out[1]["params"], "the replicas diverged"
    if config in COMPRESSED:  # the hook ran: every reduced gradient came back from the compressed dtype
        for grad in out[0]["grads"][0]:
            g = torch.tensor(grad)
            assert torch.equal(g.to(COMPRESSED[config]).float(), g), f"{config}: gradient not compressed: {grad}"
    for rank in (0, 1):
        _assert_no_sync_reduced_nothing(config, out[rank]["in_no_sync"])
        assert all(n > 0 for n in out[rank]["all_reduces_per_step"]), out[rank]["all_reduces_per_step"]


def _assert_no_sync_reduced_nothing(config: str, in_no_sync: list[dict[str, int]]) -> None:
    """Inside no_sync() DDP all-reduces nothing. What it may launch there is
    its one-time bucket rebuild at the second iteration's forward: two
    broadcasts of the bucket order from rank 0, as over NCCL."""
    if config != "no_sync":
        return
    assert len(in_no_sync) == STEPS
    for step, seen in enumerate(in_no_sync):
        assert seen.get("allreduce", 0) == 0, f"step {step}: DDP all-reduced inside no_sync(): {seen}"
        rebuild = 2 if step == 1 else 0
        assert seen["launches"] == seen.get("broadcast", 0) == rebuild, f"step {step}: {seen}"


def _train_every_config(rank: int, world: int) -> dict[str, dict[str, Any]]:
    """Timing mode: every configuration in turn, in one process group."""
    return {config: _train(config, rank, world) for config in CONFIGS}


def test_every_config_runs_in_timing_mode() -> None:
    out = run_ranks(_train_every_config, mode="timing")
    for rank in (0, 1):
        for config, got in out[rank].items():
            # every step all-reduced, and the emulated collective engine ran each
            for launched, all_reduces in zip(got["launches_per_step"], got["all_reduces_per_step"], strict=True):
                assert launched >= all_reduces > 0, (rank, config, got["launches_per_step"], all_reduces)
            assert got["collective_launches"] == out[1 - rank][config]["collective_launches"], (rank, config)
            assert got["collective_busy_s"] > 0, (rank, config)
            # The collectives sit between the two events on the timeline:
            # the caller's stream waited for each bucket's all-reduce.
            assert got["elapsed_s"] >= got["collective_busy_s"], (rank, config, got)
            _assert_no_sync_reduced_nothing(config, got["in_no_sync"])


def _straggler(rank: int, world: int) -> dict[str, float]:
    """Timing mode: rank 1's host reaches an iteration late (a slow data
    loader), once rank 0's is through it. Rank 0's host goes through its
    backward, DDP's wait for the gradient all-reduce at its end and the
    optimizer step without waiting for rank 1, as over NCCL; its device
    waits, so a synchronize does."""
    from torch_emugpu import _C

    dev = torch.device("emugpu", rank)
    net = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=[rank])  # 4 MiB gradients: deferred
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    x = torch.randn(64, 1024, device=dev)

    def step() -> None:
        ddp(x).sum().backward()
        opt.step()
        opt.zero_grad()

    for _ in range(3):  # DDP rebuilds its buckets after the first iteration
        step()
    torch.emugpu.synchronize()
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        # Rank 1 steps only once rank 0's host is through its step: had that waited for rank 1, both would
        # hang until the store's timeout. An order host load cannot change, unlike a wall-clock bound.
        store.wait(["rank 0 stepped"])
    arrived = _C._host_now_ns()
    step()
    if rank == 0:
        store.set("rank 0 stepped", "1")
    torch.emugpu.synchronize()
    return {"arrived": arrived, "synchronized": _C._host_now_ns()}


def test_a_straggling_rank_does_not_block_the_others_hosts_at_the_end_of_backward() -> None:
    out = run_ranks(_straggler, mode="timing")
    assert out[0]["synchronized"] >= out[1]["arrived"], out  # the all-reduce ended after rank 1 joined


# A profile for _profiled_net() on a T4 at batch 4 (the fingerprint is its parameter count).
PROFILE_FORWARD_S, PROFILE_BACKWARD_S = 0.020, 0.040


def _profiled_net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))


def _write_net_profile(directory: Any) -> None:
    params = sum(p.numel() for p in _profiled_net().parameters())
    batches = [{"batch_size": 4, "forward_s": PROFILE_FORWARD_S, "backward_s": PROFILE_BACKWARD_S}]
    write_synthetic_profile(directory, "net", batches, params)


def _profiled_iterations(rank: int, world: int, hook: str | None = None) -> dict[str, Any]:
    """DDP over a model a profile times: the iteration time on the emulated
    clock (after DDP rebuilt its buckets), the backward region's report and the
    modelled time of the one bucket's all-reduce. DDP's Python allreduce_hook
    hands DDP a future chained with then(), not the Work's own future; the
    fp16 hook's callback also decompresses on the device first."""
    import torch_emugpu
    from torch_emugpu import _C

    dev = torch.device("emugpu", rank)
    ddp = torch.nn.parallel.DistributedDataParallel(_profiled_net().to(dev), device_ids=[rank])
    if hook is not None:
        ddp.register_comm_hook(
            None, {"python": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook}[hook]
        )
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    x = torch.randn(4, 1024).to(dev)
    events = []
    for _ in range(5):
        events.append(torch.emugpu.Event(enable_timing=True))
        events[-1].record()
        ddp(x).sum().backward()
        opt.step()
        opt.zero_grad()
    events.append(torch.emugpu.Event(enable_timing=True))
    events[-1].record()
    events[-1].synchronize()
    nbytes = sum(p.numel() * (2 if hook == "fp16" else p.element_size()) for p in ddp.parameters())
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    report = {r["key"]: r for r in torch_emugpu.region_report(rank)}
    return {
        "iteration_s": [a.elapsed_time(b) / 1e3 for a, b in zip(events[2:], events[3:], strict=False)],
        "backward": report["net@4:backward"],
        "all_reduce_s": _C._collective_time(
            "all_reduce", float(nbytes), torch.emugpu.get_device_name(dev), per_node, world // per_node, None, None
        )["seconds"],
    }


@pytest.mark.parametrize("network", ["nvlink", "slow", "slow_python_hook", "slow_fp16_hook"])
def test_a_profiled_model_under_ddp_takes_its_profile_plus_the_exposed_all_reduce(tmp_path, network: str) -> None:
    """A single-GPU profile measured no all-reduce: DDP's bucket all-reduces,
    launched from inside the backward, must not end its backward + update
    region early (its ops would fall back to the cost model), and the end of
    backward's wait for them adds only what the profiled GPU would still wait.
    One node (NVLink, the 4 MiB all-reduce hides in the backward), or two
    nodes over a 0.1 GB/s network (it does not)."""
    _write_net_profile(tmp_path)
    env = {"EMUGPU_GPU": "t4", "EMUGPU_PROFILE_PATH": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    if network.startswith("slow"):
        env.update(LOCAL_WORLD_SIZE="1", EMUGPU_NET_GBPS="0.1")
    hook = network.split("_")[1] if network.endswith("_hook") else None
    scenario = functools.partial(_profiled_iterations, hook=hook)
    # A region is host-bound when this host launched its ops later than the profiled GPU would run them:
    # other load on the machine, not the subject. Best of 3 runs.
    for _ in range(3):
        out = run_ranks(scenario, mode="timing", env=env)
        if all(out[rank]["backward"]["host_bound"] == 0 for rank in (0, 1)):
            break
    for rank in (0, 1):
        got = out[rank]
        backward = got["backward"]
        assert backward["host_bound"] == 0 and backward["cancelled"] == 0, (rank, backward)
        profiled = PROFILE_FORWARD_S + PROFILE_BACKWARD_S
        for t in got["iteration_s"]:
            if network == "nvlink":
                assert t == pytest.approx(profiled, rel=0.002), (rank, got)
            else:
                # The bucket is ready at the backward's end: nearly all of the all-reduce is exposed.
                assert got["all_reduce_s"] > 0.02, got
                assert profiled + 0.9 * got["all_reduce_s"] <= t <= profiled + got["all_reduce_s"] + 0.002, (rank, got)
        assert (backward["waited_s"] > 0) == (network != "nvlink"), (rank, backward)
