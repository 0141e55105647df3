"""cost_report() and `torch-emugpu explain`: what the per-op cost model
charged, per op family."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO

import torch_emugpu


def by_family(rows: list[dict]) -> dict[str, dict]:
    return {r["family"]: r for r in rows}


def test_families_count_every_kernel_even_from_the_shape_cache() -> None:
    a = torch.randn(1024, 1024, device="emugpu")
    torch_emugpu.reset_cost_report()
    for _ in range(3):  # the second and third calls hit the shape cache
        b = torch.relu(a @ a)
    torch.emugpu.synchronize()
    rows = by_family(torch_emugpu.cost_report())
    mm = rows["matmul (mm)"]
    assert mm["kernels"] == 3
    assert mm["flops"] == pytest.approx(3 * 2 * 1024**3)
    assert mm["bound"] == "compute"
    assert 0 < mm["compute_of_peak"] <= 1
    relu = rows["elementwise"]
    assert relu["kernels"] >= 3 and relu["bound"] == "memory"
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1)
    assert b.shape == (1024, 1024)


def test_the_report_matches_the_compute_engine_and_resets() -> None:
    x = torch.randn(8, 3, 64, 64, device="emugpu")
    conv = torch.nn.Conv2d(3, 16, 3).to("emugpu")
    torch.emugpu.synchronize()
    torch_emugpu.reset_cost_report()
    torch.emugpu.reset_engine_stats()
    conv(x).sum().backward()
    torch.emugpu.synchronize()
    rows = torch_emugpu.cost_report(reset=True)
    families = by_family(rows)
    assert {"convolution forward", "convolution backward"} <= set(families)
    # No profile here: every compute-engine nanosecond is a cost-model charge.
    charged = sum(r["time_s"] for r in rows)
    assert charged == pytest.approx(torch.emugpu.engine_stats()["compute_busy_s"], rel=1e-6)
    assert torch_emugpu.cost_report() == []


def test_a_convolution_backward_is_two_kernels_and_unknown_ops_are_unmodelled() -> None:
    x = torch.randn(8, 16, 32, 32, device="emugpu", requires_grad=True)
    conv = torch.nn.Conv2d(16, 16, 3, bias=False).to("emugpu")
    y = conv(x)
    torch.emugpu.synchronize()
    torch_emugpu.reset_cost_report()
    y.backward(torch.ones_like(y))
    torch.histc(x.detach(), bins=10)  # no family, no pointwise or reduction tag
    torch.emugpu.synchronize()
    rows = by_family(torch_emugpu.cost_report())
    back = rows["convolution backward"]
    # cuDNN runs the input and the weight gradient as two kernels; on tensor cores (TF32 here) each
    # also transposes its NCHW operands to NHWC and back (three kernels more).
    tensor_cores = torch.emugpu.get_device_capability(0)[0] >= 8
    assert back["ops"] == 1 and back["kernels"] == (8 if tensor_cores else 2)
    unmodelled = rows["unmodelled (by bytes)"]
    assert unmodelled["ops"] == 1 and unmodelled["bound"] == "memory"
    assert unmodelled["bytes"] >= x.numel() * 4


def test_layer_and_group_norms_are_charged_as_themselves_not_as_batch_norms() -> None:
    # PyTorch's generic layer and group norm kernels normalise through native_batch_norm.
    ln = torch.nn.LayerNorm(64).to("emugpu")
    gn = torch.nn.GroupNorm(4, 16).to("emugpu")
    x = torch.randn(8, 128, 64, device="emugpu", requires_grad=True)
    y = torch.randn(8, 16, 10, 10, device="emugpu", requires_grad=True)
    torch.emugpu.synchronize()
    torch_emugpu.reset_cost_report()
    (ln(x).sum() + gn(y).sum()).backward()
    torch.emugpu.synchronize()
    rows = by_family(torch_emugpu.cost_report())
    assert "batch normalization" not in rows
    # Two forwards and two backwards (each backward: the input and the affine gradients).
    assert rows["normalization (layer, group, RMS)"]["ops"] == 4


_BATCH_NORM_TIMES = """
import torch, torch_emugpu
bn = torch.nn.BatchNorm2d(64).to("emugpu")
x = torch.randn(32, 64, 56, 56, device="emugpu")
def ms(dtype, half_weights=False):
    net = bn.half() if half_weights else bn.float()
    torch.emugpu.synchronize()
    torch_emugpu.reset_cost_report()
    if half_weights:
        net(x.half())
    else:
        with torch.autocast("emugpu", dtype=dtype, enabled=dtype != torch.float32):
            net(x.to(dtype))
    torch.emugpu.synchronize()
    return [r["time_s"] * 1e3 for r in torch_emugpu.cost_report() if r["family"] == "batch normalization"][0]
