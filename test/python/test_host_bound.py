"""Host-bound detection: a loop whose host takes longer to launch work than
the emulated GPU takes to run it is reported (a warning, once, and
torch_emugpu.host_bound_report()), and a device-bound loop is not."""

from __future__ import annotations

import time
import warnings

import pytest
import torch

import torch_emugpu


def _loop(size: int, per_iteration: int, host_s: float, seconds: float) -> list[str]:
    """Iterations of `per_iteration` size x size matmuls, the host sleeping
    `host_s` after each launch, a synchronize per iteration, for `seconds` of
    wall time."""
    x = torch.randn(size, size, device="emugpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(per_iteration):
                x @ x
                if host_s:
                    time.sleep(host_s)
            torch.emugpu.synchronize()
    return [str(w.message) for w in caught if "host-bound" in str(w.message)]


@pytest.mark.slow
def test_device_bound_loop_is_not_host_bound() -> None:
    torch.emugpu.reset_engine_stats()  # windows start over, the first a warm-up: earlier tests' gaps stay out
    # 8192^2 fp32 matmuls: tens of milliseconds each on the emulated GPU, microseconds to launch; an
    # iteration of 1.6 s hides even a loaded machine's wake-up latency after each synchronize.
    assert not _loop(8192, 20, 0.0, 5.0)
    report = torch_emugpu.host_bound_report()
    assert report["windows"] >= 1, report
    assert report["host_bound_windows"] == 0, report
    assert report["worst_idle_fraction"] < 0.10, report


@pytest.mark.slow
def test_host_bound_loop_is_reported() -> None:
    before = torch_emugpu.host_bound_report()
    # 64^2 matmuls take microseconds; the host takes 2 ms per launch.
    messages = _loop(64, 5, 0.002, 2.0)
    after = torch_emugpu.host_bound_report()
    assert after["host_bound_windows"] > before["host_bound_windows"]
    assert after["last_idle_fraction"] > 0.5
    assert after["idle_ns"] > before["idle_ns"]
    # The warning comes once per process: here, unless an earlier test already drew it.
    assert len(messages) <= 1
    if messages:
        assert "torch_emugpu.host_bound_report()" in messages[0]
