"""nn.DataParallel over emulated GPUs: replicas on every device, values as on
one device, peer copies charged over the GPU's link and ordered between the
devices' streams; a profile's N-GPU table times the whole step."""

from __future__ import annotations

import statistics
import warnings
from pathlib import Path

import pytest
import torch
from conftest import profile_search_dir, run_python, write_synthetic_profile

import torch_emugpu
from torch_emugpu.distributed import _parallel
from torch_emugpu.timing import profiles

pytestmark = pytest.mark.slow  # multi-process runs: scripts/test.sh --fast leaves them out


@pytest.fixture
def compute_mode():
    torch_emugpu.configure(mode="compute")
    yield
    torch_emugpu.configure(mode="timing")


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def test_data_parallel_matches_one_device(compute_mode):
    x = torch.randn(8, 16)
    reference = small_model()
    reference(x).square().sum().backward()

    model = small_model().to("emugpu")
    dp = torch.nn.DataParallel(model, device_ids=[0, 1])
    out = dp(x.to("emugpu"))
    assert out.device == torch.device("emugpu:0") and out.shape == (8, 4)
    torch.testing.assert_close(out.cpu(), reference(x))
    out.square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad)


def test_replicas_charge_their_own_devices():
    dp = torch.nn.DataParallel(small_model().to("emugpu"), device_ids=[0, 1])
    torch.emugpu.synchronize(1)
    torch.emugpu.reset_engine_stats(1)
    dp(torch.randn(8, 16).to("emugpu"))
    torch.emugpu.synchronize(1)
    assert torch.emugpu.engine_stats(1)["compute_launches"] >= 3  # broadcast, two linears, ...


def forward_time(module: torch.nn.Module, x: torch.Tensor) -> float:
    start, end = torch.emugpu.Event(enable_timing=True), torch.emugpu.Event(enable_timing=True)
    with torch.no_grad():
        module(x)  # shapes and replicas warm
        torch.emugpu.synchronize(0)
        torch.emugpu.synchronize(1)
        start.record()
        module(x)
        end.record()
    end.synchronize()
    return start.elapsed_time(end)


def test_replicas_run_in_parallel_on_the_emulated_clock():
    # Built on the device: its weights are computed placeholders, so the
    # broadcast moves no real bytes on the host (as after a training step).
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, device="emugpu") for _ in range(4)])
    x = torch.empty(8192, 4096, device="emugpu")
    one = forward_time(model, x)
    two = forward_time(torch.nn.DataParallel(model, device_ids=[0, 1]), x)
    # Half the batch per device, plus the weight broadcast and the gather; the
    # gather waits for device 1, so it cannot be less than half.
    assert 0.5 * one < two < 0.75 * one


def test_peer_copy_waits_for_the_source_and_takes_the_link_time():
    big = torch.empty(8192, 8192, device="emugpu:1")
    payload = torch.empty(256, 1024, 1024, device="emugpu:1")  # 1 GiB
    torch.emugpu.synchronize(0)
    torch.emugpu.synchronize(1)
    start, end = torch.emugpu.Event(enable_timing=True), torch.emugpu.Event(enable_timing=True)
    with torch.emugpu.device(1):
        matmul_start = torch.emugpu.Event(enable_timing=True)
        matmul_end = torch.emugpu.Event(enable_timing=True)
        matmul_start.record()
        big @ big
        matmul_end.record()
    start.record()  # on device 0
    payload.to("emugpu:0")
    end.record()
    end.synchronize()
    matmul_ms = matmul_start.elapsed_time(matmul_end)
    link = torch.emugpu.get_device_properties(0)
    assert matmul_ms > 10
    copy_ms = 2**30 / (300e9) * 1e3  # A100-SXM4's NVLink: 300 GB/s per direction
    assert link.name.startswith("NVIDIA A100-SXM4")
    assert start.elapsed_time(end) == pytest.approx(matmul_ms + copy_ms, rel=0.05)


