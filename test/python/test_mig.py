"""MIG: a GPU split into instances (EMUGPU_MIG, or emugpud --mig), each an
emulated device with its profile's SMs, memory and memory bandwidth, selected
as CUDA selects MIG devices (EMUGPU_VISIBLE_DEVICES; CUDA_VISIBLE_DEVICES in
run mode), refusing layouts the GPU cannot hold, and free of interference
between instances of one GPU.

Emulated times come from the virtual clock with the modelled host, so the
host's load cannot move them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from statistics import median

import pytest
import torch
from conftest import REPO
from test_daemon import TIMEOUT, Daemon, env, finish, first_line, holder
from test_daemon_sharing import run_together, start

import torch_emugpu

GIB = 2**30


@pytest.fixture
def mig(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """configure() with EMUGPU_MIG (and EMUGPU_VISIBLE_DEVICES) set; the default configuration after."""

    def make(layout: str, gpu: str = "h100", count: int = 1, visible: str | None = None, **kw: str) -> None:
        monkeypatch.setenv("EMUGPU_MIG", layout)
        if visible is None:
            monkeypatch.delenv("EMUGPU_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("EMUGPU_VISIBLE_DEVICES", visible)
        torch_emugpu.configure(gpu=gpu, device_count=count, **kw)

    yield make
    monkeypatch.delenv("EMUGPU_MIG", raising=False)
    monkeypatch.delenv("EMUGPU_VISIBLE_DEVICES", raising=False)
    torch_emugpu.configure(gpu=torch_emugpu._C.DEFAULT_GPU, device_count=2)


def test_a_process_sees_one_instance_with_its_profiles_resources(mig) -> None:
    mig("3g.40gb,1g.10gb")
    assert torch.emugpu.device_count() == 1  # as CUDA: one MIG device per process
    p = torch.emugpu.get_device_properties(0)
    assert p.name == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert (p.mig_profile, p.parent_name) == ("3g.40gb", "NVIDIA H100 80GB HBM3")
    assert p.multi_processor_count == 60
    assert p.total_memory / GIB == pytest.approx(39.5)
    assert p.uuid.startswith("MIG-") and len(p.uuid) == 40
    assert torch.emugpu.mem_get_info(0)[1] == p.total_memory


def test_visible_devices_select_an_instance_by_number_or_uuid(mig) -> None:
    mig("3g.40gb,1g.10gb", visible="0:1")
    small = torch.emugpu.get_device_properties(0)
    assert small.mig_profile == "1g.10gb" and small.multi_processor_count == 16
    mig("3g.40gb,1g.10gb", visible=small.uuid)
    assert torch.emugpu.get_device_properties(0).uuid == small.uuid
    mig("3g.40gb,1g.10gb", count=2, visible="1:1")  # the same profile on the second GPU: another instance
    other = torch.emugpu.get_device_properties(0)
    assert other.mig_profile == "1g.10gb" and other.uuid != small.uuid


def _busy_ms(fn) -> float:
    torch.emugpu.synchronize()
    torch.emugpu.reset_engine_stats()
    fn()
    torch.emugpu.synchronize()
    return float(torch.emugpu.engine_stats()["compute_busy_s"]) * 1e3


def _matmuls() -> None:
    a = torch.empty(8192, 8192, device="emugpu", dtype=torch.bfloat16)
    for _ in range(10):
        a @ a


def _streams() -> None:
    x = torch.empty(2**28, device="emugpu")  # 1 GiB: bandwidth-bound
    for _ in range(5):
        x + x


def test_an_instance_runs_at_the_rates_of_its_slices(mig) -> None:
    torch_emugpu.configure(gpu="h100", device_count=1, clock="virtual", host="modelled")
    whole = (_busy_ms(_matmuls), _busy_ms(_streams))
    mig("7g.80gb", clock="virtual", host="modelled")
    full = (_busy_ms(_matmuls), _busy_ms(_streams))
    mig("1g.10gb", clock="virtual", host="modelled")
    small = (_busy_ms(_matmuls), _busy_ms(_streams))
    assert full == pytest.approx(whole, rel=0.01)  # 7g: every SM and memory slice
    assert small[0] / full[0] == pytest.approx(132 / 16, rel=0.1)  # tensor cores: 16 of 132 SMs
    assert small[1] / full[1] == pytest.approx(8, rel=0.1)  # one of eight memory slices


def test_memory_beyond_the_instance_is_out_of_memory(mig) -> None:
    mig("1g.10gb")
    x = torch.empty(8 * GIB // 4, device="emugpu")
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(2 * GIB // 4, device="emugpu")
    del x


@pytest.mark.parametrize(
    ("gpu", "layout", "visible", "message"),
    [
        ("h100", "4g.40gb,4g.40gb", None, "does not fit on NVIDIA H100 80GB HBM3"),
        ("h100", "4g.40gb,4g.40gb", None, "4g.40gb,3g.40gb | "),
        ("h100", "1g.10gb,5g.50gb", None, "expected one of 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"),
        ("a100", "1g.10gb,,1g.10gb", None, "found an empty entry"),
        ("v100", "1g.5gb", None, "Tesla V100-SXM2-16GB has no MIG"),
        ("h100", "3g.40gb,3g.40gb", "0:2", "entry '0:2' names none of this node's devices"),
        ("h100", "3g.40gb,3g.40gb", "MIG-nothing", "0:1 or MIG-"),
    ],
)
def test_bad_layouts_and_selections_are_refused_listing_what_exists(
    mig, gpu: str, layout: str, visible: str | None, message: str
) -> None:
    with pytest.raises(ValueError) as e:
        mig(layout, gpu=gpu, visible=visible)
    assert message in str(e.value)


# --- through emugpud -----------------------------------------------------------------------------

# Times an iteration of 10 bf16 8192^3 matmuls on its device, after a line on stdin (so that
# jobs overlap), and prints the iteration times (ms, virtual clock) and the device it had.
JOB = """
import json, sys, time, torch, torch_emugpu
a = torch.empty(8192, 8192, device="emugpu", dtype=torch.bfloat16)
(a @ a).sum().item()
print("ready", flush=True)
sys.stdin.readline()
times = []
for _ in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    for _ in range(10):
        y = a @ a
    y.sum().item()
    times.append((time.perf_counter() - t0) * 1e3)
