"""The collective cost model as Python sees it (`_C._collective_time`):
NCCL_ALGO, NVLS on Hopper, and the published data the benchmark reads."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
from types import ModuleType

import pytest
from conftest import REPO

import torch_emugpu

ROOT = pathlib.Path(REPO)

GIB = 1 << 30
model = torch_emugpu._C._collective_time


def busbw_gbps(r: dict, nbytes: int) -> float:
    return nbytes / r["seconds"] * r["bus_factor"] / 1e9


def test_nccl_algo_restricts_the_choice() -> None:
    # Two nodes of 8 A100s over 100 GB/s: NCCL's tree wins at 1 GiB, Ring is slower.
    default = model("all_reduce", GIB, "a100", 8, 2, 100)
    ring = model("all_reduce", GIB, "a100", 8, 2, 100, None, "Ring")
    assert default["algorithm"] == "tree"
    assert ring["algorithm"] == "ring"
    assert ring["seconds"] > default["seconds"]
    assert model("all_reduce", GIB, "a100", 8, 2, 100, None, "^Tree")["algorithm"] == "ring"


def test_bad_nccl_algo_is_a_value_error_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="NCCL_ALGO.*Ring, Tree, NVLS.*Rign"):
        model("all_reduce", GIB, "a100", 8, 1, None, None, "Rign")
    with pytest.raises(ValueError, match="allow Ring"):
        model("all_gather", GIB, "a100", 8, 1, None, None, "Tree")


@pytest.mark.slow
def test_nccl_algo_comes_from_the_environment() -> None:
    code = (
        "import torch_emugpu; r = torch_emugpu._C._collective_time('all_reduce', 1 << 30, 'a100', 8, 2, 100);"
        "print(r['algorithm'])"
    )
    env = dict(os.environ, NCCL_ALGO="Ring", PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ring"


def test_hopper_all_reduce_uses_nvls_at_its_published_rate() -> None:
    h100 = model("all_reduce", GIB, "h100", 8, 1)
    assert h100["algorithm"] == "nvls"
    # nccl-tests#290 and #309 publish 465-470 GB/s at 1-2 GiB with NVLS.
    assert 440 < busbw_gbps(h100, GIB) < 480
    a100 = model("all_reduce", GIB, "a100", 8, 1)
    assert a100["algorithm"] == "ring"
    assert 220 < busbw_gbps(a100, GIB) < 240  # published: 230-235


def load_benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("collective_model", ROOT / "benchmarks" / "collective_model.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_published_run_parses_and_names_a_known_gpu() -> None:
    bench = load_benchmark()
    runs = bench.load_all(ROOT / "benchmarks" / "data")
    validation = [r for r in runs if r.role == "validation"]
    assert any(r.rows[0].nodes == 1 and r.rows[0].ranks_per_node == 8 for r in validation)
    assert any(r.rows[0].nodes > 1 for r in validation)
    for run in runs:
        assert run.rows, run.name
        assert run.role == "validation" or run.reason, f"{run.name}: a context run needs its reason"
        for row in run.rows:
            assert row.size > 0 and row.value >= 0, (run.name, row)
            bench.predict(run.gpu, row, run.algorithms, None)  # the catalog knows the GPU


def test_nccl_tests_rows_are_read_in_both_formats() -> None:
    bench = load_benchmark()
    new = "1073741824 268435456 float sum -1 8166.8 131.48 230.08 0 8165.2 131.50 230.13 0".split()
    old = "268435456 67108864 float sum 16865 15.92 29.84 5e-07 16853 15.93 29.86 5e-07".split()
    assert bench.table_busbw(new) == (1 << 30, 230.08)
    assert bench.table_busbw(old) == (1 << 28, 29.84)
    assert bench.table_busbw("1M 1048576 36.22".split()) == (1 << 20, 36.22)
    assert bench.table_busbw("# Avg bus bandwidth : 81.1".split()) is None
