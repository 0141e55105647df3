"""EMUGPU_HOST_OP_US: emulating a host slower than this one. Ops launched
from Python (forward, loss, optimizer) come at least that far apart; the ops
autograd's engine launches in C++ during backward keep this host's pace."""

from __future__ import annotations

import json

import pytest
from conftest import run_python

PACE_MS = 2.0

# Best of REPEATS: what is measured is this host's own time (the pace is a real
# sleep), so the fastest repeat is the one a loaded machine disturbed least.
REPEATS = 5

PROBE = f"""
import json, time, torch, torch_emugpu
x = torch.ones(4, 4, device="emugpu", requires_grad=True)
(x * 1.5).sum().backward()  # the first op's one-time costs (shape rules, planner) out of the way
forward_ms, backward_wall_ms = [], []
for _ in range({REPEATS}):
    torch.emugpu.synchronize()
    start, mid = (torch.emugpu.Event(enable_timing=True) for _ in range(2))
    start.record()
    y = x
    for _ in range(20):
        y = y * 1.5
    mid.record()
    t0 = time.perf_counter()
    y.sum().backward()
    torch.emugpu.synchronize()
    backward_wall_ms.append((time.perf_counter() - t0) * 1e3)
    forward_ms.append(start.elapsed_time(mid))
print(json.dumps({{"forward_ms": min(forward_ms), "backward_wall_ms": min(backward_wall_ms),
                  "host_op_us": torch_emugpu.config().host_op_us}}))
"""


def probe(env: dict[str, str]) -> dict:
    proc = run_python(PROBE, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_forward_ops_wait_for_the_emulated_hosts_time_per_op() -> None:
    paced = probe({"EMUGPU_HOST_OP_US": str(PACE_MS * 1e3)})
    assert paced["host_op_us"] == PACE_MS * 1e3
    # 20 multiplications (and the event between them): the device waited for the host, in every repeat.
    assert paced["forward_ms"] >= 19 * PACE_MS
    plain = probe({})
    assert plain["host_op_us"] == 0
    assert plain["forward_ms"] < 5 * PACE_MS


@pytest.mark.slow
def test_backward_ops_launched_by_autograd_keep_this_hosts_pace() -> None:
    paced = probe({"EMUGPU_HOST_OP_US": str(PACE_MS * 1e3)})
    # About 20 backward kernels; paced they would take >= 40 ms of host time in every repeat.
    assert paced["backward_wall_ms"] < 10 * PACE_MS


@pytest.mark.slow
def test_a_bad_time_per_op_names_the_variable() -> None:
    proc = run_python(
        "import torch, torch_emugpu; torch.ones(1, device='emugpu')", env={"EMUGPU_HOST_OP_US": "slow"}, timeout=120
    )
    assert proc.returncode != 0
    assert "EMUGPU_HOST_OP_US" in proc.stderr and "microseconds per op" in proc.stderr


@pytest.mark.slow
def test_a_run_bound_by_the_emulated_host_says_so() -> None:
    code = """
import warnings, torch, torch_emugpu
x = torch.ones(4, device="emugpu")
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for _ in range(8):  # 2.4 s: the first 0.5 s window is a warm-up
        for _ in range(150):
            x = x * 1.0
        torch.emugpu.synchronize()
print(torch_emugpu.host_bound_report()["host_bound_windows"])
print([str(w.message) for w in seen if "host-bound" in str(w.message)])
"""
    proc = run_python(code, env={"EMUGPU_HOST_OP_US": "2000"}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    windows, messages = proc.stdout.strip().splitlines()[-2:]
    assert int(windows) > 0
    assert "waiting for the emulated host (EMUGPU_HOST_OP_US=2000" in messages
