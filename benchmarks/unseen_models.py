"""Training (and a few inference) iterations of models the cost model was never
fitted on, timed on a real GPU (`--device cuda`, plain PyTorch and torchvision:
no compiled extension needed), on an emulated one (`--device emugpu`) or, as a
dry run, on the CPU (`--device cpu --tiny`), so that the emulator's busy time
and peak memory per iteration can be put beside a real GPU's.

Cases, most valuable for fidelity first: recurrent language models (cuDNN's
LSTM and GRU, a bidirectional LSTM), ConvNeXt-T, ResNeXt-50 (channels-last,
grouped convolutions), EfficientNet-B0, bf16 inference of ResNet-152,
ResNet-50 and ViT-B/16, a 168 M-parameter Llama-style decoder (RMSNorm,
rotary embeddings, SwiGLU, grouped-query attention), a BERT-base encoder,
GPT-2 small between the profiled batch sizes, MobileNetV3, RegNetY, DenseNet,
Swin-T, and last GPT-2 and ResNet-50 eager and under `torch.compile`. A
training iteration is zero_grad, forward and loss (timed to a synchronise),
then backward and optimizer step (timed to a synchronise); an inference
iteration is one forward under eval() and no_grad. Each case records the
medians (outliers beyond 3 MAD dropped), the per-iteration samples and the
peak device memory; a compiled case also the wall time of its first
iteration (`compile_s`), and runs in a child process killed at a cap. A case
that fails (out of memory, an exception, a compile error or timeout) is
recorded with its error and the run goes on. The JSON is written after
every case; cases already in it (measured or failed) are skipped, so delete
an entry to retry it. No new case starts once `--budget-s` seconds have
passed since the process started.

    python benchmarks/unseen_models.py --device cuda --out unseen_h100.json
    python benchmarks/unseen_models.py --device cpu --tiny --out /tmp/dry.json --cases lstm_lm,llama160m

Estimated on an H100 with 16 cores: ~90 s of eager cases (imports and CUDA
start included) and 40-120 s of compilation per compiled case; the defaults
fit the 6-minute run of `unseen_models_on_gpu.sh`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from torch_emugpu.measure.common import robust_median, write_json_atomic
from torch_emugpu.measure.models import GPT, GPTConfig, torchvision_model


def _process_age() -> float:
    """Seconds since this process started (Linux; 0 elsewhere), so that the
    budget counts the interpreter's and torch's imports too."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = float(f.read().rpartition(")")[2].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


START = time.monotonic() - _process_age()


def elapsed() -> float:
    return time.monotonic() - START


# --- cases -----------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    model: str
    batch: int
    precision: str  # "fp32", "fp32-channels_last" or "bf16-autocast"
    mode: str = "train"  # "train", "inference" or "compiled" (training under torch.compile)

    @property
    def id(self) -> str:
        return f"{self.model}/b{self.batch}/{self.precision}" + ("" if self.mode == "train" else f"/{self.mode}")

    @property
    def amp(self) -> bool:
        return self.precision.startswith("bf16")

    @property
    def channels_last(self) -> bool:
        return self.precision.endswith("channels_last")


CASES = [
    # recurrent language models (cuDNN RNN: never in the fit)
    Case("lstm_lm", 64, "fp32"),
    Case("lstm_lm", 32, "fp32"),
    Case("gru_lm", 64, "fp32"),
    Case("bilstm", 64, "fp32"),
    # depthwise 7x7, LayerNorm over channels, grouped convolutions, channels-last
    Case("convnext_tiny", 64, "fp32"),
    Case("convnext_tiny", 64, "bf16-autocast"),
    Case("resnext50_32x4d", 64, "fp32-channels_last"),
    Case("resnext50_32x4d", 64, "bf16-autocast"),
    Case("efficientnet_b0", 64, "fp32"),
    # inference: eval-mode norms, no backward
    Case("resnet152", 256, "bf16-autocast", "inference"),
    Case("resnet50", 256, "bf16-autocast", "inference"),
    Case("vit_b_16", 128, "bf16-autocast", "inference"),
    # transformers the fit never saw
    Case("llama160m", 8, "bf16-autocast"),
    Case("bert_base", 32, "bf16-autocast"),
    # GPT-2 small between the profiled batch sizes (8 and 16)
    Case("gpt2", 4, "bf16-autocast"),
    Case("gpt2", 12, "bf16-autocast"),
    # other unseen CNNs and a windowed-attention transformer
    Case("mobilenet_v3_large", 128, "fp32"),
    Case("regnet_y_1_6gf", 64, "fp32"),
    Case("densenet121", 64, "fp32"),
    Case("swin_t", 32, "bf16-autocast"),
    # eager against torch.compile, in one file; compiled cases last: they can eat the budget
    Case("gpt2", 8, "bf16-autocast"),
    Case("resnet50", 128, "bf16-autocast"),
    Case("gpt2", 8, "bf16-autocast", "compiled"),
    Case("resnet50", 128, "bf16-autocast", "compiled"),
]


