"""torch-emugpu profile: measures profiles (here on the CPU, the stand-in CI has),
resumes, and runs without the compiled extension."""

import json

import pytest
import torch
from conftest import run_python

from torch_emugpu.measure import host_cost, profiler


@pytest.mark.slow
def test_profiler_writes_a_loadable_profile_and_resumes(tmp_path):
    cpu = torch.device("cpu")
    paths = profiler.run(
        ["squeezenet1_1"], [1, 2], tmp_path, cpu, warmup=1, iterations=2, progress=False, host_probe_s=0.02
    )
    assert len(paths) == 1
    doc = json.loads(paths[0].read_text())
    assert [b["batch_size"] for b in doc["batches"]] == [1, 2]
    assert all(b["forward_s"] > 0 and b["backward_s"] > 0 for b in doc["batches"])
    assert doc["fingerprint"]["parameters"] == 1235496
    assert doc["provenance"]["torch"] == torch.__version__
    assert doc["provenance"]["host"]["python_op_us"] > 0
    first = doc["batches"][0]["forward_s"]
    profiler.run(["squeezenet1_1"], [1, 2, 3], tmp_path, cpu, warmup=1, iterations=2, progress=False, host_probe_s=0.02)
    doc = json.loads(paths[0].read_text())
    assert [b["batch_size"] for b in doc["batches"]] == [1, 2, 3]
    assert doc["batches"][0]["forward_s"] == first  # not measured again
    from torch_emugpu import _C

    loaded = _C._scan_profiles([str(tmp_path)])
    assert loaded[0]["model"] == "squeezenet1_1" and loaded[0]["tables"][0][1] == [1, 2, 3]


def test_profiles_carry_the_host_measured_once_per_run(tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(
        profiler,
        "measure",
        lambda name, bs, *_: {"batch_size": bs, "forward_s": 0.01 * bs, "backward_s": 0.02 * bs},
    )
    measured = []

    def measure_host_cost(device: torch.device, *, seconds_per_probe: float) -> dict:
        measured.append(seconds_per_probe)
        return host_cost.measure_host_cost(device, seconds_per_probe=seconds_per_probe, repeats=2)

    monkeypatch.setattr(profiler, "measure_host_cost", measure_host_cost)
    paths = profiler.run(["squeezenet1_1", "alexnet"], [1, 2], tmp_path, cpu, progress=False, host_probe_s=0.01)
    assert measured == [0.01]  # once for the run, though it wrote four times
    hosts = [json.loads(p.read_text())["provenance"]["host"] for p in paths]
    assert hosts[0] == hosts[1]
    assert all(hosts[0][key] > 0 for key in ("python_op_us", "module_op_us", "autograd_op_us", "optimizer_param_us"))
    assert hosts[0]["cpu"] and hosts[0]["cores"] >= 1
    # A resumed profile keeps the host it was measured on; nothing is measured again for it.
    profiler.run(["squeezenet1_1"], [1, 2, 4], tmp_path, cpu, progress=False, host_probe_s=0.01)
    assert measured == [0.01]
    assert json.loads(paths[0].read_text())["provenance"]["host"] == hosts[0]
    # The core's parser reads it.
    from torch_emugpu import _C

    loaded = _C._scan_profiles([str(tmp_path)])
    assert sorted(p["model"] for p in loaded) == ["alexnet", "squeezenet1_1"]


def test_robust_median_drops_outliers():
    assert profiler.robust_median([1.0, 1.1, 0.9, 1.0, 50.0]) == 1.0


def test_bad_arguments_are_value_errors(tmp_path):
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="unknown torchvision model"):
        profiler.run(["resnet9000"], [1], tmp_path, cpu, progress=False)
    with pytest.raises(ValueError, match="batch sizes must be integers >= 1"):
        profiler.run(["resnet18"], [0], tmp_path, cpu, progress=False)


@pytest.mark.slow
def test_profiler_runs_without_the_compiled_extension(tmp_path):
    code = (
        "import sys; sys.modules['torch_emugpu._C'] = None\n"
        "import torch, torch_emugpu\n"
        "assert torch_emugpu._C is None\n"
        "from torch_emugpu import cli\n"
        f"raise SystemExit(cli.main(['profile', '--models', 'squeezenet1_1', '--batch-sizes', '1',"
        f" '--device', 'cpu', '--warmup', '0', '--iterations', '1', '--out', {str(tmp_path)!r},"
        " '--host-probe-seconds', '0.02', '--no-progress']))"
    )
    r = run_python(code, env={"EMUGPU_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("squeezenet1_1.json")
