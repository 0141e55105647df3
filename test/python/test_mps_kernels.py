"""benchmarks/mps_kernels.py and collocation.py --kernels: the per-kernel evidence for the MPS rules.

The analysis is checked on timelines built by hand, where what each rule
predicts is known; the recording on a dry run of collocation.py on the CPU
(no GPU here: its rows are operators, not kernels, but they travel the same way).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys
from types import ModuleType
from typing import Any

import pytest
from conftest import run_example

ROOT = pathlib.Path(__file__).resolve().parents[2]
COLUMNS = ["name", "start_ns", "dur_ns", "blocks", "threads", "registers", "shared_bytes", "stream", "category"]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mk() -> ModuleType:
    return load("mps_kernels")


def recorded(kernels: list[tuple[str, int, int]], iterations: int = 1, blocks: int = 264) -> dict[str, Any]:
    """A --kernels record of (name, start us, duration us) rows."""
    names = sorted({k[0] for k in kernels})
    rows = [[names.index(n), s * 1000, d * 1000, blocks, 256, 32, 0, 7, 0] for n, s, d in kernels]
    return {"iterations": iterations, "columns": COLUMNS, "names": names, "t0_ns": 10**18, "rows": rows}


def test_fit_follows_the_launch_resources(mk: ModuleType) -> None:
    props = dict(mk.H100_PROPERTIES)
    small = mk.Kernel("elementwise", 0, 1000, 264, 256, 32, 0)
    f = mk.fit(small, props)
    assert f.resident == 8  # 2048 threads / 256, and 65536 registers / (8 warps x 32 x 32)
    assert f.waves == pytest.approx(264 / (8 * 132))
    assert f.fill == pytest.approx(0.25)
    assert f.thread_share == pytest.approx(2 * 256 / 2048)  # two blocks on each SM
    gemm = mk.Kernel("gemm", 0, 1000, 396, 384, 168, 200 * 1024)
    g = mk.fit(gemm, props)
    assert g.resident == 1  # 200 KiB of shared memory of 228 KiB
    assert g.waves == pytest.approx(3.0) and g.fill == pytest.approx(1.0)
    assert g.shared_share > 0.85
    assert mk.fit(mk.Kernel("memcpy", 0, 1000, 0, 0, 0, 0), props) is None


def test_iterations_are_split_only_where_they_repeat(mk: ModuleType) -> None:
    same = mk.recording({"kernels": recorded([("a", 0, 10), ("b", 20, 10), ("a", 100, 10), ("b", 120, 10)], 2)})
    assert same.per_iteration == 2
    ref = mk.reference(same)
    assert ref.by_position == [10_000, 10_000] and ref.gap_before == [0.0, 10_000]
    differ = mk.recording({"kernels": recorded([("a", 0, 10), ("b", 20, 10), ("b", 100, 10), ("a", 120, 10)], 2)})
    assert differ.per_iteration is None
    assert mk.recording({"kernels": recorded([])}) is None
    assert mk.recording({"kernels": {"error": "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"}}) is None


def pair_doc(
    a_pair: list[tuple[str, int, int]], b_pair: list[tuple[str, int, int]], b_iterations: int = 1
) -> dict[str, Any]:
    """Job A alone: k0 then, 5 us later, k1 (100 us each); job B alone: one 1000 us kernel."""
    return {
        "solo_mps": {
            "A": {"kernels": recorded([("k0", 0, 100), ("k1", 105, 100)])},
            "B": {"kernels": recorded([("big", 0, 1000)])},
        },
        "modes": {
            "mps": {
                "pairs": [
                    {
                        "jobs": ["A", "B"],
                        "members": [
                            {"job": "A", "kernels": recorded(a_pair)},
                            {"job": "B", "kernels": recorded(b_pair, b_iterations)},
                        ],
                    }
                ]
            }
        },
    }


def test_first_come_first_served_shows_as_a_wait_for_all_the_other_kernel_had_left(mk: ModuleType) -> None:
    # B's second kernel starts at 50 us, during A's k0; A's k1, ready at 100 us, starts only when it ends (1050 us)
    b = [("big", -950, 1000), ("big", 50, 1000), ("big", 1050, 1000)]
    doc = pair_doc([("k0", 0, 100), ("k1", 1050, 100)], b, b_iterations=3)
    (a, b), *_ = mk.pair_reports(doc, "mps")
    assert a.job == "A" and b.job == "B"
    assert a.stretch == pytest.approx(1.0) and b.stretch == pytest.approx(1.0)
    assert a.waits == 1
    assert a.wait_over_left == pytest.approx((1050 - 100 - 5) / (1050 - 100))
    assert a.wait_ms_per_iteration == pytest.approx(0.945)
    assert a.by_meeting["behind"]["time_share"] == pytest.approx(0.5)  # k0 met B's first kernel as much as its second
    assert a.by_meeting["ahead"]["time_share"] == pytest.approx(0.5)  # k1 met B's third, started with it
    assert a.span_ms_pair == pytest.approx(1.15) and a.span_ms_alone == pytest.approx(0.205)
    # only B's second kernel lies in the stretch both recordings cover (0 to 1150 us)
    assert b.covered == pytest.approx(1 / 3)
    assert b.overlapped == pytest.approx(50 / 1000)


def test_even_sharing_shows_as_stretch_on_both_sides_and_no_wait(mk: ModuleType) -> None:
    # both run at half speed while they overlap; A's k1 starts at once when ready
    b = [("big", -1125, 1175), ("big", 50, 1175)]
    doc = pair_doc([("k0", 0, 150), ("k1", 155, 200)], b, b_iterations=2)
    (a, b), *_ = mk.pair_reports(doc, "mps")
    assert a.wait_over_left == pytest.approx(0.0)
    assert a.by_meeting["behind"]["stretch"] == pytest.approx(2.0)  # k1 met B's second kernel, there first
    assert a.by_meeting["ahead"]["stretch"] == pytest.approx(1.5)  # k0 met it more than B's first
    assert a.stretch == pytest.approx(350 / 200) and a.kernel_ms_pair == pytest.approx(0.35)
    assert a.overlapped == pytest.approx(1.0)
    assert b.covered == 0  # neither of B's kernels lies within A's recording


def test_the_recorded_span_is_left_out_of_the_timing() -> None:
    colloc = load("collocation")
    reply = {"start": 0.0, "ends": [1.0, 2.0, 3.0, 10.0, 11.0, 12.0], "recorded_span": 3, "kernels": {"rows": []}}
    stats = colloc.window_stats(reply, 0.0, 0.0, 12.0, 1)
    assert stats["iter_ms"] == [1000.0] * 5  # not the 7 s the three recorded iterations took together
    assert stats["kernels"] == {"rows": []}
    plain = colloc.window_stats({k: v for k, v in reply.items() if k != "recorded_span"}, 0.0, 0.0, 12.0, 1)
    assert 7000.0 in plain["iter_ms"] and "kernels" not in plain


def test_a_result_without_kernels_is_refused_naming_the_option(mk: ModuleType, tmp_path, capsys) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"solo": {"A": {"median_ms": 1.0}}, "modes": {}}))
    assert mk.main([str(path)]) == 2
    assert "--kernels" in capsys.readouterr().err


def test_a_member_whose_recording_failed_is_named_with_why(mk: ModuleType, tmp_path, capsys) -> None:
    doc = pair_doc([("k0", 0, 100), ("k1", 105, 100)], [("big", 0, 1000)])
    doc["modes"]["mps"]["pairs"][0]["members"][1]["kernels"] = {"error": "RuntimeError: CUPTI failed"}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    assert mk.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "no kernels for mps A + B: B: RuntimeError: CUPTI failed" in out
    assert "no pair of mode 'mps'" in out


def test_collocation_records_overlapping_kernels_of_both_members(mk: ModuleType, tmp_path) -> None:
    out = tmp_path / "c.json"
    job = "resnet18:8:fp32"
    run_example(
        ROOT / "benchmarks" / "collocation.py",
        *("--device", "cpu", "--jobs", job, "--pairs", "resnet18+resnet18", "--kernels", "1"),
        *("--seconds", "0.6", "--out", str(out)),
        timeout=300,
    )
    doc = json.loads(out.read_text())
    solo = doc["solo"][job]
    members = doc["modes"]["time_slicing"]["pairs"][0]["members"]
    for entry in (solo, *members):
        rec = mk.recording(entry)
        assert rec is not None and len(rec.kernels) > 10, entry.get("kernels")
    a, b = (mk.recording(m) for m in members)
    assert a.kernels[0].start_ns < b.kernels[-1].end_ns and b.kernels[0].start_ns < a.kernels[-1].end_ns
    report = tmp_path / "r.json"
    r = run_example(ROOT / "benchmarks" / "mps_kernels.py", str(out), "--mode", "time_slicing", "--json", str(report))
    assert job in r.stdout
    pairs = json.loads(report.read_text())["pairs"]
    assert len(pairs) == 1 and pairs[0][0]["overlapped"] > 0
