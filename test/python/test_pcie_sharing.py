"""GPUs sharing a PCIe uplink (EMUGPU_PCIE_SHARED_BY, EMUGPU_PCIE_UPLINK_GBPS):
host-to-device copies of GPUs behind one uplink queue behind each other, in
one process (DataParallel's GPUs) and across a torchrun node's processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow  # multi-process runs: scripts/test.sh --fast leaves them out

# Each process copies MIB pinned bytes to its device at a wall-clock instant
# shared with the others, and prints how long the copy took on the device and
# when it ended (the core's clock, which the processes of a machine share).
JOB = r"""
import json, sys, time
import torch, torch_emugpu
devices, start_at, mib = [int(d) for d in sys.argv[1].split(",")], float(sys.argv[2]), int(sys.argv[3])
src = torch.empty(mib << 20, dtype=torch.uint8, pin_memory=True)
for d in devices:
    torch.empty(1, device=torch.device("emugpu", d))
while time.time() < start_at:
    time.sleep(0.001)
events = []
for d in devices:
    with torch.emugpu.device(d):
        e0, e1 = torch.emugpu.Event(enable_timing=True), torch.emugpu.Event(enable_timing=True)
        e0.record()
        src.to(torch.device("emugpu", d), non_blocking=True)
        e1.record()
        events.append((d, e0, e1))
for d, e0, e1 in events:
    e1.synchronize()
    print(json.dumps({"device": d, "ms": e0.elapsed_time(e1), "end": torch_emugpu._C._device_ready_ns(d)}))
"""
# 4 MiB: 0.17 ms over an A100's PCIe 4 link, about 0.9 s through a 5 MB/s
# uplink, so that the host's own memcpy (milliseconds, more on a loaded
# machine) is small beside what the uplink adds.
MIB = 4


def run_jobs(device_sets: list[str], shared_by: int, run_id: str | None = None) -> dict[int, dict[str, float]]:
    env = dict(
        os.environ,
        PYTHONPATH=REPO,
        EMUGPU_DEVICE_COUNT="2",
        EMUGPU_PCIE_SHARED_BY=str(shared_by),
        EMUGPU_PCIE_UPLINK_GBPS="0.005",
        EMUGPU_GPU="a100",
    )
    if run_id:
        env.update(TORCHELASTIC_RUN_ID=run_id, GROUP_RANK="0", LOCAL_WORLD_SIZE="2")
    start_at = f"{time.time() + 6:.3f}"  # after every process has imported torch
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", JOB, devices, start_at, str(MIB)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for devices in device_sets
    ]
    out: dict[int, dict[str, float]] = {}
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr[-2000:]
        for line in stdout.splitlines():
            r = json.loads(line)
            out[r["device"]] = r
    return out


def queued(copies: dict[int, dict[str, float]]) -> bool:
    """Whether the later copy ended at least one copy's time after the
    earlier: so on a shared uplink whenever the two overlapped, however far
    apart host load set their starts; on links of their own, only if they
    did not overlap at all."""
    first, second = sorted(copies.values(), key=lambda c: c["end"])
    return (second["end"] - first["end"]) / 1e6 >= 0.95 * min(first["ms"], second["ms"])


def test_gpus_of_one_process_queue_on_their_shared_uplink() -> None:
    shared = run_jobs(["0,1"], shared_by=2)
    # Device 1's copy waited for device 0's on the uplink: about twice as long.
    assert shared[0]["ms"] > 600 and shared[1]["ms"] > 1.6 * shared[0]["ms"], shared
    assert queued(shared), shared
    own = run_jobs(["0,1"], shared_by=1)
    assert max(c["ms"] for c in own.values()) < 300, own  # each GPU on its own link: no uplink at all


def test_the_processes_of_a_torchrun_node_share_uplinks() -> None:
    run_id = f"pcie-test-{uuid.uuid4().hex[:8]}"
    shared = run_jobs(["0", "1"], shared_by=2, run_id=run_id)
    # The processes start together, give or take scheduling: the later copy queues behind the other, which
    # the copies' ends show whatever skew host load put between the starts (durations would not).
    assert min(c["ms"] for c in shared.values()) > 600, shared
    assert queued(shared), shared
    assert not os.path.exists(f"/dev/shm/emugpu-pcie-{run_id}-0"), "the segment outlived the job"
    apart = run_jobs(["0", "1"], shared_by=1, run_id=f"{run_id}-apart")
    assert max(c["ms"] for c in apart.values()) < 300, apart


def test_bad_settings_name_the_variable() -> None:
    for var, value, want in (
        ("EMUGPU_PCIE_SHARED_BY", "0", "whole number of GPUs per PCIe uplink"),
        ("EMUGPU_PCIE_SHARED_BY", "2.5", "whole number of GPUs per PCIe uplink"),
        ("EMUGPU_PCIE_UPLINK_GBPS", "-1", "EMUGPU_PCIE_UPLINK_GBPS"),
    ):
        env = dict(os.environ, PYTHONPATH=REPO, **{var: value})
        r = subprocess.run(
            [sys.executable, "-c", "import torch, torch_emugpu; torch.empty(1, device='emugpu')"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode != 0
        assert "ValueError" in r.stderr and want in r.stderr, r.stderr[-1000:]