def test_broadcast_coalesced_keeps_order_values_and_dtypes(compute_mode):
    from torch.nn.parallel import comm

    tensors = [torch.arange(5.0), torch.arange(3), torch.ones(2, 2, dtype=torch.float16), torch.tensor(7.0)]
    emu = [t.to("emugpu") for t in tensors]
    out = comm.broadcast_coalesced(emu, [0, 1], buffer_size=16)
    assert [t is e for t, e in zip(out[0], emu, strict=True)] == [True] * 4  # the source keeps its own
    for got, want in zip(out[1], tensors, strict=True):
        assert got.device == torch.device("emugpu:1") and got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)


def test_scatter_and_gather_through_the_host(compute_mode):
    from torch.nn.parallel import comm

    x = torch.arange(12.0).view(6, 2)
    parts = comm.scatter(x, [0, 1], chunk_sizes=[2, 4])
    assert [p.device.index for p in parts] == [0, 1] and [p.shape[0] for p in parts] == [2, 4]
    back = comm.gather(parts, dim=0, destination=-1)
    assert back.device.type == "cpu"
    torch.testing.assert_close(back, x)
    with pytest.raises(ValueError, match="add up to 5"):
        comm.scatter(x, [0, 1], chunk_sizes=[2, 3])
    with pytest.raises(ValueError, match=r"one chunk size per device \(2\), got 3"):
        comm.scatter(x, [0, 1], chunk_sizes=[2, 2, 2])


def test_a_batch_smaller_than_the_devices_fills_the_first_ones(compute_mode):
    from torch.nn.parallel import comm

    assert [p.device.index for p in comm.scatter(torch.arange(3.0), [0, 1, 0, 1])] == [0, 1, 0]  # chunks of 1
    x = torch.randn(1, 16)
    model = small_model()
    out = torch.nn.DataParallel(small_model().to("emugpu"), device_ids=[0, 1])(x.to("emugpu"))
    torch.testing.assert_close(out.cpu(), model(x))


def test_cuda_tensors_keep_pytorchs_own_functions():
    from torch.nn.parallel import comm

    with pytest.raises(RuntimeError):  # no CUDA here: PyTorch's implementation ran and refused
        comm.broadcast_coalesced([torch.ones(2)], [0, 1])


def test_scripts_exit_cleanly_after_data_parallel_backward():
    # Autograd's device threads may release a finished graph task (and the
    # Python objects it holds) while the interpreter finalizes; the package
    # flushes them at exit. Several runs, since it is a race.
    code = (
        "import torch, torch_emugpu\n"
        "m = torch.nn.DataParallel(torch.nn.Linear(16, 4).to('emugpu'))\n"
        "m(torch.randn(8, 16).to('emugpu')).sum().backward()\n"
    )
    for _ in range(3):
        r = run_python(code, env={"EMUGPU_DEVICE_COUNT": "2"})
        assert r.returncode == 0 and "terminate called" not in r.stderr, r.stderr[-2000:]


# --- a profile's N-GPU table times the DataParallel step ------------------------------

# Synthetic timings (seconds) at batch sizes 16 and 32: on one GPU, and on two.
ONE_GPU = [
    {"batch_size": 16, "forward_s": 0.040, "backward_s": 0.080},
    {"batch_size": 32, "forward_s": 0.070, "backward_s": 0.140},
]
TWO_GPUS = [
    {"batch_size": 16, "forward_s": 0.030, "backward_s": 0.060},
    {"batch_size": 32, "forward_s": 0.045, "backward_s": 0.095},
]


def write_profile(directory: Path, model: str, parameters: int | None, data_parallel: bool) -> Path:
    extra = {"data_parallel": [{"gpu_count": 2, "batches": TWO_GPUS}]} if data_parallel else {}
    return write_synthetic_profile(directory, model, ONE_GPU, parameters, **extra)


@pytest.fixture
def profile_dir(tmp_path, monkeypatch):
    """An EMUGPU_PROFILE_PATH directory and an empty user directory; two T4s (PCIe, no NVLink)."""
    with profile_search_dir(tmp_path, monkeypatch, device_count=2) as directory:
        yield directory


