"""examples/salus/salus.py: three ResNet-50 jobs started apart on one emulated P100, end to end with
short settings. Under FIFO iterations each of N jobs gets 1/N of the job alone (GPEmu's Salus shape);
under MPS the jobs' kernels run at once, so two and three jobs together do more than one job's work,
and a third job does not make the aggregate fall below one job's (the kernels of several jobs are
dispatched in one order, not each against each)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from conftest import REPO, run_example

pytestmark = pytest.mark.slow  # a daemon and three processes: scripts/test.sh --fast leaves them out

EXAMPLE = pathlib.Path(REPO) / "examples" / "salus" / "salus.py"


def phases(out: pathlib.Path, sharing: str) -> list[dict[str, Any]]:
    # Job k starts 20 s (emulated) after the first, so that its start-up (real time, while the running
    # jobs' clocks go on) ends well inside the phase.
    run_example(EXAMPLE, "--sharing", sharing, "--iterations", "250", "--offset", "20", "--out", str(out))
    assert (out / f"salus_{sharing}_p100.png").stat().st_size > 0
    return json.loads((out / f"salus_{sharing}_p100.json").read_text())["phases"]


def aggregate(phase: dict[str, Any], alone: float) -> float:
    return sum(phase["jobs"].values()) / alone


def test_fifo_gives_each_of_n_jobs_a_nth_and_mps_more_in_aggregate(tmp_path: pathlib.Path) -> None:
    fifo = phases(tmp_path, "fifo")
    mps = phases(tmp_path, "mps")
    for run in (fifo, mps):
        # One job, then two, then three running, then two and one again as they finish.
        assert [len(p["jobs"]) for p in run] == [1, 2, 3, 2, 1], run
    alone = fifo[0]["jobs"]["0"]
    assert mps[0]["jobs"]["0"] == pytest.approx(alone, rel=1e-3)  # alone, MPS changes nothing
    for p in fifo[1:4]:
        n = len(p["jobs"])
        for rate in p["jobs"].values():
            assert rate == pytest.approx(alone / n, rel=0.03), p
    two, three = aggregate(mps[1], alone), aggregate(mps[2], alone)
    assert two > 1.05 * aggregate(fifo[1], alone), mps
    assert three > 1.0, mps
    assert three == pytest.approx(two, rel=0.05), mps
