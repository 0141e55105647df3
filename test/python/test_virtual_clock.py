"""The virtual clock: waits jump instead of sleeping, Python's clocks read
emulated time, and the modelled host makes emulated times exact."""

from __future__ import annotations

import datetime
import json
import math
import os
import select
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import REPO, child_env, run_python

import torch_emugpu

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def virtual() -> Iterator[None]:
    torch_emugpu.configure(gpu=H100, clock="virtual", host="modelled")
    try:
        yield
    finally:
        torch_emugpu.configure(gpu=torch_emugpu._C.DEFAULT_GPU, clock="real", host="measured", host_speed=1.0)


def gpu_bound_loop(iterations: int) -> list[float]:
    """Per-iteration times in seconds (from time.perf_counter_ns, exact) of a loop whose matmuls keep the GPU
    busier than the host."""
    w = torch.empty(8192, 8192, device="emugpu")
    x = torch.empty(8192, 8192, device="emugpu")
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter_ns()
        for _ in range(4):
            y = x @ w
        y.sum().item()
        times.append((time.perf_counter_ns() - t0) / 1e9)
    return times


def test_a_gpu_bound_loop_takes_exactly_its_device_time(virtual: None) -> None:
    gpu_bound_loop(2)
    torch.emugpu.reset_engine_stats()
    times = gpu_bound_loop(5)
    busy = torch.emugpu.engine_stats()["compute_busy_s"] / 5
    # Each iteration waits for its own work: its time is the device's, to the nanosecond (no host load moves it).
    assert times[1:] == [times[1]] * 4
    # ... plus what the device cannot hide: the first launch after the wait (22.2 us) and the read-back.
    assert busy < times[1] < busy + 50e-6
    assert busy > 0.01  # four 8192^3 matmuls: the device, not the modelled host (22.2 us per op), sets the pace


def test_modelled_times_are_the_same_on_every_run(virtual: None) -> None:
    first = gpu_bound_loop(3)
    torch_emugpu.configure(clock="virtual", host="modelled")  # a fresh device timeline; the clock goes on
    second = gpu_bound_loop(3)
    assert first == second


def test_the_emulator_is_faster_than_the_gpu_it_emulates(virtual: None) -> None:
    gpu_bound_loop(1)
    torch.emugpu.reset_engine_stats()
    gpu_bound_loop(10)
    report = torch_emugpu.clock_report()
    assert report["clock"] == "virtual" and report["host"] == "modelled"
    assert report["elapsed_s"] == pytest.approx(report["host_s"] + report["waited_s"] + report["slept_s"])
    assert report["elapsed_s"] > 10 * 0.08  # ten iterations of four 8192^3 matmuls on an H100
    assert report["speedup"] == pytest.approx(report["elapsed_s"] / report["wall_s"], rel=0.01)
    assert torch.emugpu.engine_stats()["emulated_s_per_wall_s"] > 0


def test_a_host_slower_than_the_gpu_sets_the_pace(virtual: None) -> None:
    torch_emugpu.configure(clock="virtual", host="modelled", host_speed=0.001)  # a host 1000x slower: 22.2 ms per op
    x = torch.empty(16, device="emugpu")
    x.sum().item()
    torch_emugpu.reset_clock_report()
    t0 = time.perf_counter_ns()
    for _ in range(10):
        x = x + 1
    x.sum().item()
    elapsed = (time.perf_counter_ns() - t0) / 1e9
    report = torch_emugpu.clock_report()
    assert report["waited_s"] < 20e-6  # the device finished each op before the host launched the next; the read-back
    assert report["calls"] == 12  # 10 adds (each with its output's allocation), the sum, the read-back
    # All of it host work and the read-back's wait, but for the first clock read's own cost (1 ms), charged before it
    assert elapsed == pytest.approx(report["host_s"] - 0.001 + report["waited_s"], abs=1e-9)
    op_s = report["op_us"] * 1e-6 / 0.001
    assert report["host_s"] == pytest.approx(report["calls"] * op_s + report["reads"] * 0.001, abs=1e-9)


