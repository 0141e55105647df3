"""MPS: emugpud --sharing mps runs the kernels of its processes at once.
Kernels that together need fewer SMs than the GPU has run as alone; beyond
that a kernel gets what the kernels launched before it leave
(csrc/daemon/policy.h); CUDA_MPS_ACTIVE_THREAD_PERCENTAGE caps a client's
SMs and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT its memory, and both are ignored
without an MPS daemon, as CUDA ignores them without an MPS server.

The jobs run the virtual clock with the modelled host (test_daemon_sharing's
start), so the host's load cannot move their emulated times."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median

import pytest
from conftest import REPO
from test_daemon import TIMEOUT, Daemon, env
from test_daemon_sharing import JOB, run_together, start

pytestmark = pytest.mark.slow  # processes and a daemon: scripts/test.sh --fast leaves them out

# As test_daemon_sharing's JOB, with small matmuls whose few tiles fill few SMs.
SMALL_JOB = JOB.replace("4096, 4096", "256, 256")

PROBE = """
import torch, torch_emugpu
p = torch.emugpu.get_device_properties(0)
print(p.multi_processor_count, torch.emugpu.mem_get_info(0)[1])
"""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Callable[[str], Daemon]]:
    made: list[Daemon] = []

    def make(sharing: str = "mps") -> Daemon:
        d = Daemon(tmp_path, gpus="h100:1", sharing=sharing)
        made.append(d)
        return d

    yield make
    for d in made:
        if d.proc.poll() is None:
            d.stop()


def probe(address: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env(address, **extra),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=REPO,
    )


def test_gpu_bound_jobs_overlap_better_than_time_slices(daemon) -> None:
    d = daemon()
    alone = median(run_together([start(d.address, 4)])[0]["times"])
    results = run_together([start(d.address, 30), start(d.address, 30)])
    for r in results:
        # Kernels that fill the GPU: half the time this job's is ahead and runs as alone,
        # else it gets the SMs the other's last wave frees; better than time slicing's 0.45.
        assert 0.5 < r["share"] < 0.6, r
        assert median(r["times"]) == pytest.approx(alone / r["share"], rel=0.02)
        assert r["busy"] > 0.95


def test_kernels_that_fit_side_by_side_run_as_alone(daemon) -> None:
    d = daemon()
    alone = median(run_together([start(d.address, 4, SMALL_JOB)])[0]["times"])
    results = run_together([start(d.address, 30, SMALL_JOB), start(d.address, 30, SMALL_JOB)])
    for r in results:
        assert r["share"] == 1.0
        assert median(r["times"]) == pytest.approx(alone, rel=0.001)


def test_active_thread_percentages_cap_each_clients_sms(daemon) -> None:
    d = daemon()
    half = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    r = probe(d.address, **half)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "66"  # of the H100's 132
    full = median(run_together([start(d.address, 4)])[0]["times"])
    capped = median(run_together([start(d.address, 4, **half)])[0]["times"])
    assert capped == pytest.approx(2 * full, rel=0.05)  # compute-bound matmuls on half the SMs
    # Two halves fit side by side: neither slows the other.
    results = run_together([start(d.address, 20, **half), start(d.address, 20, **half)])
    for res in results:
        assert res["share"] == 1.0
        assert median(res["times"]) == pytest.approx(capped, rel=0.001)


def test_a_pinned_memory_limit_caps_what_a_client_allocates(daemon) -> None:
    d = daemon()
    script = (
        "import torch, torch_emugpu\n"
        "kept = torch.empty(900 * 2**20, dtype=torch.uint8, device='emugpu')\n"
        "try:\n"
        "    torch.empty(2**30, dtype=torch.uint8, device='emugpu')\n"
        "    print('allocated')\n"
        "except torch.OutOfMemoryError as e:\n"
        "    print('oom', str(e).splitlines()[0])\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script],
        env=env(d.address, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=1G"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("oom"), r.stdout


def test_limits_apply_only_under_an_mps_daemon(daemon) -> None:
    d = daemon("time-slice")
    r = probe(d.address, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=1G")
    assert r.returncode == 0, r.stderr
    sms, total = r.stdout.split()
    assert sms == "132"
    assert int(total) > 70 * 2**30


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "150", "expected a percentage of the GPU's SMs above 0 and at most 100"),
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "0", "expected a percentage"),
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "1G", "expected DEVICE=SIZE entries such as 0=1G,1=512M"),
    ],
)
def test_bad_limits_are_refused_naming_the_variable(daemon, name: str, value: str, message: str) -> None:
    d = daemon()
    r = probe(d.address, **{name: value})
    assert r.returncode != 0
    assert f"{name}: {message}" in r.stderr
    assert "ValueError" in r.stderr


# test_daemon_sharing's JOB, also reporting mid-run the GPU's utilization and its processes as this process sees them.
UTIL_JOB = JOB.replace(
    '        me = [p for p in status["processes"] if p["pid"] == os.getpid()][0]\n',
    '        me = [p for p in status["processes"] if p["pid"] == os.getpid()][0]\n'
    "        util, procs = torch.emugpu.utilization(), torch.emugpu.process_utilization()\n",
).replace('"busy": me["busy"][0]}', '"busy": me["busy"][0], "util": util, "procs": procs}')


def test_utilization_is_the_daemons_view_of_the_gpu(daemon) -> None:
    assert UTIL_JOB != JOB
    d = daemon()
    a, b = run_together([start(d.address, 30, UTIL_JOB), start(d.address, 30, UTIL_JOB)])
    for r in (a, b):
        assert r["util"] >= 99  # the GPU, busy with both, not this process's part
        assert len(r["procs"]) == 2
        assert all(p["sm"] > 90 and p["memory"] > 0 for p in r["procs"]), r["procs"]
        assert any(0 < p["share"] < 1 for p in r["procs"])  # shares as last granted: one at least mid-sharing