@dataclass(frozen=True)
class Sizes:
    """Sequence lengths, image side, transformer depth and vocabulary: the real ones, or a dry run's
    (`--tiny`: a CPU without bfloat16 instructions takes minutes over a 64x64 bfloat16 ConvNeXt, hence
    32x32, and ~20 s over GPT-2's bfloat16 head gradient, hence a vocabulary of 2048)."""

    tiny: bool = False

    def batch(self, case: Case) -> int:
        return 2 if self.tiny else case.batch

    @property
    def rnn_seq(self) -> int:
        return 16 if self.tiny else 256

    @property
    def llama_seq(self) -> int:
        return 32 if self.tiny else 1024

    @property
    def bert_seq(self) -> int:
        return 32 if self.tiny else 512

    @property
    def gpt_seq(self) -> int:
        return 32 if self.tiny else 1024

    @property
    def image(self) -> int:
        return 32 if self.tiny else 224

    def layers(self, full: int) -> int:
        return 2 if self.tiny else full

    def vocab(self, full: int) -> int:
        return 2048 if self.tiny else full


# --- models ----------------------------------------------------------------

RNN_VOCAB = 10_000
# name: (cell, embedding width, hidden, layers, bidirectional)
RNN_MODELS = {
    "lstm_lm": ("LSTM", 1024, 1024, 2, False),
    "gru_lm": ("GRU", 1024, 1024, 2, False),
    "bilstm": ("LSTM", 1024, 512, 1, True),
}


class RecurrentLM(nn.Module):
    """Embedding -> nn.LSTM / nn.GRU (batch_first) -> Linear over the vocabulary."""

    def __init__(self, cell: str, width: int, hidden: int, layers: int, bidirectional: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(RNN_VOCAB, width)
        rnn = nn.LSTM if cell == "LSTM" else nn.GRU
        self.rnn = rnn(width, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), RNN_VOCAB)
        self.description = (
            f"Embedding({RNN_VOCAB}, {width}) -> nn.{cell}({width}, {hidden}, num_layers={layers}, "
            f"batch_first=True{', bidirectional=True' if bidirectional else ''}) -> "
            f"Linear({hidden * (2 if bidirectional else 1)}, {RNN_VOCAB})"
        )

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.emb(idx))[0])


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 32000
    width: int = 1024
    layers: int = 12
    heads: int = 16
    kv_heads: int = 4
    mlp_hidden: int = 2816
    context: int = 1024
    rope_theta: float = 10000.0
    eps: float = 1e-5


class RMSNorm(nn.Module):
    """HF Llama's: the mean square in float32, scaled back in the input's dtype."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(batch, kv_heads, seq, dim) -> (batch, kv_heads * n_rep, seq, dim), as HF Llama repeats them."""
    if n_rep == 1:
        return x
    b, kv, t, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, t, d).reshape(b, kv * n_rep, t, d)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim = cfg.heads, cfg.kv_heads, cfg.width // cfg.heads
        self.q = nn.Linear(cfg.width, cfg.heads * self.dim, bias=False)
        self.k = nn.Linear(cfg.width, cfg.kv_heads * self.dim, bias=False)
        self.v = nn.Linear(cfg.width, cfg.kv_heads * self.dim, bias=False)
        self.o = nn.Linear(cfg.heads * self.dim, cfg.width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.dim).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        n_rep = self.heads // self.kv_heads
        y = F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, self.heads * self.dim))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.width, cfg.mlp_hidden, bias=False)
        self.up = nn.Linear(cfg.width, cfg.mlp_hidden, bias=False)
        self.down = nn.Linear(cfg.mlp_hidden, cfg.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.width, cfg.eps)
        self.attn = LlamaAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.width, cfg.eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """A Llama-style decoder (pre-RMSNorm, rotary embeddings, SwiGLU, grouped-query attention), tied head."""

    inv_freq: torch.Tensor

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.width)
        self.layers = nn.ModuleList(LlamaLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.width, cfg.eps)
        self.head = nn.Linear(cfg.width, cfg.vocab_size, bias=False)
        self.head.weight = self.embed.weight
        dim = cfg.width // cfg.heads
        inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(self.norm(x))