def test_the_modelled_host_charges_per_op_as_the_h100_host_measured(virtual: None) -> None:
    report = torch_emugpu.clock_report()
    # benchmarks/data/h100/host_cost.json: a module's forward op, autograd's op, AdamW's foreach share per parameter
    assert (report["op_us"], report["backward_op_us"], report["list_tensor_us"]) == (22.2, 22.7, 2.24)
    x = torch.randn(16, device="emugpu", requires_grad=True)
    y = x
    for _ in range(6):
        y = torch.tanh(y)
    torch_emugpu.reset_clock_report()
    (g,) = torch.autograd.grad(y, x, grad_outputs=torch.ones_like(y))  # ones_like: one forward op
    report = torch_emugpu.clock_report()
    assert report["calls"] == 1 + 6  # each tanh_backward with the allocation of its output: one op
    assert report["host_s"] == pytest.approx((22.2 + 6 * 22.7) * 1e-6, abs=1e-12)
    params = [torch.zeros(4, device="emugpu") for _ in range(5)]
    torch_emugpu.reset_clock_report()
    torch._foreach_add_(params, 1.0)  # one op over five tensors: a CUDA host's work grows with the list
    report = torch_emugpu.clock_report()
    assert report["calls"] == 1
    assert report["host_s"] == pytest.approx((22.2 + 4 * 2.24) * 1e-6, abs=1e-12)


def test_sleep_advances_time_without_sleeping(virtual: None) -> None:
    t0, d0, w0 = time.perf_counter(), datetime.datetime.now(), time.time()
    time.sleep(3600)
    assert time.perf_counter() - t0 == pytest.approx(3600, abs=1e-3)
    assert time.time() - w0 == pytest.approx(3600, abs=1e-3)
    assert (datetime.datetime.now() - d0).total_seconds() == pytest.approx(3600, abs=1e-3)
    assert torch_emugpu.clock_report()["slept_s"] >= 3600
    made_by_the_real_class = torch_emugpu.device._virtual_time._original_datetime(2020, 1, 1)
    assert isinstance(made_by_the_real_class, datetime.datetime)  # libraries' isinstance checks still hold
    assert isinstance(datetime.datetime.now(), datetime.datetime) and isinstance(d0, datetime.date)


@pytest.mark.parametrize(
    ("seconds", "error", "message"),
    [
        (-1, ValueError, "sleep length must be non-negative"),
        (math.nan, ValueError, "Invalid value NaN"),
        (1e300, OverflowError, "out of range"),
        ("1", TypeError, "cannot be interpreted as an integer"),
    ],
)
def test_sleep_refuses_what_cpython_refuses(virtual: None, seconds: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        time.sleep(seconds)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):  # the same as CPython's own
        torch_emugpu.device._virtual_time._originals["sleep"](seconds)


def test_a_script_spinning_until_a_deadline_gets_there(virtual: None) -> None:
    deadline = time.time() + 0.05
    spins = 0
    while time.time() < deadline:
        spins += 1
        assert spins < 10_000_000
    assert spins >= 1000  # 1 us per read of the modelled host


def test_names_bound_before_are_rebound_but_the_runtimes_timeouts_stay_real(virtual: None) -> None:
    torch_emugpu.configure(clock="real")
    module = types.ModuleType("bound_before")
    module.perf_counter = time.perf_counter  # as `from time import perf_counter` (tqdm does)
    sys.modules["bound_before"] = module
    try:
        torch_emugpu.configure(clock="virtual", host="modelled")
        assert module.perf_counter is time.perf_counter
        assert module.perf_counter is not torch_emugpu.device._virtual_time._originals["perf_counter"]
        assert threading._time is torch_emugpu.device._virtual_time._originals["monotonic"]  # type: ignore[attr-defined]
        torch_emugpu.configure(clock="real")
        assert module.perf_counter is time.perf_counter
        assert time.perf_counter.__module__ == "time"  # the builtin again
    finally:
        del sys.modules["bound_before"]


def test_the_real_clock_gives_pythons_clocks_back(virtual: None) -> None:
    assert time.perf_counter.__module__ != "time"
    torch_emugpu.configure(clock="real")
    assert time.perf_counter.__module__ == "time" and datetime.datetime.__module__ == "datetime"
    assert torch_emugpu.clock_report() == {"clock": "real"}
    assert torch_emugpu.config().clock == "real"


