"""Measures a microbenchmark sweep on a real GPU (or on the CPU, as a stand-in
for tests) and writes one calibration file: what each family of operations
achieves as a function of size, shape and dtype, how many kernels it launches
and what one launch costs. A per-op cost model is fitted to this file later.

Families: launch (back-to-back 1-element adds), elementwise (add, relu, silu, mul;
squeeze-excitation's broadcast channel scaling), reduction (sums; squeeze-excitation's
global average pool), copy, gemm (float32 with and without TF32, bfloat16, float16),
bmm, conv (forward, backward-input, backward-weight: ResNet/VGG/AlexNet/MobileNetV2
layers; depthwise, grouped and large-kernel layers of ConvNeXt, ResNeXt, EfficientNet,
ViT and RepLKNet in NCHW and channels_last; squeeze-excitation 1x1 layers; bfloat16
inference forwards at batch 256), norm (batch norm training and eval, layer norm,
RMSNorm), softmax, cross_entropy, attention (scaled_dot_product_attention, causal; with
grouped query heads too), rnn (nn.LSTM and nn.GRU: training forward, forward+backward,
no_grad inference; with their peak memory), embedding, optimizer (SGD and AdamW steps:
loop, foreach, fused) and transfer (host<->device, pageable and pinned).

Each point is one op call with fixed shapes: 3 warm-up calls, then 5 samples,
each the mean over a loop of back-to-back calls (>= 20 ms, at most 200 calls),
timed with CUDA events; the median after dropping samples beyond 3 MADs is kept.
Small inputs rotate among several copies so that the 50 MB L2 of an H100 does not
flatter memory-bound ops. The first 489 points took a minute on an H100; all 899
take about 3 minutes by estimate (the first points' measured times plus a roofline
guess for the new ones; not yet measured); --quick measures a tiny subset in seconds.

The output is resumable: an interrupted sweep (Ctrl-C, kill) is saved every 20
points and after every family, and a second run measures only what is missing
(--force measures everything again); points of families this version does not
know (a newer version's) are kept as they are, with a warning. Runs with plain
PyTorch: it does not need torch-emugpu's compiled extension, so it can be copied
to any CUDA machine:

    torch-emugpu calibrate                      # the whole sweep on cuda
    torch-emugpu calibrate --families gemm,conv --out h100.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from torch_emugpu._version import __version__
from torch_emugpu.measure.common import (
    device_name,
    gpu_dir_name,
    robust_median,
    user_profile_dir,
    write_json_atomic,
)
from torch_emugpu.measure.models import GPT2_SMALL

VERSION = __version__  # written in _version.py only
SCHEMA = "torch-emugpu calibration v1"

WARMUP = 3
SAMPLES = 5
MAX_REPS = 200
MIN_LOOP_S = 0.020
QUICK_MIN_LOOP_S = 0.002  # --quick is a smoke test: its numbers are not meant to be fitted
# A point whose inputs and outputs are smaller than ROTATE_BELOW is measured over several copies, called in
# turn, together at least ROTATE_TARGET (2.5x an H100's 50 MB L2): otherwise a memory-bound op would read its
# inputs from L2, which a training step (whose other ops evict them) rarely does.
ROTATE_BELOW = 64 * 2**20
ROTATE_TARGET = 128 * 2**20
MAX_INPUT_SETS = 64  # below ROTATE_TARGET / 64 (2 MiB) the op is launch-bound anyway
SAVE_EVERY = 20
CONV_BACKWARD = (
    "torch.ops.aten.convolution_backward with output_mask (True, False, False) for the input "
    "gradient and (False, True, False) for the weight gradient (no bias)"
)
AGGREGATION = (
    f"per point: {WARMUP} warm-up calls, then {SAMPLES} samples, each the mean time of a loop of "
    f"back-to-back calls lasting at least {MIN_LOOP_S * 1e3:.0f} ms (at most {MAX_REPS} calls; "
    "CUDA events on CUDA, perf_counter on the CPU); time_s is the median of the samples after dropping "
    "those more than 3 MADs from the median. Inputs smaller than 64 MiB rotate among input_sets copies "
    f"(together >= 128 MiB, at most {MAX_INPUT_SETS}) so that L2 does not hold the next call's inputs. "
    "kernels: GPU kernels of one call from torch.profiler (memcpy/memset rows count only for copies and "
    "transfers). flops are analytic: 2MNK per GEMM; conv 2*N*K*P*Q*C/groups*R*S per pass; attention "
    "forward 4*B*H*L*L*E halved when causal, backward 2.5x forward; norms 8 per element per pass; "
    "softmax 5 (forward) and 4 (backward) per element, cross entropy 8 per logit (forward+backward); "
    "elementwise and reductions 1 per element; SGD 4 and AdamW 16 per parameter; 0 for copies and "
    "transfers; eval-mode batch norm 2 per element; rnn 2*seq*batch*G*H*(in+H) per layer for the forward "
    "(G = 4 gates for LSTM, 3 for GRU; in = the layer's input width), 3x that for forward+backward. "
    "bytes: each input read once and each output written once in device memory (rnn: input, weights, "
    "output and final states; the backward adds dy, the input and weights read and dx and the weight "
    "gradients written). attention with grouped query heads (flag gqa): H query and Hkv key/value heads, "
    "flops by H. peak_bytes (rnn): torch.cuda.max_memory_allocated during one call minus "
    "memory_allocated before it (outputs, cuDNN workspace and reserve space); null off CUDA. backend "
    "(attention, rnn): which implementation ran, from the kernels' names (cudnn, flash, efficient, math; "
    "cudnn or native)."
)

Call = Callable[[], object]
MiB = 2**20


@dataclass(frozen=True)
class Point:
    """One op call with fixed shapes; `setup` builds one set of inputs and returns the call."""

    family: str
    op: str
    shape: dict[str, Any]
    dtype: torch.dtype
    setup: Callable[[], Call]
    flops: float
    bytes: int
    flags: dict[str, Any] = field(default_factory=dict)
    tf32: bool | None = None  # torch.backends.cuda.matmul.allow_tf32 while measured; None: left as it is
    rotate: bool = True  # False where copies of the inputs would only cost setup time (transfers, optimizers)
    copies: bool = False  # memcpy/memset rows are this op's work, so they count as kernels
    memory: bool = False  # record the peak memory one call allocates (peak_bytes)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def id(self) -> str:
        def kv(d: dict[str, Any]) -> str:
            return ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in d.items())

        parts = [self.family, self.op, kv(self.shape), self.dtype_name]
        return "/".join([*parts, kv(self.flags)] if self.flags else parts)


@dataclass(frozen=True)
class Sweep:
    device: torch.device
    quick: bool

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def pick(self, full: Iterable[Any], quick: Iterable[Any]) -> list[Any]:
        return list(quick if self.quick else full)

    def randn(self, *shape: int, dtype: torch.dtype = torch.float32, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=dtype, requires_grad=grad)


F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def _numels(s: Sweep) -> list[int]:
    return s.pick((2**e for e in range(10, 29, 2)), (2**10, 2**12))


def _se_shapes(s: Sweep) -> list[tuple[int, int, int, int]]:
    """(N, C, H, W) where EfficientNet-B0's squeeze-excitation blocks sit, at batch 64."""
    return s.pick(((64, 144, 56, 56), (64, 240, 28, 28), (64, 672, 14, 14), (64, 1152, 7, 7)), ((2, 8, 8, 8),))