print(json.dumps({"times": times, "uuid": torch.emugpu.get_device_properties(0).uuid}), flush=True)
"""


def _job(address: str, visible: str, iters: int) -> subprocess.Popen:
    return start(address, iters, JOB, EMUGPU_VISIBLE_DEVICES=visible)


@pytest.fixture
def mig_daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path, gpus="h100:1", sharing="time-slice", mig="3g.40gb,3g.40gb")
    yield d
    if d.proc.poll() is None:
        d.stop()


@pytest.mark.slow
def test_instances_of_one_gpu_do_not_interfere_and_processes_on_one_instance_share_it(mig_daemon: Daemon) -> None:
    assert "split as MIG 3g.40gb,3g.40gb (2 instances)" in mig_daemon.banner
    alone = median(run_together([_job(mig_daemon.address, "0:0", 6)])[0]["times"])
    apart = run_together([_job(mig_daemon.address, "0:0", 20), _job(mig_daemon.address, "0:1", 20)])
    assert apart[0]["uuid"] != apart[1]["uuid"]
    for r in apart:
        assert median(r["times"]) == pytest.approx(alone, rel=0.001)
    shared = run_together([_job(mig_daemon.address, "0:1", 20), _job(mig_daemon.address, "0:1", 20)])
    for r in shared:  # time slices on one instance: half each, less the context switches
        assert median(r["times"]) == pytest.approx(2 * alone * 2200 / 2000, rel=0.02)


@pytest.mark.slow
def test_each_instance_has_its_own_memory_and_smi_lists_the_instances(mig_daemon: Daemon) -> None:
    a = holder(mig_daemon.address, 30, EMUGPU_VISIBLE_DEVICES="0:0")
    assert first_line(a).startswith("holding")
    b = holder(mig_daemon.address, 30, EMUGPU_VISIBLE_DEVICES="0:1")
    assert first_line(b).startswith("holding")  # the other instance's 30 GiB do not count
    c = holder(mig_daemon.address, 12, EMUGPU_VISIBLE_DEVICES="0:0")
    refused = first_line(c)
    assert refused.startswith("oom"), refused
    finish(c)
    s = mig_daemon.status()
    assert [(g["gpu"], g["instance"], g["mig_profile"]) for g in s["gpus"]] == [(0, 0, "3g.40gb"), (0, 1, "3g.40gb")]
    assert [round(g["used"] / GIB) for g in s["gpus"]] == [30, 30]
    cli = [sys.executable, "-m", "torch_emugpu.cli", "smi", "--address", mig_daemon.address]
    table = subprocess.run(cli, capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO)
    assert table.returncode == 0, table.stderr
    assert "0:1  NVIDIA H100 80GB HBM3 MIG 3g.40gb" in table.stdout
    assert s["gpus"][1]["uuid"] in table.stdout
    csv = subprocess.run(
        [*cli, "--query-gpu", "index,uuid,memory.used", "--format", "csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=REPO,
    )
    assert csv.stdout.splitlines()[1] == f"0:1, {s['gpus'][1]['uuid']}, 30720"
    finish(a)
    finish(b)


@pytest.mark.slow
def test_run_mode_selects_a_daemons_instance_by_cuda_visible_devices(mig_daemon: Daemon) -> None:
    uuid = mig_daemon.status()["gpus"][1]["uuid"]
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch; p = torch.cuda.get_device_properties(0); "
            "print(torch.cuda.device_count(), p.uuid, p.multi_processor_count)",
        ],
        env=env(mig_daemon.address, EMUGPU_AS_CUDA="1", CUDA_VISIBLE_DEVICES=uuid),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", uuid, "60"]


@pytest.mark.slow
def test_emugpu_mig_is_refused_under_a_daemon(tmp_path: Path) -> None:
    d = Daemon(tmp_path, gpus="h100:1")
    try:
        r = subprocess.run(
            [sys.executable, "-c", "import torch, torch_emugpu; torch.empty(1, device='emugpu')"],
            env=env(d.address, EMUGPU_MIG="1g.10gb"),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            cwd=REPO,
        )
        assert r.returncode != 0
        assert "start the daemon with --mig 1g.10gb" in r.stderr
    finally:
        d.stop()