class BertLike(nn.Module):
    """BERT-base: token, position and type embeddings, 12 post-norm nn.TransformerEncoderLayer, MLM head (tied)."""

    def __init__(self, vocab: int = 30522, width: int = 768, layers: int = 12, context: int = 512) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.type_emb = nn.Embedding(2, width)
        self.ln = nn.LayerNorm(width)
        self.drop = nn.Dropout(0.1)
        layer = nn.TransformerEncoderLayer(
            d_model=width, nhead=12, dim_feedforward=3072, batch_first=True, norm_first=False, activation="gelu"
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.transform = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width))
        self.decoder = nn.Linear(width, vocab)
        self.decoder.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.ln(self.tok(idx) + self.pos(pos) + self.type_emb(torch.zeros_like(idx))))
        return self.decoder(self.transform(self.encoder(x)))


def vision_model(name: str, image: int) -> nn.Module:
    if name.startswith("vit") and image != 224:  # the position embeddings are sized for the image
        import torchvision

        return torchvision.models.get_model(name, image_size=image)
    return torchvision_model(name)


# --- building a case -------------------------------------------------------

Runner = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Built:
    model: nn.Module
    # given the model to call (itself or torch.compile's wrapper): the loss (training) or output (inference)
    step: Callable[[Runner], torch.Tensor]
    optimizer: torch.optim.Optimizer | None
    optimizer_desc: str
    record: dict[str, Any] = field(default_factory=dict)


def adamw(params: Any, fused: bool, **kw: Any) -> tuple[torch.optim.Optimizer, str]:
    if fused:
        try:
            return torch.optim.AdamW(params, fused=True, **kw), f"AdamW({kw}, fused=True)"
        except (RuntimeError, ValueError) as e:  # fused kernels not offered for this device
            reason = f"; fused=True refused: {e}"
    else:
        reason = ", default foreach"
    return torch.optim.AdamW(params, **kw), f"AdamW({kw}){reason}"


def sgd(params: Any) -> tuple[torch.optim.Optimizer, str]:
    kw: dict[str, Any] = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}
    return torch.optim.SGD(params, **kw), f"SGD({kw}), default foreach"


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=ignore_index)