print(ms(torch.float32), ms(torch.float16), ms(torch.bfloat16), ms(torch.float16, True))
"""


@pytest.mark.slow
def test_16_bit_batch_norms_take_cudnns_time_where_pytorch_would_use_cudnn() -> None:
    # PyTorch runs float16 batch norms with float32 weights (autocast) on cuDNN, as float32 ones;
    # bfloat16 ones and half models on its own, slower kernels (the H100 sweep).
    env = dict(os.environ, PYTHONPATH=REPO, EMUGPU_GPU="h100", EMUGPU_PROFILES="off")
    r = subprocess.run([sys.executable, "-c", _BATCH_NORM_TIMES], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    fp32, fp16, bf16, half = (float(v) for v in r.stdout.split())
    assert fp16 == pytest.approx(fp32, rel=1e-4)
    assert bf16 > 1.3 * fp32
    assert half == pytest.approx(bf16, rel=1e-4)


@pytest.mark.slow
def test_explain_prints_the_families_of_a_training_iteration() -> None:
    env = dict(os.environ, PYTHONPATH=REPO)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch_emugpu",
            "explain",
            "--model",
            "resnet18",
            "--gpu",
            "a100",
            "--batch-size",
            "4",
            "--iterations",
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "A100" in r.stdout and "cost model only" in r.stdout
    for family in ("convolution backward", "convolution forward", "batch normalization", "total"):
        assert family in r.stdout, r.stdout
    rules = r.stdout.split("the rule that timed each family:")[1]
    for family, rule in (("conv 3x3", "implicit-GEMM tile rule"), ("batch norm", "per-channel reduction rule")):
        assert any(line.startswith(family) and rule in line for line in rules.splitlines()), rules
    bad = subprocess.run(
        [sys.executable, "-m", "torch_emugpu", "explain", "--model", "resnet18", "--batch-size", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "--batch-size" in bad.stderr


def test_a_foreach_optimizer_step_is_one_kernel_per_op_not_per_tensor() -> None:
    params = [torch.nn.Parameter(torch.randn(64, 64, device="emugpu")) for _ in range(40)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, foreach=True)
    opt.step()  # state allocated
    torch.emugpu.synchronize()
    torch_emugpu.reset_cost_report()
    opt.step()
    torch.emugpu.synchronize()
    kernels = sum(r["kernels"] for r in torch_emugpu.cost_report())
    # CUDA runs each _foreach_ op as fused multi-tensor kernels: a handful
    # per step here, not one per parameter and op (hundreds).
    assert 0 < kernels < 40, kernels
    single = torch.optim.AdamW(params, foreach=False)
    single.step()
    torch.emugpu.synchronize()
    torch_emugpu.reset_cost_report()
    single.step()
    torch.emugpu.synchronize()
    assert sum(r["kernels"] for r in torch_emugpu.cost_report()) > 4 * 40


_CONV_TIMES = """
import torch, torch_emugpu
def ms(kernel, channels_last):
    conv = torch.nn.Conv2d(128, 128, kernel, padding=kernel // 2, bias=False).to("emugpu", torch.bfloat16)
    x = torch.randn(64, 128, 28, 28, device="emugpu", dtype=torch.bfloat16)
    if channels_last:
        conv, x = conv.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    torch.emugpu.synchronize()
    torch_emugpu.reset_cost_report()
    conv(x)
    torch.emugpu.synchronize()
    row = [r for r in torch_emugpu.cost_report() if r["family"] == "convolution forward"][0]
    return row["time_s"] * 1e6, row["kernels"]
print(*ms(3, False), *ms(3, True), *ms(1, False), *ms(1, True))
"""


@pytest.mark.slow
def test_nchw_tensor_core_convolutions_pay_the_layout_transforms_channels_last_ones_do_not() -> None:
    # cuDNN's tensor-core kernels work in NHWC: on NCHW tensors a 3x3 pass transposes its input and
    # output (the H100 sweep counts 4 kernels), a 1x1 stride-1 pass runs as a plain GEMM (1 kernel).
    env = dict(os.environ, PYTHONPATH=REPO, EMUGPU_GPU="h100", EMUGPU_PROFILES="off")
    r = subprocess.run([sys.executable, "-c", _CONV_TIMES], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    nchw3, k_nchw3, nhwc3, k_nhwc3, nchw1, _, nhwc1, _ = (float(v) for v in r.stdout.split())
    assert k_nchw3 > k_nhwc3 == 1
    # Both 12.8 MB activations read and written once more: at least 7.7 us at 3.35 TB/s.
    assert nchw3 - nhwc3 > 7.7
    assert nchw1 == pytest.approx(nhwc1, rel=1e-6)


def _reduction_bytes(fn) -> float:  # type: ignore[no-untyped-def]
    torch.emugpu.synchronize()
    torch_emugpu.reset_cost_report()
    fn()
    torch.emugpu.synchronize()
    return by_family(torch_emugpu.cost_report())["reductions, softmax and losses"]["bytes"]


def test_long_softmax_rows_are_read_per_pass_and_nll_loss_gathers_one_logit_per_target() -> None:
    # A 1000-class float32 row stays on chip (read once); a 50257-class one (201 KB) is read three
    # times forward (maximum, sum of exponentials, output) and its gradient twice backward.
    short = torch.randn(64, 1000, device="emugpu")
    long = torch.randn(64, 50257, device="emugpu", requires_grad=True)
    assert _reduction_bytes(lambda: torch.log_softmax(short, 1)) == pytest.approx(2 * short.nbytes)
    assert _reduction_bytes(lambda: torch.log_softmax(long, 1)) == pytest.approx(4 * long.nbytes)
    # Cross entropy: log-softmax (4 row reads and writes), nll_loss (a gather: a few bytes per target),
    # its backward (a zero-fill and a scatter), log-softmax's backward (4): 9 times the logits.
    target = torch.randint(0, 50257, (64,), device="emugpu")
    loss = lambda: torch.autograd.grad(torch.nn.functional.cross_entropy(long, target), long)  # noqa: E731
    assert _reduction_bytes(loss) == pytest.approx(9 * long.nbytes, rel=0.01)


def test_a_layer_norm_backward_reads_its_gradient_and_input_twice() -> None:
    # One kernel for the input gradient, one more (column sums) for the weight and bias gradients.
    ln = torch.nn.LayerNorm(768).to("emugpu")
    x = torch.randn(512, 768, device="emugpu", requires_grad=True)
    y = ln(x)
    gy = torch.randn_like(y)
    torch.emugpu.synchronize()
    torch_emugpu.reset_cost_report()
    torch.autograd.grad(y, (x, ln.weight, ln.bias), gy)
    torch.emugpu.synchronize()
    norm = by_family(torch_emugpu.cost_report())["normalization (layer, group, RMS)"]
    assert norm["kernels"] == 2
    assert norm["bytes"] >= 5 * x.nbytes  # dy and x twice, dx once


def test_rule_rows_group_ops_by_family_and_rule_with_their_share() -> None:
    from torch_emugpu.cli.explain import format_rule_rows, rule_rows

    trace = [
        {"rule_family": "lstm", "rule": "cuDNN RNN wavefront rule", "charged_ns": 3000},
        {"rule_family": "elementwise", "rule": "bandwidth rule", "charged_ns": 500},
        {"rule_family": "elementwise", "rule": "bandwidth rule", "charged_ns": 500},
    ]
    rows = rule_rows(trace)
    assert [(r["family"], r["ops"]) for r in rows] == [("lstm", 1), ("elementwise", 2)]
    assert rows[0]["share"] == pytest.approx(0.75) and rows[1]["time_s"] == pytest.approx(1e-6)
    table = format_rule_rows(rows, per=1)
    assert "cuDNN RNN wavefront rule" in table and "75.0%" in table


def test_the_rule_of_each_family_is_the_one_that_timed_it() -> None:
    from torch_emugpu import _C
    from torch_emugpu.cli.explain import rule_rows

    lstm = torch.nn.LSTM(64, 64, num_layers=2).to("emugpu")
    dw = torch.nn.Conv2d(32, 32, 7, padding=3, groups=32).to("emugpu")
    head = torch.nn.Linear(64, 128).to("emugpu")
    seq = torch.randn(16, 8, 64, device="emugpu")
    img = torch.randn(8, 32, 28, 28, device="emugpu")
    torch.emugpu.synchronize()
    _C._cost_trace_start(0, 1 << 16)
    out, _ = lstm(seq)
    (head(out).sum() + dw(img).sum()).backward()
    torch.emugpu.synchronize()
    rules = {(r["family"], r["rule"]) for r in rule_rows(_C._cost_trace(0))}
    assert ("lstm", "cuDNN RNN wavefront rule") in rules
    assert ("conv depthwise 7x7", "large-kernel depthwise rule") in rules
    assert ("matmul", "GEMM tile rule") in rules or ("matmul", "unaligned GEMM rule") in rules
    assert any(rule == "bandwidth rule" for _, rule in rules)


def test_column_sums_strided_operands_and_layer_norm_rows_take_their_rules() -> None:
    from torch_emugpu import _C

    x = torch.randn(256, 96, device="emugpu")
    h = torch.randn(256, 96, device="emugpu", dtype=torch.bfloat16)
    torch.emugpu.synchronize()
    _C._cost_trace_start(0, 64)
    x.sum(0)  # a bias gradient: 96 columns kept
    x.sum(1)  # along rows
    x.t().contiguous()  # a transposed copy
    x + 1  # contiguous, one dtype
    x + h  # bf16 into fp32: casts
    x * x[0]  # a broadcast row
    torch.nn.functional.dropout(h, 0.1, training=True)  # a bool mask is no second dtype
    torch.nn.functional.layer_norm(x, (96,))
    torch.emugpu.synchronize()
    ops = _C._cost_trace(0)
    rules = [(t["name"], t["rule"], t["columns"]) for t in ops]
    assert rules[0] == ("aten::sum", "column reduction rule", 96)
    assert rules[1] == ("aten::sum", "bandwidth rule", 0)
    strided = [t["strided"] for t in ops if t["name"] != "aten::native_layer_norm"][2:]
    assert strided == [True, False, True, True, False]
    assert ops[-1]["rule"] == "bandwidth rule, per-row floor" and ops[-1]["columns"] == 96


def test_a_traced_op_is_timed_again_as_it_was_charged() -> None:
    # benchmarks/fit_cost_model.py re-times traced ops with _kernel_times: an eval-mode batch norm
    # (running statistics, its planes) and a cuDNN one must keep their rules through the trace.
    from torch_emugpu import _C

    bn = torch.nn.BatchNorm2d(64).to("emugpu")
    x = torch.randn(8, 64, 14, 14, device="emugpu")
    torch.emugpu.synchronize()
    _C._cost_trace_start(0, 64)
    bn.eval()(x)
    bn.train()(x)
    torch.emugpu.synchronize()
    ops = [t for t in _C._cost_trace(0) if "batch_norm" in t["name"]]
    assert [t["running_stats"] for t in ops] == [True, False]
    assert ops[0]["plane"] == 196
    params = {k: v for k, v in _C._current_kernel_params(0).items() if k != "source"}
    again = _C._kernel_times(_C._device_properties(0)["name"], params, ops)
    assert again == [t["charged_ns"] for t in ops]
    # What MPS sharing reads of each kernel: its SMs' demand, its blocks' hold and its peak-rate times.
    for t in ops:
        assert 0 < t["demand"] <= 1 and t["hold_ns"] > 0
        assert 0 < t["peak_memory_ns"] < t["charged_ns"] and not t["compute_bound"]


def test_profiled_regions_say_how_their_targets_were_made() -> None:
    from torch_emugpu.cli.explain import format_profiled_regions

    regions = [
        {"key": "resnet50@64:forward", "target_s": 0.0127, "target_from": "profile point", "between": [64, 64]},
        {"key": "resnet50@96:forward", "target_s": 0.0180, "target_from": "cost-model curve", "between": [64, 128]},
        {"key": "Net(10 parameters)@8:forward", "target_s": None, "target_from": "cost model"},
    ]
    lines = format_profiled_regions(regions).splitlines()
    assert len(lines) == 2  # a cost-model region has no profiled target
    assert "12.700 ms (profile point)" in lines[0]
    assert "cost-model curve through batch sizes 64 and 128" in lines[1]
