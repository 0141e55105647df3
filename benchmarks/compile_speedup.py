"""torch.compile against eager on one emulated GPU: the speed-up fusion explains.

Each case trains the same model eagerly, then under `torch.compile(model)`
(the default backend; the optimizer step stays eager), in one process, and
prints the emulated GPU's busy time per iteration of each, their ratio, the
kernels launched per iteration and the host time of the first compiled
iteration (compilation: host time, never charged to the emulated GPU). Profiles
are off: a measured profile fixes the totals of eager runs, so only the cost
model can say what fusion changes.

Beside the ratio stands the ratio measured on a real H100 for the same case,
where `benchmarks/data/h100/unseen.json` has it (GPT-2 small batch 8 and
ResNet-50 batch 128, bf16 autocast, measured with benchmarks/unseen_models.py).

    python benchmarks/compile_speedup.py [--gpu h100] [--cases gpt2:8:bf16,resnet50:128:bf16] [--iters 3]

A case is MODEL:BATCH:PRECISION with MODEL gpt2 (GPT-2 small, sequence 1024,
torch_emugpu.measure.models) or a torchvision classifier, PRECISION fp32 or
bf16 (autocast). Target: compiled at least as fast as eager for every case
(ratio >= 1).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("EMUGPU_PROFILES", "off")  # before torch autoloads the device: the cost model alone

import torch
import torch.nn.functional as F

import torch_emugpu
from torch_emugpu import _C
from torch_emugpu.measure import models

REAL = pathlib.Path(__file__).parent / "data" / "h100" / "unseen.json"


@dataclass
class Result:
    busy_ms: float
    kernels: float
    first_s: float


def make_step(name: str, batch: int, precision: str) -> tuple[torch.nn.Module, Callable[[torch.nn.Module], None]]:
    """The model on emugpu and one training step of it (forward, loss, backward, optimizer step)."""
    device = torch.device("emugpu")
    autocast = torch.autocast("emugpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    if name == "gpt2":
        model: torch.nn.Module = models.GPT(models.GPT2_SMALL).to(device)
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        idx = torch.randint(0, 50257, (batch, 1024), device=device)
        targets = torch.randint(0, 50257, (batch, 1024), device=device)

        def loss_of(m: torch.nn.Module) -> torch.Tensor:
            logits = m(idx)
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    else:
        model = models.torchvision_model(name).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        size = models.image_size(name)
        images = torch.randn(batch, 3, size, size, device=device)
        labels = torch.randint(0, 1000, (batch,), device=device)

        def loss_of(m: torch.nn.Module) -> torch.Tensor:
            return F.cross_entropy(m(images), labels)

    def step(m: torch.nn.Module) -> None:
        with autocast:
            loss = loss_of(m)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step


def measure(step: Callable[[torch.nn.Module], None], model: torch.nn.Module, iters: int) -> Result:
    t0 = time.perf_counter()
    step(model)  # the compiled case compiles its forward and backward graphs here
    torch.emugpu.synchronize()  # type: ignore[attr-defined]
    first = time.perf_counter() - t0
    step(model)
    torch.emugpu.synchronize()  # type: ignore[attr-defined]
    launches0, busy0 = _C._engine_stats(0)["compute"]
    for _ in range(iters):
        step(model)
    torch.emugpu.synchronize()  # type: ignore[attr-defined]
    launches1, busy1 = _C._engine_stats(0)["compute"]
    return Result((busy1 - busy0) / iters / 1e6, (launches1 - launches0) / iters, first)


def real_ratio(name: str, batch: int, precision: str) -> tuple[float, float] | None:
    """(eager, compiled) iteration seconds measured on the H100, if this case was measured."""
    if not REAL.exists():
        return None
    cases = {c["id"]: c for c in json.loads(REAL.read_text())["cases"]}
    label = "bf16-autocast" if precision == "bf16" else "fp32"
    eager, compiled = cases.get(f"{name}/b{batch}/{label}"), cases.get(f"{name}/b{batch}/{label}/compiled")
    if eager is None or compiled is None:
        return None
    return eager["iteration_s"], compiled["iteration_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--cases", default="gpt2:8:bf16,resnet50:128:bf16")
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    torch_emugpu.configure(gpu=args.gpu)
    print(f"emulated GPU: {torch.emugpu.get_device_name(0)}; profiles off; timing mode")  # type: ignore[attr-defined]
    print(
        f"{'case':<24} {'eager ms':>9} {'compiled ms':>11} {'ratio':>6} {'kernels eager/compiled':>23} "
        f"{'first compiled iter s':>21} {'real H100 ratio':>16}"
    )
    for spec in args.cases.split(","):
        name, batch_text, precision = spec.split(":")
        batch = int(batch_text)
        model, step = make_step(name, batch, precision)
        eager = measure(step, model, args.iters)
        compiled = measure(step, torch.compile(model), args.iters)  # type: ignore[arg-type]
        real = real_ratio(name, batch, precision)
        real_text = f"{real[0] / real[1]:.2f} ({real[0] * 1e3:.1f}/{real[1] * 1e3:.1f} ms)" if real else "-"
        print(
            f"{spec:<24} {eager.busy_ms:>9.2f} {compiled.busy_ms:>11.2f} {eager.busy_ms / compiled.busy_ms:>6.2f} "
            f"{eager.kernels:>11.0f}/{compiled.kernels:<11.0f} {compiled.first_s:>21.1f} {real_text:>16}",
            flush=True,
        )
        del model, step
        torch._dynamo.reset()
    print(f"compiled graphs: {torch_emugpu.compile.stats()}")
    print(
        "published: PyTorch 2.0's announcement (pytorch.org/get-started/pytorch-2.0) reports torch.compile "
        "training speed-ups over 163 open-source models (TIMM, Hugging Face, TorchBench) on an A100 of 43% on "
        "average: 21% in float32, 51% with AMP"
    )


if __name__ == "__main__":
    main()
