"""End-to-end training iterations of the validation models, timed on a real
GPU (`--device cuda`, plain PyTorch: no compiled extension needed) or on an
emulated one (`--device emugpu`), so that the two can be put side by side.

Cases: resnet50 and vit_b_16 (torchvision), a GPT-2-small decoder (124 M
parameters) and a 1 B-parameter decoder of the same layout, each at two batch
sizes, in float32 and with bfloat16 autocast. Each case times warm-up plus
measured iterations of zero_grad, forward, loss, backward and optimizer step,
synchronising after the forward and after the step, and records the medians
(outliers beyond 3 MAD dropped) and the peak device memory. Cases that do not
fit are recorded as such.

    python benchmarks/training_validation.py --device cuda --out h100.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torch_emugpu.measure.common import robust_median, write_json_atomic
from torch_emugpu.measure.models import GPT, GPTConfig, torchvision_model

GPT_1B = GPTConfig(layers=18, heads=16, width=2048)  # 1.01 B parameters, GPT-2's layout


@dataclass(frozen=True)
class Case:
    model: str
    batch: int
    precision: str  # "fp32" or "bf16-autocast"

    @property
    def id(self) -> str:
        return f"{self.model}/b{self.batch}/{self.precision}"


MODELS = {"resnet50": (64, 128), "vit_b_16": (32, 64), "gpt2": (8, 16), "gpt-1b": (2, 4)}
CASES = [Case(m, b, p) for m, sizes in MODELS.items() for b in sizes for p in ("fp32", "bf16-autocast")]
SEQ = 1024


def build(
    case: Case, device: torch.device
) -> tuple[torch.nn.Module, Callable[[], torch.Tensor], torch.optim.Optimizer, str]:
    """The model on `device`, a loss closure over one fixed batch, the optimizer and its description."""
    if case.model.startswith("gpt"):
        model = GPT(GPT_1B if case.model == "gpt-1b" else GPTConfig()).to(device)
        idx = torch.randint(0, model.cfg.vocab_size, (case.batch, SEQ), device=device)
        tgt = torch.randint(0, model.cfg.vocab_size, (case.batch, SEQ), device=device)

        def loss() -> torch.Tensor:
            logits = model(idx)
            return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))

        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        return model, loss, opt, "AdamW(lr=3e-4, weight_decay=0.1), default foreach"
    model = torchvision_model(case.model).to(device)
    x = torch.randn(case.batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (case.batch,), device=device)

    def loss() -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(x).float(), y)

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    return model, loss, opt, "SGD(lr=0.01, momentum=0.9, weight_decay=1e-4), default foreach"


def measure(case: Case, device: torch.device, warmup: int, iterations: int) -> dict[str, Any]:
    backend = getattr(torch, device.type)

    def sync() -> None:
        backend.synchronize(device)

    backend.empty_cache()
    model, loss_fn, opt, opt_desc = build(case, device)
    model.train()
    amp = case.precision == "bf16-autocast"
    fwd, bwd, busy = [], [], []
    emulated = device.type == "emugpu"
    for i in range(warmup + iterations):
        if i == warmup:
            backend.reset_peak_memory_stats(device)
        sync()
        if emulated:
            torch.emugpu.reset_engine_stats(device)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn()
        sync()
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        t2 = time.perf_counter()
        del loss
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            if emulated:
                busy.append(torch.emugpu.engine_stats(device)["compute_busy_s"])
    entry = {
        "id": case.id,
        "model": case.model,
        "batch": case.batch,
        "precision": case.precision,
        "parameters": sum(p.numel() for p in model.parameters()),
        "optimizer": opt_desc,
        "forward_s": robust_median(fwd),
        "backward_step_s": robust_median(bwd),
        "iteration_s": robust_median([a + b for a, b in zip(fwd, bwd, strict=True)]),
        "peak_bytes": backend.max_memory_allocated(device),
        "samples": iterations,
    }
    if case.model.startswith("gpt"):
        entry["sequence"] = SEQ
    if emulated:
        # The emulated GPU's own time: on a host slower than the GPU the
        # iteration waits for the host (as it would on a real machine with that host).
        entry["device_busy_s"] = robust_median(busy)
    del model, opt, loss_fn
    return entry


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "emugpu":
        return "emulated " + torch.emugpu.get_device_name(device)
    return "cpu"


def run(
    out: Path, device: torch.device, cases: list[Case], warmup: int, iterations: int, progress: bool = True
) -> dict[str, Any]:
    from tqdm import tqdm

    label = device_label(device)
    doc: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    if doc and doc.get("device") != label:
        raise ValueError(f"{out} holds results for {doc.get('device')!r}, not {label!r}; use another --out")
    doc = doc or {
        "schema": "torch-emugpu training validation v1",
        "device": label,
        "cases": [],
        "provenance": {
            "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "host": socket.gethostname(),
            "aggregation": f"median of {iterations} iterations after {warmup} warm-up, outliers beyond 3 MAD dropped",
            "defaults": "torch defaults: fp32 matmuls without TF32, cuDNN convolutions with TF32, cudnn.benchmark off",
        },
    }
    done = {c["id"] for c in doc["cases"]}
    bar = tqdm(cases, desc=f"training on {label}", unit="case", disable=not progress)
    for case in bar:
        bar.set_postfix_str(case.id)
        if case.id in done:
            continue
        try:
            entry = measure(case, device, warmup, iterations)
        except torch.OutOfMemoryError:
            entry = {
                "id": case.id,
                "model": case.model,
                "batch": case.batch,
                "precision": case.precision,
                "out_of_memory": True,
            }
        doc["cases"].append(entry)
        write_json_atomic(out, doc)
    return doc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, cuda:N, emugpu or emugpu:N (default cuda)")
    p.add_argument("--out", required=True, help="JSON file; cases already in it are skipped")
    p.add_argument("--cases", default=None, help="comma-separated case ids (default: all), e.g. resnet50/b64/fp32")
    p.add_argument("--warmup", type=int, default=5, help="warm-up iterations per case (default 5)")
    p.add_argument("--iterations", type=int, default=10, help="measured iterations per case (default 10)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument(
        "--compare",
        default=None,
        metavar="JSON",
        help="print this run beside another device's results (e.g. benchmarks/data/h100/validation.json)",
    )
    args = p.parse_args()
    cases = CASES
    if args.cases:
        wanted = set(args.cases.split(","))
        unknown = wanted - {c.id for c in CASES}
        if unknown:
            p.error(f"unknown case(s) {sorted(unknown)}; known: {', '.join(c.id for c in CASES)}")
        cases = [c for c in CASES if c.id in wanted]
    doc = run(
        Path(args.out), torch.device(args.device), cases, args.warmup, args.iterations, progress=not args.no_progress
    )
    if args.compare:
        compare(json.loads(Path(args.compare).read_text()), doc)
        return 0
    print(f"{'case':28} {'iteration ms':>13} {'forward ms':>11} {'peak GiB':>9}")
    for c in doc["cases"]:
        if c.get("out_of_memory"):
            print(f"{c['id']:28} {'out of memory':>13}")
        else:
            print(
                f"{c['id']:28} {c['iteration_s'] * 1e3:13.2f} {c['forward_s'] * 1e3:11.2f} "
                f"{c['peak_bytes'] / 2**30:9.2f}"
            )
    return 0


def compare(reference: dict[str, Any], doc: dict[str, Any]) -> None:
    """Per case, this run's iteration time and peak memory against the reference's (signed error)."""
    import statistics

    ref = {c["id"]: c for c in reference["cases"] if not c.get("out_of_memory")}
    print(f"{doc['device']} against {reference['device']}")
    print(
        f"{'case':28} {'ref ms':>9} {'this ms':>9} {'error':>8} {'GPU busy':>9} {'error':>8} {'ref GiB':>8} "
        f"{'this GiB':>9} {'error':>8}"
    )
    errors: dict[str, list[float]] = {}
    busy_errors: dict[str, list[float]] = {}
    for c in doc["cases"]:
        r = ref.get(c["id"])
        if r is None or c.get("out_of_memory"):
            continue
        e = c["iteration_s"] / r["iteration_s"] - 1
        m = c["peak_bytes"] / r["peak_bytes"] - 1
        errors.setdefault(c["precision"], []).append(e)
        busy = c.get("device_busy_s")
        if busy is not None:
            busy_errors.setdefault(c["precision"], []).append(busy / r["iteration_s"] - 1)
        busy_text = f"{busy * 1e3:9.2f} {busy / r['iteration_s'] - 1:+8.1%}" if busy is not None else " " * 18
        print(
            f"{c['id']:28} {r['iteration_s'] * 1e3:9.2f} {c['iteration_s'] * 1e3:9.2f} {e:+8.1%} {busy_text} "
            f"{r['peak_bytes'] / 2**30:8.2f} {c['peak_bytes'] / 2**30:9.2f} {m:+8.1%}"
        )
    for label, table in (("iteration (wall)", errors), ("emulated GPU busy", busy_errors)):
        every = [e for es in table.values() for e in es]
        for precision, es in [*table.items(), ("all", every)]:
            print(
                f"{label}, {precision}: median |error| {statistics.median(abs(e) for e in es):.1%}, "
                f"median signed {statistics.median(es):+.1%} over {len(es)} cases"
            )


if __name__ == "__main__":
    raise SystemExit(main())