def test_datetimes_pickle_and_unpickle_as_datetime(virtual: None) -> None:
    import pickle
    from multiprocessing.reduction import ForkingPickler

    real_class = type(datetime.datetime.now())  # now() makes the real class's datetimes
    values = [
        datetime.datetime.now(),
        datetime.datetime(2020, 5, 6, tzinfo=datetime.timezone.utc),
        real_class(1999, 1, 1),
    ]
    for value in values:
        for dumped in (pickle.dumps(value), bytes(ForkingPickler.dumps(value))):
            back = pickle.loads(dumped)
            assert back == value and isinstance(back, datetime.datetime)
    dumped = pickle.dumps(values)
    torch_emugpu.configure(clock="real")
    assert pickle.loads(dumped) == values  # and a process on the real clock reads them


def test_unknown_clock_and_host_values_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="clock: expected one of real, virtual, got 'simulated'"):
        torch_emugpu.configure(clock="simulated")
    with pytest.raises(ValueError, match="host: expected one of measured, modelled, got 'guess'"):
        torch_emugpu.configure(host="guess")
    with pytest.raises(ValueError, match="host_speed"):
        torch_emugpu.configure(host_speed=0)
    with pytest.raises(TypeError, match="configure\\(clock=...\\)"):
        torch_emugpu.configure(clock=1)  # type: ignore[arg-type]
    assert torch_emugpu.config().clock == "real"


@pytest.mark.slow
def test_the_environment_starts_the_virtual_clock_at_import() -> None:
    code = (
        "import time, torch, torch_emugpu\n"
        "x = torch.empty(8192, 8192, device='emugpu')\n"
        "t0 = time.perf_counter_ns()\n"
        "for _ in range(20): y = x @ x\n"
        "y.sum().item()\n"
        "print(torch_emugpu.config().clock, torch_emugpu.config().host, time.perf_counter_ns() - t0)\n"
    )
    env = {"EMUGPU_CLOCK": "virtual", "EMUGPU_HOST": "modelled", "EMUGPU_GPU": "h100"}
    runs = [run_python(code, env) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert runs[0].stdout.split()[:2] == ["virtual", "modelled"]
    assert runs[0].stdout == runs[1].stdout  # bit-identical across processes
    bad = run_python("import torch, torch_emugpu; torch.ones(1, device='emugpu')", {"EMUGPU_CLOCK": "sundial"})
    assert bad.returncode != 0
    assert "EMUGPU_CLOCK: expected one of real, virtual, got 'sundial'" in bad.stderr


RANK_CODE = """
import datetime, os, time, torch, torch_emugpu, torch.distributed as dist
rank = int(os.environ["RANK"])
torch.emugpu.set_device(rank)
try:
    dist.init_process_group("emu", timeout=datetime.timedelta(seconds=60))
except ValueError as e:
    print("refused:", e)
    raise SystemExit(0)
x = torch.empty(25 << 20, device="emugpu")
dist.all_reduce(x)
torch.emugpu.synchronize()
t0 = time.perf_counter_ns()
if rank == 1:
    time.sleep(2.0)  # this rank's host arrives 2 s later (virtual time; nothing sleeps)
dist.all_reduce(x)
torch.emugpu.synchronize()
print("ok", time.perf_counter_ns() - t0)
dist.destroy_process_group()
"""


def run_two_ranks(clocks: tuple[str, str]) -> list[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank, clock in enumerate(clocks):
        env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
        env.update(
            RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), EMUGPU_DEVICE_COUNT="2",
            EMUGPU_CLOCK=clock, EMUGPU_HOST="modelled", EMUGPU_GPU="h100",
        )  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK_CODE],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        outs.append(out.strip().splitlines()[-1])
    return outs


@pytest.mark.slow
def test_ranks_with_different_clocks_are_refused_naming_both() -> None:
    outs = run_two_ranks(("virtual", "real"))
    assert "refused: emu backend: rank 0 runs the virtual clock but rank 1 the real one" in outs[0], outs
    assert "refused: emu backend: rank 1 runs the real clock but rank 0 the virtual one" in outs[1], outs


@pytest.mark.slow
def test_a_collective_waits_for_the_latest_ranks_virtual_start() -> None:
    outs = run_two_ranks(("virtual", "virtual"))
    assert all(o.startswith("ok ") for o in outs), outs
    elapsed = [int(o.split()[1]) / 1e9 for o in outs]
    # Rank 0 waited for rank 1's late start: both end together, 2 s and the all_reduce's cost after rank 0's start.
    assert elapsed[0] == pytest.approx(elapsed[1], abs=1e-3)
    assert 2.0 < elapsed[0] < 2.5