# --- point generators: one per family, each yields Points whose setup runs only when measured -------------------


def _launch(s: Sweep) -> Iterator[Point]:
    def setup() -> Call:
        a, b, c = s.randn(1), s.randn(1), s.randn(1)
        return lambda: torch.add(a, b, out=c)

    yield Point("launch", "add", {"numel": 1}, F32, setup, flops=1, bytes=12, rotate=False)


def _elementwise(s: Sweep) -> Iterator[Point]:
    def add(n: int, dtype: torch.dtype) -> Call:
        a, b = s.randn(n, dtype=dtype), s.randn(n, dtype=dtype)
        return lambda: torch.add(a, b)

    def relu(n: int, dtype: torch.dtype) -> Call:
        x = s.randn(n, dtype=dtype)
        return lambda: torch.relu(x)

    def silu(n: int, dtype: torch.dtype) -> Call:
        x = s.randn(n, dtype=dtype)
        return lambda: F.silu(x)

    def mul(n: int, dtype: torch.dtype) -> Call:
        a, b = s.randn(n, dtype=dtype), s.randn(n, dtype=dtype)
        return lambda: torch.mul(a, b)

    def scale(shape: tuple[int, ...], dtype: torch.dtype) -> Call:
        x, gate = s.randn(*shape, dtype=dtype), s.randn(shape[0], shape[1], 1, 1, dtype=dtype)
        return lambda: x * gate

    for dtype in s.pick((F32, BF16), (F32,)):
        es = dtype.itemsize
        for n in _numels(s):
            yield Point("elementwise", "add", {"numel": n}, dtype, partial(add, n, dtype), n, 3 * n * es)
            yield Point("elementwise", "relu", {"numel": n}, dtype, partial(relu, n, dtype), n, 2 * n * es)
            # A SwiGLU feed-forward is silu(x W1) * (x W3): one activation and one product per element.
            yield Point("elementwise", "silu", {"numel": n}, dtype, partial(silu, n, dtype), n, 2 * n * es)
            yield Point("elementwise", "mul", {"numel": n}, dtype, partial(mul, n, dtype), n, 3 * n * es)
        # Squeeze-excitation scales each channel of an (N, C, H, W) map by a broadcast (N, C, 1, 1) gate.
        for shape in _se_shapes(s):
            numel, nc = math.prod(shape), shape[0] * shape[1]
            yield Point(
                "elementwise",
                "mul_broadcast",
                dict(zip("NCHW", shape, strict=True)),
                dtype,
                partial(scale, shape, dtype),
                numel,
                (2 * numel + nc) * es,
            )


def _reduction(s: Sweep) -> Iterator[Point]:
    def setup(rows: int, dim: bool) -> Call:
        x = s.randn(rows, 1024)
        return (lambda: x.sum(dim=-1)) if dim else (lambda: x.sum())

    def mean_hw(shape: tuple[int, ...], dtype: torch.dtype) -> Call:
        x = s.randn(*shape, dtype=dtype)
        return lambda: x.mean((2, 3), keepdim=True)

    for n in _numels(s):
        rows = n // 1024
        shape = {"rows": rows, "cols": 1024}
        yield Point("reduction", "sum", shape, F32, partial(setup, rows, False), n, 4 * n + 4)
        yield Point("reduction", "sum_dim", shape, F32, partial(setup, rows, True), n, 4 * n + 4 * rows)
    # Squeeze-excitation's squeeze: a global average pool, each (N, C) plane summed over its H*W pixels.
    for dtype in s.pick((F32, BF16), (F32,)):
        for se in _se_shapes(s):
            numel, nc = math.prod(se), se[0] * se[1]
            yield Point(
                "reduction",
                "mean_hw",
                dict(zip("NCHW", se, strict=True)),
                dtype,
                partial(mean_hw, se, dtype),
                numel,
                (numel + nc) * dtype.itemsize,
            )


def _copy(s: Sweep) -> Iterator[Point]:
    def setup(n: int) -> Call:
        src, dst = s.randn(n), s.randn(n)
        return lambda: dst.copy_(src)

    for n in _numels(s):
        yield Point("copy", "copy", {"numel": n}, F32, partial(setup, n), 0, 8 * n, copies=True)


GEMM_SQUARE = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
GEMM_TOKENS = (2048, 8192, 16384)
GEMM_KN = ((768, 2304), (768, 3072), (3072, 768), (2048, 8192), (8192, 2048), (768, 50257))  # GPT-2 small/XL-ish


def _matmul_configs(s: Sweep) -> list[tuple[torch.dtype, bool]]:
    """(dtype, TF32) pairs; TF32 only changes float32 and only on CUDA."""
    full = [(F32, False), (F32, True), (BF16, False), (F16, False)] if s.cuda else [(F32, False), (BF16, False)]
    return s.pick(full, [(F32, False), (BF16, False)])


def _tf32_flags(dtype: torch.dtype, tf32: bool) -> dict[str, Any]:
    return {"tf32": tf32} if dtype == F32 else {}


def _gemm(s: Sweep) -> Iterator[Point]:
    def setup(m: int, k: int, n: int, dtype: torch.dtype) -> Call:
        a, b = s.randn(m, k, dtype=dtype), s.randn(k, n, dtype=dtype)
        return lambda: torch.mm(a, b)

    shapes = s.pick(
        [(n, n, n) for n in GEMM_SQUARE] + [(m, k, n) for m in GEMM_TOKENS for k, n in GEMM_KN],
        [(64, 64, 64), (128, 128, 128), (32, 48, 96)],
    )
    for dtype, tf32 in _matmul_configs(s):
        for m, k, n in shapes:
            yield Point(
                "gemm",
                "mm",
                {"M": m, "N": n, "K": k},
                dtype,
                partial(setup, m, k, n, dtype),
                2 * m * n * k,
                (m * k + k * n + m * n) * dtype.itemsize,
                _tf32_flags(dtype, tf32),
                tf32,
            )


def _bmm(s: Sweep) -> Iterator[Point]:
    """Attention's two batched products: scores q@k^T (k a transposed view) and p@v."""

    def setup(op: str, b: int, seq: int, e: int, dtype: torch.dtype) -> Call:
        if op == "qk":
            q, k = s.randn(b, seq, e, dtype=dtype), s.randn(b, seq, e, dtype=dtype)
            return lambda: torch.bmm(q, k.transpose(1, 2))
        p, v = s.randn(b, seq, seq, dtype=dtype), s.randn(b, seq, e, dtype=dtype)
        return lambda: torch.bmm(p, v)

    e = 64
    for dtype, tf32 in [c for c in _matmul_configs(s) if c[0] in (F32, BF16) and not c[1]]:
        for b in s.pick((12, 96, 384), (12,)):
            for seq in s.pick((128, 512, 1024), (128,)):
                for op, (m, n, k) in (("qk", (seq, seq, e)), ("pv", (seq, e, seq))):
                    yield Point(
                        "bmm",
                        op,
                        {"batch": b, "M": m, "N": n, "K": k},
                        dtype,
                        partial(setup, op, b, seq, e, dtype),
                        2 * b * m * n * k,
                        b * (m * k + k * n + m * n) * dtype.itemsize,
                        _tf32_flags(dtype, tf32),
                        tf32,
                    )


