"""examples/collocation/collocation_study.py: small jobs collocated on an emulated A100 under time
slicing, MPS and MIG, end to end with tiny settings: MIG isolates (a job on its instance runs as it
does alone there), MPS packs small kernels better than time slices do, and a job too big for the
smallest MIG instance is reported as out of memory, not as a failure."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from conftest import REPO, run_example

pytestmark = pytest.mark.slow  # a daemon and several processes: scripts/test.sh --fast leaves them out

EXAMPLE = pathlib.Path(REPO) / "examples" / "collocation" / "collocation_study.py"


def study(out: pathlib.Path, *args: str) -> list[dict[str, Any]]:
    run_example(EXAMPLE, "--gpu", "a100", "--iterations", "6", "--warmup", "1", "--out", str(out), *args)
    assert (out / "collocation_a100.png").stat().st_size > 0
    return json.loads((out / "collocation_a100.json").read_text())["rows"]


def row(rows: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    (hit,) = [r for r in rows if r["mode"] == mode]
    return hit


def test_small_jobs_mig_isolates_and_mps_packs(tmp_path: pathlib.Path) -> None:
    rows = study(tmp_path, "--jobs", "resnet18:64:32", "--modes", "time-slice", "mps", "mig", "--counts", "2")
    alone, solo, mig = row(rows, "alone"), row(rows, "mig-solo"), row(rows, "mig")
    assert alone["aggregate"] == 1.0 and alone["oom"] == 0
    # Two jobs on their own 3g.20gb instances each run exactly as one job alone there ...
    assert mig["oom"] == 0 and len(mig["images_s"]) == 2
    for rate in mig["images_s"]:
        assert rate == pytest.approx(solo["images_s"][0], rel=1e-3)
    # ... which is slower than the whole GPU (42 of 108 SMs), but the pair beats one job alone.
    assert solo["images_s"][0] < alone["images_s"][0]
    assert 1.0 < mig["aggregate"] < 2.0
    # Small kernels side by side under MPS beat time slices, which lose a switch per slice and gain only the
    # gaps one job alone leaves on the GPU while its host launches (a few here: small kernels, 22 us per op).
    assert row(rows, "mps")["aggregate"] > 1.5 * row(rows, "time-slice")["aggregate"]
    assert row(rows, "time-slice")["aggregate"] < 1.25


def test_a_job_too_big_for_the_instance_is_out_of_memory(tmp_path: pathlib.Path) -> None:
    # ResNet-50 at batch 128 needs about 12 GiB: the whole A100 holds it, a 1g.5gb instance (4.75 GiB) does not.
    rows = study(tmp_path, "--jobs", "resnet50:128:224", "--modes", "mig", "--counts", "4")
    assert row(rows, "alone")["oom"] == 0
    assert row(rows, "mig-solo")["oom"] == 1
    mig = row(rows, "mig")
    assert mig["oom"] == 4 and mig["aggregate"] == 0.0 and mig["images_s"] == []
