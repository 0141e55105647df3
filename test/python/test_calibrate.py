"""torch-emugpu calibrate: the microbenchmark sweep, here --quick on the CPU (the stand-in CI has): the records,
resuming after an interruption, refusing another GPU's or a malformed file, and running without the compiled
extension."""

import argparse
import json
import math

import pytest
import torch
from conftest import run_python

from torch_emugpu.measure import calibrate
from torch_emugpu.measure.common import device_name

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def quick_doc(tmp_path_factory):
    out = tmp_path_factory.mktemp("calibration") / "cpu.json"
    doc = calibrate.run(out, CPU, quick=True, progress=False)
    return out, doc


@pytest.mark.slow
def test_quick_sweep_writes_records_with_analytic_flops_and_bytes(quick_doc):
    out, doc = quick_doc
    assert json.loads(out.read_text()) == doc
    assert doc["schema"] == "torch-emugpu calibration v1" and doc["gpu"] == device_name(CPU)
    assert doc["device"] == {"name": device_name(CPU)}
    assert doc["provenance"]["torch"] == torch.__version__ and doc["skipped"] == []
    ms = doc["measurements"]
    assert [m["id"] for m in ms] == [p.id for p in calibrate.points(CPU, quick=True)]
    assert {m["family"] for m in ms} == set(calibrate.FAMILIES) - {"transfer"}  # transfers need CUDA
    for m in ms:
        assert m["time_s"] > 0 and m["samples"] == calibrate.SAMPLES and m["kernels"] is None, m
    by_id = {m["id"]: m for m in ms}
    gemm = by_id["gemm/mm/M=64,N=64,K=64/float32/tf32=0"]
    assert gemm["flops"] == 2 * 64**3 and gemm["bytes"] == 3 * 64 * 64 * 4
    assert gemm["shape"] == {"M": 64, "N": 64, "K": 64} and gemm["flags"] == {"tf32": False}
    assert gemm["input_sets"] > 1  # 48 KiB of operands rotate so that caches do not flatter them
    rect = by_id["gemm/mm/M=32,N=96,K=48/bfloat16"]
    assert rect["flops"] == 2 * 32 * 96 * 48 and rect["bytes"] == (32 * 48 + 48 * 96 + 32 * 96) * 2
    add = by_id["elementwise/add/numel=1024/float32"]
    assert add["flops"] == 1024 and add["bytes"] == 3 * 1024 * 4
    attn = by_id["attention/forward/B=1,H=2,L=64,E=16/float32/causal=1"]
    assert attn["flops"] == 4 * 2 * 64 * 64 * 16 / 2
    conv = by_id["conv/backward_weight/N=2,C=8,H=16,W=16,K=8,R=3,S=3,stride=1,pad=1,groups=8,P=16,Q=16/float32"]
    assert conv["flops"] == 2 * 2 * 8 * 16 * 16 * 1 * 9
    sgd = by_id["optimizer/sgd/model=tiny,tensors=4,numel=10432/float32/foreach=1,fused=0"]
    assert sgd["input_sets"] == 1 and sgd["bytes"] == 5 * 4 * 10432
    assert "launch" in calibrate.summary(doc) and "TFLOP/s" in calibrate.summary(doc)