# (C, H, W, K, R, stride, pad, groups): ResNet-50, VGG-16, AlexNet and MobileNetV2 (depthwise) layers
CONV_LAYERS = (
    (3, 224, 224, 64, 7, 2, 3, 1),
    (64, 56, 56, 64, 3, 1, 1, 1),
    (64, 56, 56, 256, 1, 1, 0, 1),
    (256, 56, 56, 64, 1, 1, 0, 1),
    (128, 28, 28, 128, 3, 1, 1, 1),
    (256, 14, 14, 256, 3, 1, 1, 1),
    (512, 7, 7, 512, 3, 1, 1, 1),
    (1024, 14, 14, 256, 1, 1, 0, 1),
    (64, 224, 224, 64, 3, 1, 1, 1),
    (3, 224, 224, 64, 11, 4, 2, 1),
    (144, 56, 56, 144, 3, 1, 1, 144),
    (384, 14, 14, 384, 3, 1, 1, 384),
)
RESNET50_CONV_LAYERS = CONV_LAYERS[:8]
# Depthwise, grouped and large-kernel layers, measured in both memory formats: cuDNN picks other kernels for
# NHWC, and models run them there (ConvNeXt's blocks permute to NHWC for their LayerNorm and Linear layers, so
# its depthwise convolutions see channels_last inputs; ResNeXt is often trained channels_last).
CONV_VARIANT_LAYERS = (
    # ConvNeXt-T: the 7x7 depthwise of each stage, the 4x4/4 stem and a 2x2/2 downsampling layer
    (96, 56, 56, 96, 7, 1, 3, 96),
    (192, 28, 28, 192, 7, 1, 3, 192),
    (384, 14, 14, 384, 7, 1, 3, 384),
    (768, 7, 7, 768, 7, 1, 3, 768),
    (3, 224, 224, 96, 4, 4, 0, 1),
    (96, 56, 56, 192, 2, 2, 0, 1),
    # ResNeXt-50 32x4d: the grouped 3x3 (32 groups) of each stage and the strided one opening stage 2
    (128, 56, 56, 128, 3, 1, 1, 32),
    (256, 28, 28, 256, 3, 1, 1, 32),
    (512, 14, 14, 512, 3, 1, 1, 32),
    (1024, 7, 7, 1024, 3, 1, 1, 32),
    (256, 56, 56, 256, 3, 2, 1, 32),
    # EfficientNet-B0: a 3x3 depthwise at 112x112 and two 5x5 ones
    (32, 112, 112, 32, 3, 1, 1, 32),
    (240, 28, 28, 240, 5, 1, 2, 240),
    (672, 14, 14, 672, 5, 1, 2, 672),
    # Large kernels: ViT-B/16's 16x16/16 patch embedding, RepLKNet-31B's first-stage 31x31 depthwise
    (3, 224, 224, 768, 16, 16, 0, 1),
    (128, 56, 56, 128, 31, 1, 15, 128),
)
# EfficientNet-B0's squeeze-excitation 1x1 convolutions on pooled (1x1) maps: tiny GEMMs, NCHW only.
CONV_SE_LAYERS = ((672, 1, 1, 28, 1, 1, 0, 1), (28, 1, 1, 672, 1, 1, 0, 1))
QUICK_CONV_LAYERS = ((8, 16, 16, 8, 3, 1, 1, 1), (8, 16, 16, 8, 3, 1, 1, 8))
QUICK_CONV_VARIANT_LAYERS = ((8, 16, 16, 8, 7, 1, 3, 8), (8, 16, 16, 8, 3, 1, 1, 4))
CONV_OPS = ("forward", "backward_input", "backward_weight")
INFERENCE_BATCH = 256  # inference runs larger batches than training; forward only


def _conv_out(h: int, r: int, stride: int, pad: int) -> int:
    return (h + 2 * pad - r) // stride + 1


@dataclass(frozen=True)
class _ConvRun:
    n: int
    layer: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]
    channels_last: bool = False
    ops: tuple[str, ...] = CONV_OPS


def _conv_runs(s: Sweep) -> list[_ConvRun]:
    """The sweep's convolutions: ResNet-50/VGG/AlexNet/MobileNetV2 layers in NCHW (per dtype, in that order: the
    first points the sweep ever had), then depthwise, grouped and large-kernel layers in both memory formats,
    squeeze-excitation layers, and bfloat16 inference forwards of ResNet-50's layers at a large batch."""
    dtypes = tuple(s.pick((F32, BF16), (F32,)))
    if s.quick:
        runs = [_ConvRun(2, layer, (dtype,)) for dtype in dtypes for layer in QUICK_CONV_LAYERS]
        runs += [_ConvRun(2, layer, dtypes, cl) for layer in QUICK_CONV_VARIANT_LAYERS for cl in (False, True)]
        runs += [
            _ConvRun(2, (8, 1, 1, 4, 1, 1, 0, 1), dtypes),
            _ConvRun(4, QUICK_CONV_LAYERS[0], dtypes, ops=("forward",)),
        ]
        return runs
    base = [(64, layer) for layer in CONV_LAYERS] + [(16, layer) for layer in CONV_LAYERS[::2]]
    runs = [_ConvRun(n, layer, (dtype,)) for dtype in dtypes for n, layer in base]
    runs += [_ConvRun(64, layer, dtypes, cl) for layer in CONV_VARIANT_LAYERS for cl in (False, True)]
    runs += [_ConvRun(64, layer, dtypes) for layer in CONV_SE_LAYERS]
    # Under autocast convolutions run in bfloat16 on NCHW inputs.
    runs += [_ConvRun(INFERENCE_BATCH, layer, (BF16,), ops=("forward",)) for layer in RESNET50_CONV_LAYERS]
    return runs


