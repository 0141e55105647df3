"""The emulated GPU's busy time per training iteration of the four models of
the H100 per-kernel traces (`../shared/h100-traces/`: an LSTM language model
and ConvNeXt-T in fp32, GPT-2 and ViT-B/16 under bf16 autocast) against what
the traces say a real H100 took: the sum of its kernels' time per iteration
and, where the traces' README gives it, the iteration's wall time (kernels
overlap: cuDNN's LSTM runs its layers as a wavefront, so the kernels' sum
exceeds the wall time there). The traces are read where they lie and nothing
from them is written: the script prints its comparison only.

Profiles are off (the cost model alone) and the shipped H100 calibration on;
the emulated busy time is the compute engine's, so the host does not count.

    EMUGPU_PROFILES=off .venv/bin/python benchmarks/trace_models.py --traces ../shared/h100-traces
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("EMUGPU_PROFILES", "off")
os.environ.setdefault("EMUGPU_GPU", "h100")
os.environ.setdefault("EMUGPU_CLOCK", "virtual")

import torch
from torch import nn
from torch.nn import functional as F

import torch_emugpu  # noqa: F401  (registers the emugpu device)
from torch_emugpu.measure.models import GPT, GPTConfig, torchvision_model

Step = Callable[[], None]


class LstmLm(nn.Module):
    """Embedding(10000, 1024) -> nn.LSTM(1024, 1024, num_layers=2, batch_first=True) -> Linear(1024, 10000)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10000, 1024)
        self.rnn = nn.LSTM(1024, 1024, num_layers=2, batch_first=True)
        self.head = nn.Linear(1024, 10000)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(tokens))[0])


def lstm_lm(device: torch.device) -> Step:
    model = LstmLm().to(device)
    tokens = torch.randint(0, 10000, (64, 256), device=device)
    targets = torch.randint(0, 10000, (64, 256), device=device)
    opt = torch.optim.AdamW(model.parameters(), fused=True)

    def step() -> None:
        loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def vision(name: str, batch: int, bf16: bool, device: torch.device) -> Step:
    model = torchvision_model(name).to(device)
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    if bf16:
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters())
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def gpt2(device: torch.device) -> Step:
    model = GPT(GPTConfig()).to(device)
    idx = torch.randint(0, 50257, (8, 1024), device=device)
    tgt = torch.randint(0, 50257, (8, 1024), device=device)
    opt = torch.optim.AdamW(model.parameters())

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(idx)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


MODELS: dict[str, tuple[str, Callable[[torch.device], Step]]] = {
    "lstm_lm": ("lstm_lm_b64_fp32.csv", lstm_lm),
    "convnext_tiny": ("convnext_tiny_b64_fp32.csv", lambda d: vision("convnext_tiny", 64, False, d)),
    "gpt2": ("gpt2_bf16_b8.csv", gpt2),
    "vit_b_16": ("vit_b_16_bf16_b32.csv", lambda d: vision("vit_b_16", 32, True, d)),
}


def trace_kernel_ms(path: Path) -> float:
    """The kernels' device time per iteration (the file covers three)."""
    with path.open() as f:
        return sum(float(row["device_us_3_iters"]) for row in csv.DictReader(f)) / 3 / 1e3


def trace_wall_ms(readme: Path) -> dict[str, float]:
    """Wall times per iteration from the README's table, by file name, where it gives one."""
    walls: dict[str, float] = {}
    for line in readme.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and cells[0].endswith(".csv") and re.fullmatch(r"[0-9.]+", cells[-1]):
            walls[cells[0]] = float(cells[-1])
    return walls


def emulated_busy_ms(make: Callable[[torch.device], Step], warmup: int, iterations: int) -> tuple[float, float]:
    """The median compute-engine busy time per iteration, and the peak memory allocated (GiB)."""
    device = torch.device("emugpu")
    step = make(device)
    busy = []
    for i in range(warmup + iterations):
        if i == warmup:
            torch.emugpu.reset_peak_memory_stats(device)
        torch.emugpu.synchronize(device)
        torch.emugpu.reset_engine_stats(device)
        step()
        torch.emugpu.synchronize(device)
        if i >= warmup:
            busy.append(torch.emugpu.engine_stats(device)["compute_busy_s"] * 1e3)
    peak = torch.emugpu.max_memory_allocated(device) / 2**30
    del step
    torch.emugpu.empty_cache()
    return statistics.median(busy), peak


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--traces", default="../shared/h100-traces", help="the traces' folder (default ../shared/h100-traces)"
    )
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default: {','.join(MODELS)})")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iterations", type=int, default=2)
    args = p.parse_args()
    traces = Path(args.traces)
    walls = trace_wall_ms(traces / "README.md")
    names = [m for m in args.models.split(",") if m]
    unknown = set(names) - set(MODELS)
    if unknown:
        p.error(f"unknown model(s) {sorted(unknown)}; known: {', '.join(MODELS)}")
    print(
        f"{'model':15} {'emulated ms':>12} {'kernels ms':>11} {'error':>8} {'wall ms':>8} {'error':>8} {'peak GiB':>9}"
    )
    for name in names:
        file, make = MODELS[name]
        busy, peak = emulated_busy_ms(make, args.warmup, args.iterations)
        kernels = trace_kernel_ms(traces / file)
        wall = walls.get(file)
        wall_text = f"{wall:8.1f} {busy / wall - 1:+8.1%}" if wall else f"{'-':>8} {'':>8}"
        print(f"{name:15} {busy:12.1f} {kernels:11.1f} {busy / kernels - 1:+8.1%} {wall_text} {peak:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
