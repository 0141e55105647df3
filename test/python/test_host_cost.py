"""The host's per-op launch cost (torch_emugpu/measure/host_cost.py), measured
here on the CPU (the stand-in CI has) with short probes."""

import json
import math
import os

import pytest
import torch

from torch_emugpu.measure import host_cost

FIGURES = ("python_op_us", "view_op_us", "module_op_us", "autograd_op_us", "optimizer_param_us")


def test_host_cost_on_the_cpu_gives_positive_finite_figures_and_the_host():
    host = host_cost.measure_host_cost("cpu", seconds_per_probe=0.02, repeats=3)
    for key in FIGURES:
        assert isinstance(host[key], float) and math.isfinite(host[key]) and host[key] > 0, (key, host[key])
    assert host["module_ops"] >= 9  # three Linear (addmm, t), ReLU and LayerNorm layers
    assert host["autograd_ops"] == host_cost.CHAIN_LENGTH  # one backward op per tanh and per multiply
    assert host["cpu"] and host["cores"] == os.cpu_count()
    assert host["torch"] == torch.__version__ and host["python"].count(".") == 2
    assert host["device_bound"] == [] and host["failed"] == {}  # only a CUDA device can run behind the host


def test_the_view_probe_counts_views_and_launches_no_kernel():
    probe = host_cost.probes()["view_op_us"](torch.device("cpu"))
    assert probe.units == host_cost.VIEW_OPS_PER_STEP
    x = torch.randn(16, 16)
    counted = host_cost.count_ops(lambda: (x.t(), x.view(256), x.transpose(0, 1), x.select(0, 1)))
    assert counted == 4  # one aten op per view, as the probe's units say
    assert probe.step() > 0


def test_op_counting_leaves_out_the_detaches_a_python_mode_causes():
    x = torch.randn(4, requires_grad=True)
    assert host_cost.count_ops(lambda: torch.relu(x)) == 1
    y, seed = torch.tanh(x), torch.ones(4)
    assert host_cost.count_ops(lambda: torch.autograd.grad(y, x, grad_outputs=seed)) == 1


def test_a_probe_that_cannot_run_gives_null_and_says_why(monkeypatch):
    first_line = "Device 'emugpu' does not have a corresponding module"

    def broken(device: torch.device) -> None:
        raise RuntimeError(first_line + "\nsecond line")

    monkeypatch.setattr(host_cost, "_optimizer_probe", broken)
    with pytest.warns(UserWarning, match="could not measure optimizer_param_us on cpu"):
        host = host_cost.measure_host_cost("cpu", seconds_per_probe=0.01, repeats=2)
    assert host["optimizer_param_us"] is None and host["python_op_us"] > 0
    assert host["failed"] == {"optimizer_param_us": f"RuntimeError: {first_line}"}
    assert "optimizer_param_us" in host_cost.summary(host)


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="seconds_per_probe: expected a number of seconds > 0, got 0"):
        host_cost.measure_host_cost("cpu", seconds_per_probe=0)
    with pytest.raises(ValueError, match="repeats: expected an integer >= 1"):
        host_cost.measure_host_cost("cpu", repeats=0)


def test_the_command_prints_and_writes_the_figures(tmp_path, capsys):
    out = tmp_path / "host_cost.json"
    assert host_cost.main(["--device", "cpu", "--seconds-per-probe", "0.02", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "python_op_us" in printed and "(200 ops)" in printed
    doc = json.loads(out.read_text())
    assert set(FIGURES) <= doc.keys() and doc["cpu"]