def _conv(s: Sweep) -> Iterator[Point]:
    def setup(op: str, n: int, layer: tuple[int, ...], dtype: torch.dtype, channels_last: bool) -> Call:
        c, h, w, k, r, stride, pad, groups = layer
        # As model.to(memory_format=torch.channels_last) leaves them: activations, weights and (from the next
        # layer's backward) output gradients all NHWC.
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        x = s.randn(n, c, h, w, dtype=dtype).contiguous(memory_format=fmt)
        wt = s.randn(k, c // groups, r, r, dtype=dtype).contiguous(memory_format=fmt)
        if op == "forward":
            return lambda: F.conv2d(x, wt, None, stride, pad, 1, groups)
        gy = s.randn(n, k, _conv_out(h, r, stride, pad), _conv_out(w, r, stride, pad), dtype=dtype)
        gy = gy.contiguous(memory_format=fmt)
        mask = [op == "backward_input", op == "backward_weight", False]
        return lambda: torch.ops.aten.convolution_backward(
            gy, x, wt, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], groups, mask
        )

    for run in _conv_runs(s):
        c, h, w, k, r, stride, pad, groups = run.layer
        p, q = _conv_out(h, r, stride, pad), _conv_out(w, r, stride, pad)
        shape = {
            "N": run.n,
            "C": c,
            "H": h,
            "W": w,
            "K": k,
            "R": r,
            "S": r,
            "stride": stride,
            "pad": pad,
            "groups": groups,
            "P": p,
            "Q": q,
        }
        flops = 2 * run.n * k * p * q * (c // groups) * r * r
        x, wt, y = run.n * c * h * w, k * (c // groups) * r * r, run.n * k * p * q
        tensors = {"forward": x + wt + y, "backward_input": y + wt + x, "backward_weight": y + x + wt}
        for dtype in run.dtypes:
            flags: dict[str, Any] = {}
            if s.cuda:  # recorded, not set: cuDNN's defaults are what training scripts get
                flags = {"cudnn_tf32": torch.backends.cudnn.allow_tf32} if dtype == F32 else {}
                flags["cudnn_benchmark"] = torch.backends.cudnn.benchmark
            if run.channels_last:  # absent for NCHW, so that the first sweep's points keep their ids
                flags["channels_last"] = True
            for op in run.ops:
                yield Point(
                    "conv",
                    op,
                    shape,
                    dtype,
                    partial(setup, op, run.n, run.layer, dtype, run.channels_last),
                    flops,
                    tensors[op] * dtype.itemsize,
                    dict(flags),
                )


def _batch_norm_shapes(s: Sweep) -> list[tuple[int, int, int, int]]:
    """The conv layers' outputs at N=64, where a batch norm follows them."""
    if s.quick:
        return [(2, 8, 16, 16)]
    shapes = [(64, k, _conv_out(h, r, st, pd), _conv_out(w, r, st, pd)) for c, h, w, k, r, st, pd, g in CONV_LAYERS]
    return list(dict.fromkeys(shapes))


def _norm(s: Sweep) -> Iterator[Point]:
    def batch_norm(shape: tuple[int, ...], dtype: torch.dtype, backward: bool) -> Call:
        c = shape[1]
        x = s.randn(*shape, dtype=dtype, grad=backward)
        w, b = s.randn(c, dtype=dtype, grad=backward), s.randn(c, dtype=dtype, grad=backward)
        mean, var = torch.zeros(c, device=s.device, dtype=dtype), torch.ones(c, device=s.device, dtype=dtype)
        if not backward:
            return lambda: F.batch_norm(x, mean, var, w, b, training=True)
        y = F.batch_norm(x, mean, var, w, b, training=True)
        gy = torch.randn_like(y)
        return lambda: torch.autograd.grad(y, (x, w, b), gy, retain_graph=True)

    def layer_norm(tokens: int, width: int, dtype: torch.dtype, backward: bool) -> Call:
        x = s.randn(tokens, width, dtype=dtype, grad=backward)
        w, b = s.randn(width, dtype=dtype, grad=backward), s.randn(width, dtype=dtype, grad=backward)
        if not backward:
            return lambda: F.layer_norm(x, (width,), w, b)
        y = F.layer_norm(x, (width,), w, b)
        gy = torch.randn_like(y)
        return lambda: torch.autograd.grad(y, (x, w, b), gy, retain_graph=True)

    def batch_norm_eval(shape: tuple[int, ...], dtype: torch.dtype) -> Call:
        # A module in eval() under autocast: float32 running statistics and affine weights, activations in dtype.
        c = shape[1]
        x = s.randn(*shape, dtype=dtype)
        w, b, mean = s.randn(c), s.randn(c), s.randn(c)
        var = torch.rand(c, device=s.device) + 0.5

        def call() -> torch.Tensor:
            with torch.no_grad():
                return F.batch_norm(x, mean, var, w, b, training=False)

        return call

    def rms_norm(tokens: int, width: int, dtype: torch.dtype, backward: bool) -> Call:
        # As torch.nn.RMSNorm calls it (decoder transformers: Llama, Mistral, Qwen).
        x = s.randn(tokens, width, dtype=dtype, grad=backward)
        w = s.randn(width, dtype=dtype, grad=backward)
        if not backward:
            return lambda: F.rms_norm(x, (width,), w, 1e-6)
        y = F.rms_norm(x, (width,), w, 1e-6)
        gy = torch.randn_like(y)
        return lambda: torch.autograd.grad(y, (x, w), gy, retain_graph=True)

    for dtype in s.pick((F32, BF16), (F32,)):
        es = dtype.itemsize
        for shape in _batch_norm_shapes(s):
            numel, c = math.prod(shape), shape[1]
            named = dict(zip("NCHW", shape, strict=True))
            # Backward (via autograd on a retained graph) reads dy and x and writes dx, dweight and dbias.
            for op, bw, nbytes in (
                ("batch_norm_forward", False, (2 * numel + 2 * c) * es),
                ("batch_norm_backward", True, (3 * numel + 3 * c) * es),
            ):
                yield Point("norm", op, named, dtype, partial(batch_norm, shape, dtype, bw), 8 * numel, nbytes)
        for tokens in s.pick((2048, 8192, 16384), (64,)):
            for width in s.pick((768, 2048), (128,)):
                numel = tokens * width
                for op, bw, nbytes in (
                    ("layer_norm_forward", False, (2 * numel + 2 * width) * es),
                    ("layer_norm_backward", True, (3 * numel + 3 * width) * es),
                ):
                    yield Point(
                        "norm",
                        op,
                        {"tokens": tokens, "width": width},
                        dtype,
                        partial(layer_norm, tokens, width, dtype, bw),
                        8 * numel,
                        nbytes,
                    )
        # Eval-mode batch norm uses the running statistics: one multiply-add per element, no statistics pass.
        eval_shapes = _batch_norm_shapes(s)
        if dtype == BF16:  # inference's large batch, as the conv family's inference forwards
            eval_shapes += [(INFERENCE_BATCH, *shape[1:]) for shape in _batch_norm_shapes(s)[:6]]
        for shape in eval_shapes:
            numel, c = math.prod(shape), shape[1]
            yield Point(
                "norm",
                "batch_norm_eval",
                dict(zip("NCHW", shape, strict=True)),
                dtype,
                partial(batch_norm_eval, shape, dtype),
                2 * numel,
                2 * numel * es + 4 * c * 4,
            )
        for tokens in s.pick((4096, 16384), (64,)):
            for width in s.pick((2048, 4096), (128,)):
                numel = tokens * width
                # The backward reads dy, x and the weight and writes dx and the weight's gradient.
                for op, bw, nbytes in (
                    ("rms_norm_forward", False, (2 * numel + width) * es),
                    ("rms_norm_backward", True, (3 * numel + 2 * width) * es),
                ):
                    yield Point(
                        "norm",
                        op,
                        {"tokens": tokens, "width": width},
                        dtype,
                        partial(rms_norm, tokens, width, dtype, bw),
                        8 * numel,
                        nbytes,
                    )


def _logit_shapes(s: Sweep) -> list[tuple[int, int]]:
    return s.pick([(t, c) for c in (1000, 50257) for t in (256, 2048, 8192)], [(64, 100)])


def _softmax(s: Sweep) -> Iterator[Point]:
    def setup(tokens: int, classes: int, dtype: torch.dtype, backward: bool) -> Call:
        x = s.randn(tokens, classes, dtype=dtype, grad=backward)
        if not backward:
            return lambda: torch.softmax(x, -1)
        y = torch.softmax(x, -1)
        gy = torch.randn_like(y)
        return lambda: torch.autograd.grad(y, x, gy, retain_graph=True)

    for dtype in s.pick((F32, BF16), (F32,)):
        for t, c in _logit_shapes(s):
            n = t * c
            shape = {"tokens": t, "classes": c}
            yield Point(
                "softmax", "forward", shape, dtype, partial(setup, t, c, dtype, False), 5 * n, 2 * n * dtype.itemsize
            )
            yield Point(
                "softmax", "backward", shape, dtype, partial(setup, t, c, dtype, True), 4 * n, 3 * n * dtype.itemsize
            )


def _cross_entropy(s: Sweep) -> Iterator[Point]:
    def setup(tokens: int, classes: int, dtype: torch.dtype) -> Call:
        logits = s.randn(tokens, classes, dtype=dtype, grad=True)
        target = torch.randint(0, classes, (tokens,), device=s.device)
        return lambda: torch.autograd.grad(F.cross_entropy(logits, target), logits)

    for dtype in s.pick((F32, BF16), (F32,)):
        for t, c in _logit_shapes(s):
            yield Point(
                "cross_entropy",
                "forward_backward",
                {"tokens": t, "classes": c},
                dtype,
                partial(setup, t, c, dtype),
                8 * t * c,
                2 * t * c * dtype.itemsize + 8 * t,
            )


def _attention(s: Sweep) -> Iterator[Point]:
    def setup(shape: tuple[int, ...], dtype: torch.dtype, backward: bool) -> Call:
        q, k, v = (s.randn(*shape, dtype=dtype, grad=backward) for _ in range(3))
        if not backward:
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        do = s.randn(*shape, dtype=dtype)
        return lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), do)

    def gqa(b: int, h: int, hkv: int, seq: int, e: int, dtype: torch.dtype, backward: bool) -> Call:
        q = s.randn(b, h, seq, e, dtype=dtype, grad=backward)
        k, v = (s.randn(b, hkv, seq, e, dtype=dtype, grad=backward) for _ in range(2))
        sdpa = partial(F.scaled_dot_product_attention, is_causal=True, enable_gqa=True)
        if not backward:
            return lambda: sdpa(q, k, v)
        do = s.randn(b, h, seq, e, dtype=dtype)
        return lambda: torch.autograd.grad(sdpa(q, k, v), (q, k, v), do)

    shapes = s.pick(((8, 12, 1024, 64), (4, 16, 2048, 128), (32, 12, 256, 64), (16, 16, 1024, 128)), ((1, 2, 64, 16),))
    for dtype in s.pick((BF16, F16, F32), (F32,)):
        for shape in shapes:
            b, h, seq, e = shape
            fwd = 4 * b * h * seq * seq * e / 2  # causal: half the score matrix
            qkv = b * h * seq * e * dtype.itemsize
            named = {"B": b, "H": h, "L": seq, "E": e}
            yield Point(
                "attention",
                "forward",
                named,
                dtype,
                partial(setup, shape, dtype, False),
                fwd,
                4 * qkv,
                {"causal": True},
            )
            # Backward reads q, k, v, o, do and writes dq, dk, dv.
            yield Point(
                "attention",
                "forward_backward",
                named,
                dtype,
                partial(setup, shape, dtype, True),
                fwd * 3.5,
                12 * qkv,
                {"causal": True},
            )
    # Grouped-query attention (Llama, Mistral, Qwen): Hkv key/value heads, each shared by H / Hkv query heads.
    for dtype in s.pick((BF16,), (F32,)):
        for b, h, hkv, seq, e in _gqa_shapes(s):
            fwd = 4 * b * h * seq * seq * e / 2
            q_bytes, kv_bytes = b * h * seq * e * dtype.itemsize, b * hkv * seq * e * dtype.itemsize
            named = {"B": b, "H": h, "Hkv": hkv, "L": seq, "E": e}
            flags = {"causal": True, "gqa": True}
            # Forward reads q, k, v and writes o; the backward reads q, k, v, o, do and writes dq, dk, dv.
            yield Point(
                "attention",
                "forward",
                named,
                dtype,
                partial(gqa, b, h, hkv, seq, e, dtype, False),
                fwd,
                2 * q_bytes + 2 * kv_bytes,
                dict(flags),
            )
            yield Point(
                "attention",
                "forward_backward",
                named,
                dtype,
                partial(gqa, b, h, hkv, seq, e, dtype, True),
                fwd * 3.5,
                6 * q_bytes + 6 * kv_bytes,
                dict(flags),
            )