def step_times(
    net: torch.nn.Module, model: torch.nn.Module, batch: int, iterations: int = 6, warmup: int = 2
) -> list[float]:
    """Seconds per training iteration (forward, loss, backward, SGD step) on
    device 0's emulated clock, after `warmup` iterations."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.empty(batch, 16, device="emugpu")
    y = torch.zeros(batch, dtype=torch.long, device="emugpu")
    times = []
    for i in range(warmup + iterations):
        start, end = torch.emugpu.Event(enable_timing=True), torch.emugpu.Event(enable_timing=True)
        start.record()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end) / 1e3)
    return times


def test_data_parallel_step_takes_the_n_gpu_tables_time(profile_dir, virtual_clock):
    model = small_model().to("emugpu")
    write_profile(profile_dir, "mlp", sum(p.numel() for p in model.parameters()), data_parallel=True)
    profiles.reload()
    dp = torch.nn.DataParallel(model, device_ids=[0, 1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        measured = statistics.median(step_times(dp, model, batch=32))
    # Exact on the virtual clock, but for the (modelled) host's time before the forward.
    assert measured == pytest.approx(0.045 + 0.095, rel=0.002)
    assert measured < 0.8 * (0.070 + 0.140)  # not the 1-GPU table's time
    assert not [w for w in caught if "no 2-GPU table" in str(w.message)]
    for device in (0, 1):  # the replica's device budgets its work within the same step
        report = {r["key"]: r for r in torch_emugpu.region_report(device)}
        forward, backward = report["mlp@32:dp2:forward"], report["mlp@32:dp2:backward"]
        assert forward["gpu_count"] == 2 and forward["devices"] == [0, 1]
        assert forward["last_s"] == pytest.approx(0.045, rel=1e-6)
        assert backward["last_s"] == pytest.approx(0.095, rel=1e-6)
        # Only the first iteration may be host-bound: its host work computes the shape rules.
        assert forward["host_bound"] <= 1 and backward["host_bound"] <= 1
    # An unprofiled batch size reads the same table, along the cost model's curve after its first
    # occurrence (test_batch_curve.py); a forward alone takes its forward time.
    between = statistics.median(step_times(dp, model, batch=24, iterations=3))
    report = {r["key"]: r for r in torch_emugpu.region_report(0)}
    forward, backward = report["mlp@24:dp2:forward"], report["mlp@24:dp2:backward"]
    assert forward["target_from"] == "cost-model curve" and forward["between"] == [16, 32]
    assert 0.030 < forward["target_s"] < 0.045 and 0.060 < backward["target_s"] < 0.095
    assert between == pytest.approx(forward["target_s"] + backward["target_s"], rel=0.002)
    with torch.no_grad():
        assert forward_time(dp, torch.empty(32, 16, device="emugpu")) / 1e3 == pytest.approx(0.045, rel=0.002)


def test_without_an_n_gpu_table_data_parallel_keeps_the_one_gpu_time_and_says_so(profile_dir, virtual_clock):
    write_profile(profile_dir, "my_mlp", None, data_parallel=False)
    profiles.reload()
    model = torch_emugpu.use_profile(small_model().to("emugpu"), "my_mlp")  # named before it is wrapped
    dp = torch.nn.DataParallel(model, device_ids=[0, 1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        measured = statistics.median(step_times(dp, model, batch=32))
    notes = [str(w.message) for w in caught if "no 2-GPU table" in str(w.message)]
    assert len(notes) == 1 and "takes the 1-GPU time of its whole batch (32) on device 0" in notes[0]
    assert measured == pytest.approx(0.070 + 0.140, rel=0.002)
    report = {r["key"]: r for r in torch_emugpu.region_report(0)}
    assert report["my_mlp@32:forward"]["gpu_count"] == 1
    assert "without a 2-GPU table" in report["my_mlp@32:backward"]["note"]
    assert not any(r["key"].startswith("my_mlp") for r in torch_emugpu.region_report(1))


def test_the_batch_decides_how_many_devices_a_step_uses():
    dp = torch.nn.DataParallel(small_model().to("emugpu"), device_ids=[0, 1])
    assert _parallel.data_parallel_span(dp, 1) is None  # one chunk: one replica
    span = _parallel.data_parallel_span(dp, 3)
    assert (span.gpu_count, span.primary, span.others) == (2, 0, (1,))
    assert _parallel.data_parallel_span(small_model().to("emugpu"), 8) is None