def build(case: Case, device: torch.device, sizes: Sizes) -> Built:
    """The model on `device`, a closure over one fixed batch, the optimizer (None for inference)."""
    torch.manual_seed(0)
    batch = sizes.batch(case)
    train = case.mode != "inference"
    if case.model in RNN_MODELS:
        model: nn.Module = RecurrentLM(*RNN_MODELS[case.model]).to(device)
        t = sizes.rnn_seq
        idx = torch.randint(0, RNN_VOCAB, (batch, t), device=device)
        tgt = torch.randint(0, RNN_VOCAB, (batch, t), device=device)
        opt, desc = adamw(model.parameters(), fused=True, lr=1e-3)
        return Built(
            model, lambda m: lm_loss(m(idx), tgt), opt, desc, {"sequence": t, "description": model.description}
        )
    if case.model == "llama160m":
        cfg = LlamaConfig(layers=sizes.layers(12), vocab_size=sizes.vocab(32000))
        model = Llama(cfg).to(device)
        t = sizes.llama_seq
        idx = torch.randint(0, cfg.vocab_size, (batch, t), device=device)
        tgt = torch.randint(0, cfg.vocab_size, (batch, t), device=device)
        opt, desc = adamw(model.parameters(), fused=False, lr=3e-4, weight_decay=0.1)
        text = (
            f"Llama-style decoder: width {cfg.width}, {cfg.layers} layers, {cfg.heads} heads, {cfg.kv_heads} kv heads "
            f"(repeated, F.scaled_dot_product_attention causal), SwiGLU {cfg.mlp_hidden}, RMSNorm (float32), rotary "
            f"(theta {cfg.rope_theta:g}), vocab {cfg.vocab_size}, tied head, loss in float32"
        )
        return Built(model, lambda m: lm_loss(m(idx), tgt), opt, desc, {"sequence": t, "description": text})
    if case.model == "bert_base":
        vocab = sizes.vocab(30522)
        model = BertLike(vocab, layers=sizes.layers(12)).to(device)
        t = sizes.bert_seq
        idx = torch.randint(0, vocab, (batch, t), device=device)
        tgt = torch.randint(0, vocab, (batch, t), device=device)
        tgt[torch.rand(batch, t, device=device) >= 0.15] = -100  # MLM: the loss over ~15% of the positions
        opt, desc = adamw(model.parameters(), fused=False, lr=1e-4, weight_decay=0.01)
        text = (
            f"BERT-base: embeddings {vocab}/512/2 + LayerNorm + dropout 0.1, {sizes.layers(12)} x "
            "nn.TransformerEncoderLayer(768, 12, "
            "3072, gelu, post-norm, dropout 0.1, batch_first), MLM head Linear+GELU+LayerNorm+tied decoder over "
            "all positions, loss over ~15% (ignore_index -100)"
        )
        return Built(model, lambda m: lm_loss(m(idx), tgt), opt, desc, {"sequence": t, "description": text})
    if case.model == "gpt2":
        model = GPT(GPTConfig(vocab_size=sizes.vocab(50257), layers=sizes.layers(12))).to(device)
        t = sizes.gpt_seq
        idx = torch.randint(0, model.cfg.vocab_size, (batch, t), device=device)
        tgt = torch.randint(0, model.cfg.vocab_size, (batch, t), device=device)
        opt, desc = adamw(model.parameters(), fused=False, lr=3e-4, weight_decay=0.1)
        text = (
            f"GPT-2 small (measure.models.GPT, {model.cfg.layers} layers, tied head), as training_validation builds it"
        )
        return Built(model, lambda m: lm_loss(m(idx), tgt), opt, desc, {"sequence": t, "description": text})
    image = sizes.image
    model = vision_model(case.model, image).to(device)
    x = torch.randn(batch, 3, image, image, device=device)
    if case.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    record: dict[str, Any] = {"image": image, "description": f"torchvision {case.model}"}
    if case.channels_last:
        record["memory_format"] = "channels_last (model and input)"
    if not train:
        return Built(model, lambda m: m(x), None, "", record)
    y = torch.randint(0, 1000, (batch,), device=device)
    if case.model.startswith(("swin", "vit")):
        opt, desc = adamw(model.parameters(), fused=False, lr=1e-3, weight_decay=0.05)
    else:
        opt, desc = sgd(model.parameters())
    return Built(model, lambda m: F.cross_entropy(m(x).float(), y), opt, desc, record)


# --- measuring -------------------------------------------------------------