def _gqa_shapes(s: Sweep) -> list[tuple[int, int, int, int, int]]:
    """(B, H, Hkv, L, E): Llama-2/3-style 32:8 at two contexts, a small 16:4, multi-query (Hkv=1), Qwen's 28:4."""
    return s.pick(
        (
            (8, 32, 8, 1024, 128),
            (2, 32, 8, 4096, 128),
            (16, 16, 4, 512, 64),
            (4, 16, 1, 2048, 128),
            (4, 28, 4, 2048, 128),
        ),
        ((1, 4, 2, 64, 16),),
    )


def _embedding(s: Sweep) -> Iterator[Point]:
    def setup(vocab: int, width: int, n: int, dtype: torch.dtype, backward: bool) -> Call:
        table = s.randn(vocab, width, dtype=dtype, grad=backward)
        idx = torch.randint(0, vocab, (n,), device=s.device)
        if not backward:
            return lambda: F.embedding(idx, table)
        out = F.embedding(idx, table)
        g = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, table, g, retain_graph=True)  # embedding_dense_backward

    for dtype in s.pick((F32, BF16), (F32,)):
        for vocab, width in s.pick(((50257, 768), (50257, 2048)), ((1000, 64),)):
            for n in s.pick((8192, 16384), (128,)):
                es, shape = dtype.itemsize, {"vocab": vocab, "width": width, "indices": n}
                yield Point(
                    "embedding",
                    "forward",
                    shape,
                    dtype,
                    partial(setup, vocab, width, n, dtype, False),
                    0,
                    2 * n * width * es + 8 * n,
                )
                yield Point(
                    "embedding",
                    "backward",
                    shape,
                    dtype,
                    partial(setup, vocab, width, n, dtype, True),
                    n * width,
                    n * width * es + 8 * n + vocab * width * es,
                )


# (seq, batch, input, hidden, layers), batch_first as language models write it
RNN_SHAPES = (
    (35, 20, 650, 650, 2),  # PyTorch's word_language_model example (medium)
    (256, 64, 1024, 1024, 2),  # an LSTM language model: 256 tokens, batch 64, 1024 wide
    (64, 128, 256, 256, 1),  # narrow: launch-bound timesteps
    (128, 32, 512, 512, 4),  # deep: cuDNN runs the layers as a wavefront, overlapping them
    (32, 256, 2048, 2048, 1),  # wide: GEMM-bound timesteps
)
QUICK_RNN_SHAPES = ((8, 4, 16, 16, 2),)
RNN_GATES = {"lstm": 4, "gru": 3}


