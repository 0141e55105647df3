"""benchmarks/ddp_scaling.py --quick: every configuration runs under torchrun
(one node --standalone, and one torchrun per node at a c10d rendezvous), and
the table has a row of numbers for each. No timing thresholds: the smoke
configurations are small enough to be host-bound on a busy machine."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow  # multi-process runs: scripts/test.sh --fast leaves them out

SCRIPT = os.path.join(REPO, "benchmarks", "ddp_scaling.py")
ROW = re.compile(r"^\| (\d+x\d+ (?:standalone|rdzv)) \|(.*)\|$", re.M)
NUMBER = r"[-+]?\d+(?:\.\d+)?"


def test_quick_run_prints_a_row_of_numbers_per_configuration(tmp_path: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    plot, raw = tmp_path / "scaling.png", tmp_path / "scaling.json"
    cmd = [sys.executable, SCRIPT, "--quick", "--plot", str(plot), "--json", str(raw), "--timeout", "300"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    rows = {label: [c.strip() for c in cells.split("|")] for label, cells in ROW.findall(r.stdout)}
    assert list(rows) == ["1x1 standalone", "1x2 standalone", "1x1 rdzv", "2x1 rdzv"], r.stdout
    for label, cells in rows.items():
        ranks, nodes, iteration, throughput, efficiency, predicted, predicted_eff, error, verdict = cells[:9]
        peak, rss, pss = cells[9:]
        assert (int(ranks), int(nodes)) == {
            "1x1 standalone": (1, 1),
            "1x2 standalone": (2, 1),
            "1x1 rdzv": (1, 1),
            "2x1 rdzv": (2, 2),
        }[label]
        for cell in (iteration, throughput, predicted, peak, rss, pss):
            assert re.fullmatch(NUMBER, cell) and float(cell) > 0, (label, cells)
        for cell in (efficiency, predicted_eff, error):
            assert re.fullmatch(NUMBER + "%", cell), (label, cells)
        assert re.fullmatch(r"(no|HOST-BOUND) \(\d+\.\d%\)", verdict), (label, cells)
        # samples/s = ranks x batch (16) / iteration time
        assert float(throughput) == pytest.approx(int(ranks) * 16 / (float(iteration) / 1e3), rel=0.01)
    # The baseline is its own prediction.
    assert rows["1x1 standalone"][4] == "100.0%" and float(rows["1x1 standalone"][7].rstrip("%")) == 0
    assert "prediction error" in r.stdout and "host memory, 1x2 standalone (2 ranks)" in r.stdout

    assert plot.read_bytes().startswith(b"\x89PNG")
    results = json.loads(raw.read_text())
    assert [len(c["per_rank"]) for c in results] == [1, 2, 1, 2]
    # DDP buckets the same way at every world size: the prediction replays the 1-rank buckets.
    sizes = {c["configuration"]: [b["bytes"] for b in c["per_rank"][0]["iterations"][0]["buckets"]] for c in results}
    assert len({tuple(s) for s in sizes.values()}) == 1 and sizes["1x1 standalone"], sizes


def test_help_describes_the_prediction() -> None:
    r = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0
    assert "--quick" in r.stdout and "--gpus-per-node" in r.stdout and "end_k = max(ready_k, end_k-1)" in r.stdout