class Backend:
    """torch.cuda, torch.emugpu or torch.cpu, with what torch.cpu lacks made harmless."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.module = getattr(torch, device.type)
        self.emulated = device.type == "emugpu"

    def _call(self, name: str, *args: Any) -> Any:
        fn = getattr(self.module, name, None) if self.device.type != "cpu" else None
        return fn(*args) if fn is not None else None

    def sync(self) -> None:
        self._call("synchronize", self.device)

    def empty_cache(self) -> None:
        self._call("empty_cache")

    def reset_peak(self) -> None:
        self._call("reset_peak_memory_stats", self.device)

    def peak_bytes(self) -> int | None:
        return self._call("max_memory_allocated", self.device)

    def reset_busy(self) -> None:
        if self.emulated:
            self.module.reset_engine_stats(self.device)

    def busy_s(self) -> float:
        return float(self.module.engine_stats(self.device)["compute_busy_s"])


def case_head(case: Case, sizes: Sizes) -> dict[str, Any]:
    return {
        "id": case.id,
        "model": case.model,
        "batch": sizes.batch(case),
        "precision": case.precision,
        "mode": case.mode,
    }


def measure(case: Case, device: torch.device, sizes: Sizes, warmup: int, iterations: int) -> dict[str, Any]:
    backend = Backend(device)
    gc.collect()
    backend.empty_cache()
    t_case = time.perf_counter()
    built = build(case, device, sizes)
    model, opt = built.model, built.optimizer
    train = opt is not None
    model.train(train)
    runner: Runner = model
    if case.mode == "compiled":
        runner = torch.compile(model)
    compile_s = None
    fwd, rest, busy = [], [], []
    grad: contextlib.AbstractContextManager[Any] = contextlib.nullcontext() if train else torch.no_grad()
    first = -1 if case.mode == "compiled" else 0  # iteration -1 compiles (forward and backward graphs)
    with grad:
        for i in range(first, warmup + iterations):
            if i == warmup:
                backend.reset_peak()
            backend.sync()
            backend.reset_busy()
            t0 = time.perf_counter()
            if opt is not None:
                opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=case.amp):
                out = built.step(runner)
            backend.sync()
            t1 = time.perf_counter()
            if opt is not None:
                out.backward()
                opt.step()
                backend.sync()
            t2 = time.perf_counter()
            del out
            if i < 0:
                compile_s = t2 - t0
            elif i >= warmup:
                fwd.append(t1 - t0)
                rest.append(t2 - t1)
                if backend.emulated:
                    busy.append(backend.busy_s())
    iters = [a + b for a, b in zip(fwd, rest, strict=True)] if train else fwd  # inference: iteration = forward
    entry = case_head(case, sizes)
    entry.update(built.record)
    entry.update(
        {
            "parameters": sum(p.numel() for p in model.parameters()),
            "optimizer": built.optimizer_desc or None,
            "forward_s": robust_median(fwd),
            "iteration_s": robust_median(iters),
            "peak_bytes": backend.peak_bytes(),
            "warmup": warmup,
            "samples": iterations,
            "iteration_samples_s": [round(s, 7) for s in iters],
        }
    )
    if train:
        entry["backward_step_s"] = robust_median(rest)
    if compile_s is not None:
        entry["compile_s"] = compile_s
        entry["compile"] = "torch.compile(model), default backend and mode; the optimizer step runs eager"
    if backend.emulated:
        # The emulated GPU's own time: on a host slower than the GPU the iteration waits for the host.
        entry["device_busy_s"] = robust_median(busy)
    entry["case_wall_s"] = round(time.perf_counter() - t_case, 3)
    return entry


def error_entry(case: Case, sizes: Sizes, e: BaseException, t0: float) -> dict[str, Any]:
    entry = case_head(case, sizes)
    text = "".join(traceback.format_exception_only(type(e), e)).strip()
    entry["error"] = text[-3000:]
    frames = traceback.extract_tb(e.__traceback__)
    if frames:
        last = frames[-1]
        entry["error_at"] = f"{Path(last.filename).name}:{last.lineno} in {last.name}"
    if isinstance(e, torch.OutOfMemoryError):
        entry["out_of_memory"] = True
    entry["case_wall_s"] = round(time.perf_counter() - t0, 3)
    return entry


# --- the run ---------------------------------------------------------------


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "emugpu":
        return "emulated " + torch.emugpu.get_device_name(device)  # type: ignore[attr-defined]
    return f"cpu {platform.processor() or platform.machine()}"


def provenance(device: torch.device, warmup: int, iterations: int, tiny: bool) -> dict[str, Any]:
    import torchvision

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tf32 = {
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "cudnn.benchmark": torch.backends.cudnn.benchmark,
        }
    prov: dict[str, Any] = {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "date": datetime.date.today().isoformat(),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "aggregation": f"median of {iterations} iterations after {warmup} warm-up, outliers beyond 3 MAD dropped",
        "settings": tf32,
        "defaults": "torch defaults: fp32 matmuls without TF32, cuDNN convolutions with TF32, cudnn.benchmark off",
        "tiny": tiny,
        # Where the extension is built, importing torch_emugpu.measure installs the emulator's module hooks too
        "torch_emugpu_extension_loaded": "torch_emugpu._C" in sys.modules,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        prov["gpu"] = torch.cuda.get_device_name(device)
        prov["capability"] = f"{props.major}.{props.minor}"
        prov["gpu_memory_bytes"] = props.total_memory
    if device.type == "emugpu":
        import torch_emugpu

        prov["torch_emugpu"] = torch_emugpu.__version__
        prov["emulator_config"] = repr(torch_emugpu.config())
    return prov


def summary_line(entry: dict[str, Any]) -> str:
    if "error" in entry:
        what = "out of memory" if entry.get("out_of_memory") else "ERROR"
        return f"{entry['id']:44} {what}: {entry['error'].splitlines()[-1][:160]}"
    peak = entry.get("peak_bytes")
    peak_text = f"{peak / 2**30:9.2f}" if peak is not None else f"{'-':>9}"
    line = f"{entry['id']:44} {entry['iteration_s'] * 1e3:11.2f} {entry['forward_s'] * 1e3:10.2f} {peak_text}"
    if "device_busy_s" in entry:
        line += f"  busy {entry['device_busy_s'] * 1e3:.2f} ms"
    if "compile_s" in entry:
        line += f"  compile {entry['compile_s']:.1f} s"
    return line


HEADER = f"{'case':44} {'iter ms':>11} {'fwd ms':>10} {'peak GiB':>9}"


def load(out: Path, label: str, tiny: bool) -> dict[str, Any] | None:
    if not out.is_file():
        return None
    doc: dict[str, Any] = json.loads(out.read_text())
    if doc.get("device") != label or doc.get("provenance", {}).get("tiny", False) != tiny:
        raise ValueError(
            f"{out} holds results for {doc.get('device')!r} (tiny={doc.get('provenance', {}).get('tiny')}), "
            f"not {label!r} (tiny={tiny}); use another --out"
        )
    return doc


class Progress:
    """A tqdm bar where installed and wanted, and lines printed without breaking it."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=f"unseen models on {label}", unit="case")
            except ImportError:
                pass

    def echo(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def start(self, case: Case) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(case.id)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_child(case: Case, args: argparse.Namespace, out: Path, cap_s: float) -> dict[str, Any] | None:
    """Measures `case` in a child process (this script, --in-process) killed after `cap_s` seconds.

    The child appends its entry to `out` itself; on a timeout or crash, the entry saying so is returned."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--in-process", "--no-progress", "--no-header"]
    cmd += ["--device", args.device, "--out", str(out), "--cases", case.id]
    cmd += ["--warmup", str(args.warmup), "--iterations", str(args.iterations)]
    if args.tiny:
        cmd.append("--tiny")
    t0 = time.perf_counter()
    # A session of its own, so that a timeout ends the compile workers too.
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        rc = proc.wait(timeout=cap_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        entry = error_entry(case, Sizes(args.tiny), TimeoutError(f"not finished within its cap of {cap_s:.0f} s"), t0)
        entry["timed_out"] = True
        return entry
    if rc != 0:
        return error_entry(case, Sizes(args.tiny), RuntimeError(f"child process exited with status {rc}"), t0)
    return None


def run(args: argparse.Namespace, device: torch.device, cases: list[Case]) -> dict[str, Any]:
    out = Path(args.out).resolve()
    sizes = Sizes(args.tiny)
    label = device_label(device)
    doc = load(out, label, args.tiny) or {
        "schema": "torch-emugpu unseen models v1",
        "device": label,
        "cases": [],
        "provenance": provenance(device, args.warmup, args.iterations, args.tiny),
    }
    done = {c["id"] for c in doc["cases"]}
    todo = [c for c in cases if c.id not in done]
    if not args.in_process:
        doc["run"] = {"budget_s": args.budget_s, "deadline_s": args.deadline_s, "started_at_s": round(elapsed(), 2)}
        write_json_atomic(out, doc)
    if not args.no_header:
        print(HEADER, flush=True)
    not_started: list[str] = []
    progress = Progress(len(todo), label, not args.no_progress)
    echo = progress.echo
    try:
        for n, case in enumerate(todo):
            now = elapsed()
            if not args.in_process and now > args.budget_s:
                not_started = [c.id for c in todo[n:]]
                echo(f"budget of {args.budget_s:.0f} s spent ({now:.0f} s): not started {', '.join(not_started)}")
                break
            progress.start(case)
            if not args.in_process and case.mode == "compiled":
                cap = min(args.compile_cap_s, args.deadline_s - now)
                if cap < 20:
                    not_started = [c.id for c in todo[n:]]
                    echo(f"{now:.0f} s: too little time left for {case.id}; not started {', '.join(not_started)}")
                    break
                doc["run"]["in_progress"] = case.id
                write_json_atomic(out, doc)
                gc.collect()
                Backend(device).empty_cache()  # the child gets the GPU memory this process cached
                failed = run_child(case, args, out, cap)
                doc = load(out, label, args.tiny) or doc
                if failed is not None and case.id not in {c["id"] for c in doc["cases"]}:
                    doc["cases"].append(failed)
                    echo(summary_line(failed))
            else:
                if not args.in_process:
                    doc["run"]["in_progress"] = case.id
                t0 = time.perf_counter()
                try:
                    entry = measure(case, device, sizes, args.warmup, args.iterations)
                except Exception as e:  # OutOfMemoryError included: recorded, and the run goes on
                    entry = error_entry(case, sizes, e, t0)
                doc["cases"].append(entry)
                echo(summary_line(entry))
            if not args.in_process:
                doc["run"].pop("in_progress", None)
                doc["run"]["elapsed_s"] = round(elapsed(), 2)
            write_json_atomic(out, doc)
            progress.advance()
    finally:
        progress.close()
    if not args.in_process:
        doc["run"]["not_started"] = not_started
        doc["run"]["elapsed_s"] = round(elapsed(), 2)
        write_json_atomic(out, doc)
        measured = sum(1 for c in doc["cases"] if "error" not in c)
        failed_n = sum(1 for c in doc["cases"] if "error" in c)
        print(
            f"{measured} cases measured, {failed_n} failed, {len(not_started)} not started; "
            f"{elapsed():.0f} s since the process started; {out}",
            flush=True,
        )
    return doc


def select(spec: str | None, parser: argparse.ArgumentParser) -> list[Case]:
    """Cases by id, or by model name (all of that model's cases), in CASES' order."""
    if not spec:
        return CASES
    wanted = {s.strip() for s in spec.split(",") if s.strip()}
    known = {c.id for c in CASES} | {c.model for c in CASES}
    unknown = wanted - known
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; known: {', '.join(c.id for c in CASES)}")
    return [c for c in CASES if c.id in wanted or c.model in wanted]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, cuda:N, emugpu, emugpu:N or cpu (default cuda)")
    p.add_argument("--out", help="JSON file; cases already in it are skipped")
    p.add_argument("--cases", default=None, help="comma-separated case ids or model names (default: all)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up iterations per case (default 3; --tiny 1)")
    p.add_argument("--iterations", type=int, default=None, help="measured iterations per case (default 8; --tiny 1)")
    p.add_argument("--budget-s", type=float, default=330, help="start no case after this many seconds (default 330)")
    p.add_argument(
        "--deadline-s",
        type=float,
        default=345,
        help="a compiled case's child is killed by then, seconds since the start (default 345)",
    )
    p.add_argument("--compile-cap-s", type=float, default=150, help="most seconds for one compiled case (default 150)")
    p.add_argument(
        "--tiny", action="store_true", help="dry run: batch 2, short sequences, 32x32 images, 2-layer transformers"
    )
    p.add_argument("--list", action="store_true", help="print the case ids and exit")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)  # a compiled case's child
    p.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.list:
        print("\n".join(c.id for c in CASES))
        return 0
    if not args.out:
        p.error("--out is required")
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    args.iterations = args.iterations if args.iterations is not None else (1 if args.tiny else 8)
    if args.iterations < 1 or args.warmup < 0:
        p.error("--iterations must be at least 1 and --warmup at least 0")
    cases = select(args.cases, p)
    device = torch.device(args.device)
    if device.type == "emugpu":
        import torch_emugpu  # noqa: F401  (registers the device; never imported on cuda or cpu)
    elif "torch_emugpu._C" in sys.modules and not args.in_process:
        print(
            "warning: torch_emugpu's compiled extension is loaded (importing torch_emugpu.measure loads it where "
            "it is built): the emulator's module hooks add host time, and torch.compile may fail; measure a real "
            "GPU where the extension is not built",
            file=sys.stderr,
        )
    run(args, device, cases)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