def _rnn(s: Sweep) -> Iterator[Point]:
    """nn.LSTM and nn.GRU as cuDNN runs them on CUDA (the CPU runs PyTorch's own cells): a training forward (it
    keeps cuDNN's reserve space for the backward), the forward and backward (dx and every weight's gradient), and
    an inference forward under no_grad. Each records its peak memory (workspace and reserve space matter)."""

    def setup(mode: str, op: str, shape: tuple[int, ...], dtype: torch.dtype) -> Call:
        seq, batch, inp, hidden, layers = shape
        cls = torch.nn.LSTM if mode == "lstm" else torch.nn.GRU
        rnn = cls(inp, hidden, layers, batch_first=True, device=s.device, dtype=dtype)  # flat cuDNN weights
        x = s.randn(batch, seq, inp, dtype=dtype, grad=op == "forward_backward")
        if op == "forward":
            return lambda: rnn(x)
        if op == "inference":
            rnn.eval()  # nn.LSTM passes self.training to cuDNN: no_grad alone still runs (and keeps) training mode

            def call() -> object:
                with torch.no_grad():
                    return rnn(x)

            return call
        gy = s.randn(batch, seq, hidden, dtype=dtype)
        wrt = (x, *rnn.parameters())
        return lambda: torch.autograd.grad(rnn(x)[0], wrt, gy)

    dtypes = s.pick((F32, BF16, F16) if s.cuda else (F32, BF16), (F32,))  # F16: autocast's default on CUDA
    for dtype in dtypes:
        es = dtype.itemsize
        flags: dict[str, Any] = {"cudnn_tf32": torch.backends.cudnn.allow_tf32} if s.cuda and dtype == F32 else {}
        for shape in s.pick(RNN_SHAPES, QUICK_RNN_SHAPES):
            seq, batch, inp, hidden, layers = shape
            named = {"seq": seq, "batch": batch, "input": inp, "hidden": hidden, "layers": layers}
            layer_inputs = [inp] + [hidden] * (layers - 1)
            for mode, gates in RNN_GATES.items():
                # Per timestep and layer: the input and recurrent GEMMs, (batch x in+hidden) @ (in+hidden x G*H).
                fwd = sum(2 * seq * batch * gates * hidden * (i + hidden) for i in layer_inputs)
                weights = sum(gates * hidden * (i + hidden) + 2 * gates * hidden for i in layer_inputs)
                x, y = seq * batch * inp, seq * batch * hidden
                states = layers * batch * hidden * (2 if mode == "lstm" else 1)
                fwd_bytes = (x + weights + y + states) * es
                # The backward reads dy, x and the weights and writes dx and the weights' gradients.
                for op, flops, nbytes in (
                    ("forward", fwd, fwd_bytes),
                    ("forward_backward", 3 * fwd, fwd_bytes + (y + 2 * x + 2 * weights) * es),
                    ("inference", fwd, fwd_bytes),
                ):
                    # One module per point: its timesteps re-read the weights, so L2 holds them in a real step
                    # too, and copies would only cost setup time.
                    yield Point(
                        "rnn",
                        f"{mode}_{op}",
                        named,
                        dtype,
                        partial(setup, mode, op, shape, dtype),
                        flops,
                        nbytes,
                        dict(flags),
                        rotate=False,
                        memory=True,
                    )


