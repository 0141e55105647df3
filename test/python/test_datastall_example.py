"""examples/datastall.py: the DataStall what-if on emulated GPUs, end to end
on a tiny dataset, and its two pieces of arithmetic."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
from types import ModuleType

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow  # multi-process runs: scripts/test.sh --fast leaves them out

EXAMPLE = pathlib.Path(REPO) / "examples" / "datastall.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("datastall", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lru_thrashes_below_the_cached_fraction() -> None:
    ex = load()
    for fraction in (0.25, 0.5):
        hits = ex.lru_hit_rate(fraction, items=4000, epochs=3)
        assert 0 < hits < fraction  # random order every epoch defeats LRU
    assert ex.lru_hit_rate(1.0, items=1000, epochs=2) == pytest.approx(1.0)


def test_stalls_follow_supply_and_demand() -> None:
    ex = load()
    assert ex.prep_stall(demand=1000, cores=3, per_core=100) == pytest.approx(0.7)
    assert ex.prep_stall(demand=200, cores=3, per_core=100) == 0
    # 8 GPUs x 300 images/s, half the reads from a 100 MB/s disk of 100 kB files: 2000 images/s
    assert ex.fetch_stall(2400, 0.5, 100e3, 100e6) == pytest.approx(1 - 2000 / 2400)
    assert ex.fetch_stall(2400, 1.0, 100e3, 100e6) == 0


def test_the_example_runs_and_its_check_agrees(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=REPO)
    r = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--images",
            "96",
            "--models",
            "alexnet",
            "--gpus",
            "v100",
            "--batch-size",
            "32",
            "--iterations",
            "1",
            "--cache-fractions",
            "0.5",
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads((out / "datastall.json").read_text())
    row = result["gpus"]["Tesla V100-SXM2-16GB"]["alexnet"]
    assert row["demand_images_s"] > 0 and row["cores_needed"] >= 1
    assert row["fetch_stall_lru"]["0.5"] >= row["fetch_stall"]["0.5"]
    check = result["check"]
    # One emulated epoch's measured preprocessing stall against the what-if's prediction.
    assert abs(check["measured_prep_stall"] - check["predicted_prep_stall"]) < 0.2, check
    assert (out / "datastall.png").stat().st_size > 0
    assert "| alexnet |" in (out / "datastall.md").read_text()


def test_bad_arguments_are_refused() -> None:
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), "--cache-fractions", "1.5"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    assert r.returncode == 2
    assert "--cache-fractions must lie in 0..1" in r.stderr