def test_quick_sweep_covers_the_new_families(quick_doc):
    _, doc = quick_doc
    by_id = {m["id"]: m for m in doc["measurements"]}
    ops = {(m["family"], m["op"]) for m in doc["measurements"]}
    for mode in ("lstm", "gru"):
        assert {("rnn", f"{mode}_{op}") for op in ("forward", "forward_backward", "inference")} <= ops
    lstm = by_id["rnn/lstm_forward/seq=8,batch=4,input=16,hidden=16,layers=2/float32"]
    # Two layers of 4 gates: (batch x in+hidden) @ (in+hidden x 4*hidden) per timestep, inputs 16 wide.
    assert lstm["flops"] == 2 * 2 * 8 * 4 * 4 * 16 * (16 + 16)
    assert lstm["peak_bytes"] is None and lstm["input_sets"] == 1  # no CUDA allocator statistics on the CPU
    fb = by_id["rnn/gru_forward_backward/seq=8,batch=4,input=16,hidden=16,layers=2/float32"]
    assert fb["flops"] == 3 * by_id["rnn/gru_forward/seq=8,batch=4,input=16,hidden=16,layers=2/float32"]["flops"]
    assert "peak_bytes" not in by_id["gemm/mm/M=64,N=64,K=64/float32/tf32=0"]
    dw = "conv/{}/N=2,C=8,H=16,W=16,K=8,R=7,S=7,stride=1,pad=3,groups=8,P=16,Q=16/float32"
    for op in calibrate.CONV_OPS:
        assert dw.format(op) in by_id and by_id[dw.format(op) + "/channels_last=1"]["flags"] == {"channels_last": True}
    grouped = by_id["conv/forward/N=2,C=8,H=16,W=16,K=8,R=3,S=3,stride=1,pad=1,groups=4,P=16,Q=16/float32"]
    assert grouped["flops"] == 2 * 2 * 8 * 16 * 16 * 2 * 9
    assert "conv/forward/N=4,C=8,H=16,W=16,K=8,R=3,S=3,stride=1,pad=1,groups=1,P=16,Q=16/float32" in by_id
    bn = by_id["norm/batch_norm_eval/N=2,C=8,H=16,W=16/float32"]
    assert bn["flops"] == 2 * 2 * 8 * 16 * 16 and bn["bytes"] == 2 * 2 * 8 * 16 * 16 * 4 + 4 * 8 * 4
    assert {("norm", "rms_norm_forward"), ("norm", "rms_norm_backward")} <= ops
    gqa = by_id["attention/forward_backward/B=1,H=4,Hkv=2,L=64,E=16/float32/causal=1,gqa=1"]
    assert gqa["flops"] == 3.5 * 4 * 4 * 64 * 64 * 16 / 2 and gqa["bytes"] == (6 * 4 + 6 * 2) * 64 * 16 * 4
    assert {
        ("elementwise", "silu"),
        ("elementwise", "mul"),
        ("elementwise", "mul_broadcast"),
        ("reduction", "mean_hw"),
    } <= ops
    assert "rnn" in calibrate.summary(doc)


def test_full_sweep_points_are_unique_and_fit_the_time_budget():
    # Only builds the specs: nothing is allocated. The first 489 points measured in 58 s on an H100; the 410 new
    # ones (depthwise/grouped/large-kernel convolutions, RNNs, eval and RMS norms, grouped-query attention) are
    # estimated at 2 minutes more (budget: 5 minutes).
    cuda = calibrate.points(torch.device("cuda"))
    assert len({p.id for p in cuda}) == len(cuda) < 920
    assert {"rnn", "conv", "norm", "attention"} <= {p.family for p in cuda}
    assert {p.family for p in cuda} == set(calibrate.FAMILIES)
    assert sum(p.flags.get("fused", False) for p in cuda) == 2  # fused AdamW on CUDA only
    assert not any(p.family == "transfer" or p.flags.get("tf32") for p in calibrate.points(CPU))


def test_parameter_shapes_match_the_models():
    assert sum(math.prod(s) for s in calibrate.resnet50_shapes()) == 25_557_032
    assert sum(math.prod(s) for s in calibrate.gpt2_small_shapes()) == 124_439_808
    torchvision = pytest.importorskip("torchvision")
    from torch_emugpu.measure.models import GPT

    with torch.device("meta"):
        resnet, gpt = torchvision.models.resnet50(), GPT()
    assert [tuple(p.shape) for p in resnet.parameters()] == calibrate.resnet50_shapes()
    assert sorted(tuple(p.shape) for p in gpt.parameters()) == sorted(calibrate.gpt2_small_shapes())


def test_an_interrupted_sweep_resumes(tmp_path):
    out = tmp_path / "cpu.json"
    families = ["launch", "elementwise", "gemm"]
    first = calibrate.run(out, CPU, families, quick=True, progress=False, max_points=3)["measurements"]
    assert len(first) == 3 and json.loads(out.read_text())["measurements"] == first
    doc = calibrate.run(out, CPU, families, quick=True, progress=False)
    expected = [p.id for p in calibrate.points(CPU, families, quick=True)]
    assert [m["id"] for m in doc["measurements"]] == expected
    assert doc["measurements"][:3] == first  # kept, not measured again
    again = calibrate.run(out, CPU, ["launch"], quick=True, progress=False, force=True)
    assert [m["id"] for m in again["measurements"]] == expected  # re-measured in place, the others kept
    assert again["measurements"][0] != first[0]


def test_only_the_selected_families_are_measured(tmp_path):
    doc = calibrate.run(tmp_path / "cpu.json", CPU, ["gemm"], quick=True, progress=False)
    assert doc["measurements"] and {m["family"] for m in doc["measurements"]} == {"gemm"}