def resnet50_shapes() -> list[tuple[int, ...]]:
    """Parameter shapes of torchvision's resnet50 (161 tensors, 25,557,032 elements), written out so that the
    sweep needs no torchvision."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for i in range(blocks):
            shapes += [
                (planes, inplanes, 1, 1),
                (planes,),
                (planes,),
                (planes, planes, 3, 3),
                (planes,),
                (planes,),
                (planes * 4, planes, 1, 1),
                (planes * 4,),
                (planes * 4,),
            ]
            if i == 0:
                shapes += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    return [*shapes, (1000, 2048), (1000,)]


def gpt2_small_shapes() -> list[tuple[int, ...]]:
    """Parameter shapes of GPT-2 small with tied embeddings (148 tensors, 124,439,808 elements)."""
    cfg = GPT2_SMALL
    d = cfg.width
    block = [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
    return [(cfg.vocab_size, d), (cfg.context, d), *block * cfg.layers, (d,), (d,)]


def _optimizer(s: Sweep) -> Iterator[Point]:
    def setup(shapes: list[tuple[int, ...]], kind: str, foreach: bool, fused: bool) -> Call:
        params = [s.randn(*shape, grad=True) for shape in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        if kind == "sgd":
            opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=foreach)
        elif fused:
            opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
        else:
            opt = torch.optim.AdamW(params, lr=1e-3, foreach=foreach)
        return opt.step

    models = s.pick(
        (("resnet50", resnet50_shapes()), ("gpt2_small", gpt2_small_shapes())),
        (("tiny", [(64, 32), (64,), (128, 64), (128,)]),),
    )
    variants = [("sgd", False, False), ("sgd", True, False), ("adamw", False, False), ("adamw", True, False)]
    if s.cuda:
        variants.append(("adamw", False, True))
    for name, shapes in models:
        numel = sum(math.prod(shape) for shape in shapes)
        for kind, foreach, fused in variants:
            # SGD reads param, grad, momentum and writes param, momentum; AdamW has two moments.
            flops, tensors = (4, 5) if kind == "sgd" else (16, 7)
            yield Point(
                "optimizer",
                kind,
                {"model": name, "tensors": len(shapes), "numel": numel},
                F32,
                partial(setup, shapes, kind, foreach, fused),
                flops * numel,
                tensors * 4 * numel,
                {"foreach": foreach, "fused": fused},
                rotate=False,
            )


def _transfer(s: Sweep) -> Iterator[Point]:
    def setup(direction: str, nbytes: int, pinned: bool) -> Call:
        host = torch.randn(nbytes // 4, pin_memory=pinned)
        dev = s.randn(nbytes // 4)
        if direction == "h2d":
            return lambda: dev.copy_(host, non_blocking=pinned)
        return lambda: host.copy_(dev, non_blocking=pinned)

    if not s.cuda:
        return
    for direction in ("h2d", "d2h"):
        for nbytes in s.pick((4 * 1024, 64 * 1024, MiB, 16 * MiB, 256 * MiB), (4 * 1024, MiB)):
            for pinned in (False, True):
                yield Point(
                    "transfer",
                    direction,
                    {"bytes": nbytes},
                    F32,
                    partial(setup, direction, nbytes, pinned),
                    0,
                    nbytes,
                    {"pinned": pinned, "non_blocking": pinned},
                    rotate=False,
                    copies=True,
                )


GENERATORS: dict[str, Callable[[Sweep], Iterable[Point]]] = {
    "launch": _launch,
    "elementwise": _elementwise,
    "reduction": _reduction,
    "copy": _copy,
    "gemm": _gemm,
    "bmm": _bmm,
    "conv": _conv,
    "norm": _norm,
    "softmax": _softmax,
    "cross_entropy": _cross_entropy,
    "attention": _attention,
    "rnn": _rnn,
    "embedding": _embedding,
    "optimizer": _optimizer,
    "transfer": _transfer,
}
FAMILIES: tuple[str, ...] = tuple(GENERATORS)


def points(device: torch.device, families: list[str] | None = None, quick: bool = False) -> list[Point]:
    """The sweep's points, in order (nothing is allocated until a point's setup runs)."""
    sweep = Sweep(device, quick)
    return [p for f in _select(families) for p in GENERATORS[f](sweep)]


def _select(families: list[str] | None) -> list[str]:
    if families is None:
        return list(FAMILIES)
    unknown = [f for f in families if f not in GENERATORS]
    if unknown or not families:
        what = f"famil{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}" if unknown else "families: none given"
        raise ValueError(f"unknown calibration {what}; known: {', '.join(FAMILIES)}")
    return [f for f in FAMILIES if f in families]


# --- measuring ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _matmul_tf32(enabled: bool | None) -> Iterator[None]:
    if enabled is None:
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def _input_sets(point: Point) -> int:
    if not point.rotate or point.bytes >= ROTATE_BELOW:
        return 1
    return max(2, min(MAX_INPUT_SETS, math.ceil(ROTATE_TARGET / max(point.bytes, 1))))


def time_calls(calls: list[Call], device: torch.device, min_loop_s: float = MIN_LOOP_S) -> tuple[list[float], int]:
    """Per-call seconds of `SAMPLES` timed loops over `calls` in turn, and the calls per loop."""
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    for i in range(WARMUP):
        calls[i % len(calls)]()
    sync()
    t0 = time.perf_counter()
    calls[0]()
    sync()
    once = time.perf_counter() - t0  # includes a sync's latency: small ops get the most calls, as they should
    reps = max(1, min(MAX_REPS, math.ceil(min_loop_s / max(once, 1e-9))))
    samples = []
    for _ in range(SAMPLES):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(reps):
                calls[i % len(calls)]()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / reps)
        else:
            t0 = time.perf_counter()
            for i in range(reps):
                calls[i % len(calls)]()
            samples.append((time.perf_counter() - t0) / reps)
    return samples, reps


def _gpu_rows(call: Call, device: torch.device) -> list[tuple[str, bool]] | None:
    """(name, is a memcpy/memset) of every GPU activity one call causes; None when the profiler sees none."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    try:
        torch.cuda.synchronize(device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize(device)
            events = list(prof.events())
    except Exception:  # the count is optional; a profiler that cannot run must not stop the sweep
        return None
    # Once torch_emugpu renamed the PrivateUse1 backend, Kineto reports CUDA activities as PrivateUse1: on a CUDA
    # device both mean the GPU.
    gpu = (DeviceType.CUDA, DeviceType.PrivateUse1)
    rows = []
    for e in events:
        if e.device_type not in gpu:
            continue
        kind = getattr(e, "activity_type", None)  # newer torch names the CUPTI activity
        if kind is not None and kind not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue  # synchronisation and other non-work rows
        rows.append((e.name, kind in ("gpu_memcpy", "gpu_memset") or e.name.startswith(("Memcpy", "Memset"))))
    return rows or None


def _sdpa_backend(names: list[str]) -> str | None:
    """Which scaled_dot_product_attention backend ran, from its kernels' names."""
    lower = [n.lower() for n in names]
    for backend, marks in (
        ("cudnn", ("cudnn",)),
        ("flash", ("flash",)),
        ("efficient", ("fmha", "cutlassf", "cutlassb", "efficient", "mem_eff")),
    ):
        if any(m in n for n in lower for m in marks):
            return backend
    return "math" if any("gemm" in n for n in lower) else None


def _rnn_backend(names: list[str]) -> str | None:
    """cuDNN's RNN (its kernels name RNN, e.g. elemWiseRNNcell) or PyTorch's own cells (lstm_cell_forward)."""
    lower = [n.lower() for n in names]
    if any("rnn" in n or "cudnn" in n for n in lower):
        return "cudnn"
    return "native" if any("lstm" in n or "gru" in n for n in lower) else None


BACKENDS: dict[str, Callable[[list[str]], str | None]] = {"attention": _sdpa_backend, "rnn": _rnn_backend}


def peak_bytes(call: Call, device: torch.device) -> int | None:
    """Memory one call allocates at its peak (outputs, workspace, reserve space) beyond what was allocated
    before it, from the CUDA caching allocator's statistics; None off CUDA."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = call()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del out
    return peak


def measure(point: Point, device: torch.device, min_loop_s: float = MIN_LOOP_S) -> dict[str, Any]:
    """One measurement record; raises torch.OutOfMemoryError when the point does not fit."""
    with _matmul_tf32(point.tf32):
        calls = [point.setup() for _ in range(_input_sets(point))]
        samples, reps = time_calls(calls, device, min_loop_s)
        rows = _gpu_rows(calls[0], device) if device.type == "cuda" else None
        peak = peak_bytes(calls[0], device) if point.memory else None
    record: dict[str, Any] = {
        "id": point.id,
        "family": point.family,
        "op": point.op,
        "shape": point.shape,
        "dtype": point.dtype_name,
        "flags": point.flags,
        "time_s": robust_median(samples),
        "samples": len(samples),
        "reps": reps,
        "input_sets": len(calls),
        "flops": point.flops,
        "bytes": point.bytes,
        "kernels": None if rows is None else sum(1 for _, memory in rows if point.copies or not memory),
    }
    if point.memory:
        record["peak_bytes"] = peak
    if point.family in BACKENDS and rows:
        backend = BACKENDS[point.family]([name for name, _ in rows])
        if backend:
            record["backend"] = backend
    return record


# --- the document ---------------------------------------------------------------------------------------------


def _device_info(device: torch.device, gpu: str) -> dict[str, Any]:
    if device.type != "cuda":
        return {"name": gpu}
    props = torch.cuda.get_device_properties(device)
    info: dict[str, Any] = {
        "name": gpu,
        "sm_count": props.multi_processor_count,
        "total_memory": props.total_memory,
        "compute_capability": f"{props.major}.{props.minor}",
    }
    l2 = getattr(props, "L2_cache_size", None)
    if l2:
        info["l2_bytes"] = l2
    return info


def _new_document(device: torch.device, gpu: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "gpu": gpu,
        "device": _device_info(device, gpu),
        "provenance": {
            "tool": f"torch-emugpu calibrate {VERSION}",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "date": datetime.date.today().isoformat(),
            "host": socket.gethostname(),
            "aggregation": AGGREGATION,
            "conv_backward": CONV_BACKWARD,
        },
        "measurements": [],
        "skipped": [],
    }


def _problem(doc: Any) -> str | None:
    """What makes `doc` no calibration document, naming the field; None if it is one."""
    if not isinstance(doc, dict):
        return "the top level is not a JSON object"
    if doc.get("schema") != SCHEMA:
        return f"field 'schema' is {doc.get('schema')!r}, expected {SCHEMA!r}"
    if not isinstance(doc.get("gpu"), str):
        return "field 'gpu' is missing or not a string"
    ms = doc.get("measurements")
    if not isinstance(ms, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in ms):
        return "field 'measurements' is not a list of records with an 'id'"
    if not isinstance(doc.get("skipped", []), list):
        return "field 'skipped' is not a list"
    return None


def load(path: Path, gpu: str) -> dict[str, Any]:
    """The calibration document at `path`, checked to be one and to be for `gpu` (else ValueError)."""
    hint = "use another --out or --force"
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"calibration file {path} is malformed: not JSON ({e}); {hint}") from None
    problem = _problem(doc)
    if problem:
        raise ValueError(f"calibration file {path} is malformed: {problem}; {hint}")
    if doc["gpu"] != gpu:
        raise ValueError(
            f"calibration file {path} is for {doc['gpu']!r} but this device is {gpu!r} (field 'gpu'); {hint}"
        )
    # A newer version's families: their points are kept as they are (a resumed sweep does not measure them).
    unknown = sorted({str(m["family"]) for m in doc["measurements"] if m.get("family") is not None} - set(FAMILIES))
    if unknown:
        warnings.warn(
            f"calibration file {path} has points of families this version does not know "
            f"({', '.join(unknown)}): kept as they are, not measured again; known: {', '.join(FAMILIES)}",
            stacklevel=2,
        )
    return doc


def run(
    out: Path,
    device: torch.device,
    families: list[str] | None = None,
    quick: bool = False,
    force: bool = False,
    progress: bool = True,
    max_points: int | None = None,
) -> dict[str, Any]:
    """Measures the sweep's points that `out` lacks (all of them with `force`) and returns the document, which is
    written to `out` every SAVE_EVERY points, after every family and when interrupted.

    With `force`, a file for another GPU or a malformed one is replaced; records of points outside this run's
    selection are kept when the file is for this GPU. A point that runs out of memory or raises a RuntimeError
    (a configuration this PyTorch or cuDNN does not support) goes to the document's "skipped" with the reason;
    the sweep goes on."""
    from tqdm import tqdm

    out = Path(out)
    todo_all = points(device, families, quick)
    gpu = device_name(device)
    doc = _new_document(device, gpu)
    if out.exists():
        try:
            old = load(out, gpu)
        except ValueError:
            if not force:
                raise
        else:
            doc["measurements"], doc["skipped"] = old["measurements"], old.get("skipped", [])
    have = {m["id"] for m in doc["measurements"]}
    todo = [p for p in todo_all if force or p.id not in have]
    if todo and device.type == "cuda":
        check_autograd(device)
    retried = {p.id for p in todo}
    doc["skipped"] = [s for s in doc["skipped"] if s.get("id") not in retried]  # skipped points are tried again
    index = {m["id"]: i for i, m in enumerate(doc["measurements"])}
    min_loop_s = QUICK_MIN_LOOP_S if quick else MIN_LOOP_S
    measured, family = 0, None
    bar = tqdm(todo, desc=f"calibrating {gpu}", unit="point", disable=not progress)
    try:
        for point in bar:
            if max_points is not None and measured >= max_points:
                break
            if point.family != family and family is not None:
                write_json_atomic(out, doc)
            family = point.family
            bar.set_postfix_str(point.id, refresh=False)
            reason = None
            try:
                record = measure(point, device, min_loop_s)
            except torch.OutOfMemoryError as e:
                reason = f"out of memory: {str(e).splitlines()[0] if str(e) else 'out of memory'}"
            except RuntimeError as e:
                # A configuration this PyTorch or cuDNN cannot run (NotImplementedError included) costs its point,
                # not the rest of a sweep on a machine that may be lent for minutes.
                reason = f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if reason is not None:
                doc["skipped"].append({"id": point.id, "reason": reason})
                _free_memory(device)
                continue
            if point.id in index:
                doc["measurements"][index[point.id]] = record
            else:
                index[point.id] = len(doc["measurements"])
                doc["measurements"].append(record)
            measured += 1
            if measured % SAVE_EVERY == 0:
                write_json_atomic(out, doc)
    finally:
        bar.close()
        write_json_atomic(out, doc)
    return doc


def check_autograd(device: torch.device) -> None:
    """Fails at once, not minutes into the sweep, when backward passes cannot run on `device`."""
    x = torch.ones(2, device=device, requires_grad=True)
    try:
        torch.autograd.grad(x.sum(), x)
    except RuntimeError as e:
        hint = ""
        # Asked of sys.modules, not of the package: the measuring tools never import the extension's side of it.
        if sys.modules.get("torch_emugpu._C") is None and torch._C._get_privateuse1_backend_name() != "privateuseone":
            hint = (
                " (torch_emugpu renamed PyTorch's PrivateUse1 backend without its compiled extension, so autograd "
                "looks for an 'emugpu' accelerator that is not there)"
            )
        raise RuntimeError(f"backward passes fail on {device}{hint}: {e}") from e


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --- command line ---------------------------------------------------------------------------------------------


def default_out(device: torch.device) -> Path:
    """<profile dir>/<GPU name>/calibration.json: on the profile search path, beside the GPU's profiles."""
    return user_profile_dir() / gpu_dir_name(device_name(device)) / "calibration.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", default=None, help="output JSON file (default: <user profile dir>/<GPU name>/calibration.json)"
    )
    p.add_argument("--device", default="auto", help="cuda, cuda:N or cpu (default: cuda if available, else cpu)")
    p.add_argument("--families", default=None, help=f"comma-separated subset of {','.join(FAMILIES)} (default: all)")
    p.add_argument("--quick", action="store_true", help="a tiny subset with small sizes (a smoke test, seconds)")
    p.add_argument(
        "--force",
        action="store_true",
        help="measure points already in the output again (and replace a file for another GPU)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU is available on this machine; use --device cpu")
    return device