class SleepyDataset(torch.utils.data.Dataset):
    """Each sample takes `seconds` of its worker's time (time.sleep: virtual in the worker too)."""

    def __init__(self, seconds: float, samples: int = 16) -> None:
        self.seconds, self.samples = seconds, samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.seconds)
        return torch.ones(4)


def epoch_time(loader: torch.utils.data.DataLoader) -> float:
    t0 = time.perf_counter_ns()
    for batch in loader:
        batch.to("emugpu").sum().item()
    return (time.perf_counter_ns() - t0) / 1e9


def test_slow_workers_hold_the_loop_back_as_processes_in_parallel(virtual: None) -> None:
    loader = torch.utils.data.DataLoader(SleepyDataset(0.1), batch_size=2, num_workers=2, pin_memory=True)
    # 16 samples of 0.1 s over 2 workers: the loop waits 0.8 s for its data, not 1.6 s, and not 0.
    assert epoch_time(loader) == pytest.approx(0.8, abs=0.01)


def test_fast_workers_do_not_stall_the_loop(virtual: None) -> None:
    loader = torch.utils.data.DataLoader(SleepyDataset(0.0), batch_size=2, num_workers=2)
    assert epoch_time(loader) < 0.01


class StorageBoundDataset(torch.utils.data.Dataset):
    """Each sample waits `seconds` of real time off the CPU, as a read from slow storage does."""

    def __init__(self, seconds: float, samples: int = 16) -> None:
        self.seconds, self.samples = seconds, samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> torch.Tensor:
        select.select([], [], [], self.seconds)  # blocks in real time: neither CPU time nor a clock read
        return torch.ones(4)


@pytest.mark.parametrize("host", ["measured", "modelled"])
def test_a_workers_storage_waits_count_with_the_measured_host(host: str) -> None:
    torch_emugpu.configure(gpu=H100, clock="virtual", host=host)
    try:
        loader = torch.utils.data.DataLoader(StorageBoundDataset(0.05), batch_size=2, num_workers=2)
        seconds = epoch_time(loader)
    finally:
        torch_emugpu.configure(gpu=torch_emugpu._C.DEFAULT_GPU, clock="real", host="measured", host_speed=1.0)
    if host == "measured":
        # 16 waits of 50 ms over 2 workers: at least 0.4 s (their CPU time alone is a few ms).
        assert 0.4 <= seconds < 3.0
    else:
        assert seconds < 0.01  # the modelled host counts none of this machine's time


def burn_cpu_at_start(worker_id: int) -> None:
    """A worker's set-up that takes 0.2 s of its CPU (time.thread_time is the thread's own CPU clock)."""
    start = time.thread_time()
    while time.thread_time() - start < 0.2:
        pass


def test_a_forked_workers_set_up_counts_with_the_measured_host() -> None:
    torch_emugpu.configure(gpu=H100, clock="virtual", host="measured")
    try:
        loader = torch.utils.data.DataLoader(
            SleepyDataset(0.0, samples=2), batch_size=2, num_workers=1, worker_init_fn=burn_cpu_at_start
        )
        seconds = epoch_time(loader)
    finally:
        torch_emugpu.configure(gpu=torch_emugpu._C.DEFAULT_GPU, clock="real", host="measured", host_speed=1.0)
    # The worker's CPU from the fork to its first batch is its own work, as it would delay the batch.
    assert 0.2 <= seconds < 3.0


@pytest.mark.slow
def test_a_worker_on_another_clock_is_refused_naming_both(virtual: None) -> None:
    # A spawned worker reads the environment (no EMUGPU_CLOCK): the real clock, while this process runs the virtual one.
    loader = torch.utils.data.DataLoader(
        SleepyDataset(0.0, samples=2), batch_size=2, num_workers=1, multiprocessing_context="spawn"
    )
    with pytest.raises(RuntimeError, match="worker 0 runs the real clock but this process the virtual one"):
        epoch_time(loader)


# --- tensors shared between processes ------------------------------------------

SPAWN = mp.get_context("spawn")