def test_a_file_for_another_gpu_or_a_malformed_one_is_refused(tmp_path):
    out = tmp_path / "cal.json"
    doc = {"schema": calibrate.SCHEMA, "gpu": "NVIDIA A100-SXM4-80GB", "measurements": [], "skipped": []}
    out.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=rf"{out}.*'NVIDIA A100-SXM4-80GB'.*'gpu'"):
        calibrate.run(out, CPU, ["launch"], quick=True, progress=False)
    calibrate.run(out, CPU, ["launch"], quick=True, progress=False, force=True)  # --force replaces it
    assert json.loads(out.read_text())["gpu"] == device_name(CPU)
    for text, field in (
        ("{not json", "not JSON"),
        ("[]", "top level"),
        (json.dumps({**doc, "gpu": 3}), "'gpu'"),
        (json.dumps({**doc, "measurements": [{}]}), "'measurements'"),
        (json.dumps({**doc, "schema": "other"}), "'schema'"),
    ):
        out.write_text(text)
        with pytest.raises(ValueError, match=rf"calibration file {out} is malformed: .*{field}"):
            calibrate.run(out, CPU, ["launch"], quick=True, progress=False)


def test_a_file_with_a_newer_versions_families_is_kept_with_a_warning(tmp_path):
    out = tmp_path / "cpu.json"
    calibrate.run(out, CPU, ["launch"], quick=True, progress=False)
    doc = json.loads(out.read_text())
    future = {**doc["measurements"][0], "id": "ssm_scan/forward/L=64/float32", "family": "ssm_scan"}
    doc["measurements"].append(future)
    out.write_text(json.dumps(doc))
    with pytest.warns(UserWarning, match=r"families this version does not know \(ssm_scan\): kept as they are"):
        again = calibrate.run(out, CPU, ["launch", "gemm"], quick=True, progress=False)
    assert future in again["measurements"] and {m["family"] for m in again["measurements"]} >= {"gemm"}


def test_a_point_that_cannot_run_is_skipped_with_its_reason(tmp_path, monkeypatch):
    def unsupported() -> calibrate.Call:
        raise NotImplementedError("no kernel for this configuration\nsecond line")

    def launch_and_broken(s: calibrate.Sweep):
        yield calibrate.Point("launch", "broken", {"numel": 1}, torch.float32, unsupported, flops=1, bytes=4)
        yield from calibrate._launch(s)

    monkeypatch.setitem(calibrate.GENERATORS, "launch", launch_and_broken)
    doc = calibrate.run(tmp_path / "cpu.json", CPU, ["launch"], quick=True, progress=False)
    assert [m["op"] for m in doc["measurements"]] == ["add"]  # the sweep went on
    assert doc["skipped"] == [
        {
            "id": "launch/broken/numel=1/float32",
            "reason": "failed: NotImplementedError: no kernel for this configuration",
        }
    ]


def test_an_unknown_family_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="unknown calibration family gem; known: launch, elementwise"):
        calibrate.run(tmp_path / "cpu.json", CPU, ["gem"], quick=True, progress=False)
    parser = argparse.ArgumentParser()
    calibrate.add_arguments(parser)
    args = parser.parse_args(["--device", "cpu", "--families", "gem,gemm", "--out", str(tmp_path / "x.json")])
    with pytest.raises(ValueError, match="unknown calibration family gem;"):
        calibrate.main(args)


def test_default_out_is_beside_the_gpus_profiles_on_the_search_path(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    path = calibrate.default_out(CPU)
    assert path.parent.parent == tmp_path / "torch-emugpu" / "profiles"
    assert path.name == "calibration.json" and " " not in path.parent.name


@pytest.mark.slow
def test_calibrate_runs_without_the_compiled_extension(tmp_path):
    out = tmp_path / "cal.json"
    code = (
        "import sys; sys.modules['torch_emugpu._C'] = None\n"
        "import argparse, torch, torch_emugpu\n"
        "assert torch_emugpu._C is None\n"
        "from torch_emugpu.measure import calibrate\n"
        "p = argparse.ArgumentParser(); calibrate.add_arguments(p)\n"
        f"raise SystemExit(calibrate.main(p.parse_args(['--device', 'cpu', '--quick', '--families',"
        f" 'launch,gemm', '--out', {str(out)!r}, '--no-progress'])))"
    )
    r = run_python(code, env={"EMUGPU_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == str(out) and lines[1].split() == ["family", "points", "best"]
    assert [line.split()[0] for line in lines[2:]] == ["launch", "gemm"]
    assert {m["family"] for m in json.loads(out.read_text())["measurements"]} == {"launch", "gemm"}