def summary(doc: dict[str, Any]) -> str:
    """Per family: points measured and the best achieved rate."""
    lines = [f"{'family':14} {'points':>6}  best"]
    for family in FAMILIES:
        ms = [m for m in doc["measurements"] if m["family"] == family and m["time_s"] > 0]
        if not ms:
            continue
        best = ""
        if family in ("gemm", "bmm", "conv", "attention", "rnn"):
            best = f"{max(m['flops'] / m['time_s'] for m in ms) / 1e12:.1f} TFLOP/s"
        elif family in ("elementwise", "copy", "transfer"):
            best = f"{max(m['bytes'] / m['time_s'] for m in ms) / 1e9:.1f} GB/s"
        elif family == "launch":
            best = f"{min(m['time_s'] for m in ms) * 1e6:.2f} us per launch"
        lines.append(f"{family:14} {len(ms):6d}  {best}".rstrip())
    if doc.get("skipped"):
        lines.append(f"skipped: {len(doc['skipped'])} (see 'skipped' in the file)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    device = _device(args.device)
    families = [f.strip() for f in args.families.split(",") if f.strip()] if args.families else None
    out = Path(args.out) if args.out else default_out(device)
    doc = run(out, device, families, quick=args.quick, force=args.force, progress=not args.no_progress)
    print(out)
    print(summary(doc))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m torch_emugpu.measure.calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