def receive_a_tensor(inbox: object, outbox: object) -> None:
    """Reports its virtual time before and after it opens a tensor and the tensor's values, or the error."""
    import torch_emugpu

    before = torch_emugpu._C._clock_read_ns()
    try:
        x = inbox.get(timeout=60)  # type: ignore[attr-defined]
        outbox.put(("ok", before, torch_emugpu._C._clock_read_ns(), x.cpu().tolist()))  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001  (reported to the test)
        outbox.put((type(e).__name__, str(e), 0, []))  # type: ignore[attr-defined]


def send_to_a_child(x: torch.Tensor, **env: str) -> tuple[int, tuple]:
    """Sends `x` to a spawned receive_a_tensor; returns this process's virtual time at sending and the report."""
    inbox, outbox = SPAWN.Queue(), SPAWN.Queue()
    with child_env(EMUGPU_HOST="modelled", **env):
        p = SPAWN.Process(target=receive_a_tensor, args=(inbox, outbox), daemon=True)
        p.start()
    sent = torch_emugpu._C._clock_read_ns() if torch_emugpu.config().clock == "virtual" else -1
    inbox.put(x)
    report = outbox.get(timeout=120)
    p.join(60)
    assert p.exitcode == 0
    return sent, report


@pytest.mark.slow
def test_a_shared_tensor_moves_the_receivers_clock_to_its_send_time(virtual: None) -> None:
    x = torch.arange(4.0).to("emugpu")
    time.sleep(1000.0)  # virtual: the sender is far ahead of a process that has just started
    sent, (kind, before, after, values) = send_to_a_child(x, EMUGPU_CLOCK="virtual")
    assert kind == "ok", before
    assert before < sent - 900e9  # the receiver started behind
    assert after >= sent  # and acts on the tensor no earlier than it was sent
    assert values == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.slow
@pytest.mark.parametrize("sender", ["virtual", "real"])
def test_processes_on_different_clocks_cannot_share_tensors(sender: str) -> None:
    receiver = "real" if sender == "virtual" else "virtual"
    torch_emugpu.configure(clock=sender, host="modelled")
    try:
        _, (kind, message, _, _) = send_to_a_child(torch.arange(4.0).to("emugpu"), EMUGPU_CLOCK=receiver)
    finally:
        torch.emugpu.synchronize()
        torch_emugpu.configure(clock="real", host="measured")
    assert kind == "RuntimeError", message
    assert f"from a process on the {sender} clock" in message and f"runs the {receiver} clock" in message, message
    assert "EMUGPU_CLOCK" in message


def test_a_host_cost_file_prices_the_modelled_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    measured = tmp_path / "host_cost.json"  # as `python -m torch_emugpu.measure.host_cost --out` writes it
    measured.write_text(
        json.dumps({"module_op_us": 40, "autograd_op_us": 50, "optimizer_param_us": 30, "view_op_us": 3, "cpu": "x"})
    )
    monkeypatch.setenv("EMUGPU_HOST_COST", str(measured))
    try:
        torch_emugpu.configure(gpu=H100, clock="virtual", host="modelled")
        report = torch_emugpu.clock_report()
        # per list tensor: (30 us * 100 / 8 - 40 us) / 99, what the probe's AdamW step leaves after its 8 ops
        assert (report["op_us"], report["backward_op_us"], report["list_tensor_us"]) == (40.0, 50.0, 3.384)
        assert torch_emugpu.config().host_cost_file == str(measured)
        x = torch.zeros(4, device="emugpu")
        torch_emugpu.reset_clock_report()
        x = x + 1
        assert torch_emugpu.clock_report()["host_s"] == pytest.approx(40e-6, abs=1e-12)
        del x  # configure() refuses while emugpu tensors live
        measured.write_text(json.dumps({"module_op_us": "fast"}))
        with pytest.raises(ValueError, match=r"host cost file .*host_cost.json: field 'module_op_us'.*got \"fast\""):
            torch_emugpu.configure(gpu=H100, clock="virtual", host="modelled")
        with pytest.raises(ValueError, match="EMUGPU_HOST_COST prices the modelled host of the virtual clock"):
            torch_emugpu.configure(gpu=H100, clock="virtual", host="measured")
    finally:
        monkeypatch.delenv("EMUGPU_HOST_COST")
        torch_emugpu.configure(gpu=torch_emugpu._C.DEFAULT_GPU, clock="real", host="measured", host_speed=1.0)
