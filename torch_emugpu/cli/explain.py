"""`torch-emugpu explain --model resnet50 --gpu a100`: what the per-op cost
model charges a model's training iteration, per op family, and why.

It runs training iterations of the model with profiles switched off (the
cost model is the only time source) and prints `torch_emugpu.cost_report()`
(torch_emugpu/device/cost_report.py): per family the kernels, the time
charged and its share, the achieved FLOP/s and bytes/s, the same work at the
GPU's peak rates as a share of the time charged, and whether the family was
compute- or memory-bound. Then, per finer family (an LSTM, a depthwise 7x7
convolution, a matmul), the rule of the cost model that timed it, its share
of the time and its ops, so that one can see why a model is fast or slow.
With `--profiles`, a profile that matches the model stays on: its regions are
listed too, with how their targets were made (a profiled batch size, or the
cost model's curve between two), since their time comes from the profile.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from torch_emugpu import _C
from torch_emugpu.device import device_module
from torch_emugpu.device.cost_report import cost_report, kernel_params, reset_cost_report


def format_cost_report(rows: list[dict[str, Any]], per: int = 1) -> str:
    """A table of cost_report() rows; times divided by `per` (e.g. iterations)."""
    head = f"{'family':<34} {'kernels':>8} {'time ms':>9} {'share':>6} {'TFLOP/s':>8} {'GB/s':>8} {'of peak':>8}  bound"
    lines = [head, "-" * len(head)]
    for r in rows:
        peak = r["compute_of_peak"] if r["bound"] == "compute" else r["memory_of_peak"]
        lines.append(
            f"{r['family']:<34} {r['kernels'] // per:>8} {r['time_s'] * 1e3 / per:>9.3f} "
            f"{r['share']:>6.1%} {r['tflops']:>8.2f} {r['gbps']:>8.1f} {peak:>8.1%}  {r['bound']}"
        )
    total = sum(r["time_s"] for r in rows)
    lines.append(f"{'total':<34} {sum(r['kernels'] for r in rows) // per:>8} {total * 1e3 / per:>9.3f}")
    return "\n".join(lines)


def rule_rows(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Traced ops grouped by (finer family, rule): ops, time and share, the most time first."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for op in trace:
        key = (op["rule_family"], op["rule"])
        row = groups.setdefault(key, {"family": key[0], "rule": key[1], "ops": 0, "time_s": 0.0})
        row["ops"] += 1
        row["time_s"] += op["charged_ns"] / 1e9
    total = sum(r["time_s"] for r in groups.values()) or 1.0
    rows = sorted(groups.values(), key=lambda r: -r["time_s"])
    for r in rows:
        r["share"] = r["time_s"] / total
    return rows


def format_rule_rows(rows: list[dict[str, Any]], per: int = 1) -> str:
    """A table of rule_rows(): family -> rule -> time share -> op count (ops and time divided by `per`)."""
    head = f"{'family':<32} {'rule':<44} {'share':>6} {'ops':>7} {'time ms':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['family']:<32} {r['rule']:<44} {r['share']:>6.1%} {r['ops'] // per:>7} {r['time_s'] * 1e3 / per:>9.3f}"
        )
    return "\n".join(lines)


def format_profiled_regions(regions: list[dict[str, Any]]) -> str:
    """Regions whose time a profile set: their target and how it was made."""
    lines = []
    for r in regions:
        if r.get("target_s") is None:
            continue
        lo, hi = r.get("between", [None, None])
        how = r.get("target_from", "profile")
        if how != "profile point" and lo is not None:
            how += f" through batch sizes {lo} and {hi}"
        lines.append(f"{r['key']:<40} profiled region: {r['target_s'] * 1e3:.3f} ms ({how})")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a torchvision classifier (resnet50, vit_b_16, ...) or gpt2")
    p.add_argument("--gpu", default=None, help="the emulated GPU (default: EMUGPU_GPU or the catalog's default)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size (default 32)")
    p.add_argument("--seq-len", type=int, default=512, help="sequence length for gpt2 (default 512)")
    p.add_argument(
        "--amp", choices=["none", "bf16", "fp16"], default="none", help="autocast dtype (default none: float32)"
    )
    p.add_argument("--iterations", type=int, default=2, help="training iterations measured (default 2)")
    p.add_argument(
        "--profiles",
        action="store_true",
        help="keep measured profiles on: a matching profile times the model's regions (listed as profiled regions)",
    )


def _model_and_step(args: argparse.Namespace, device: torch.device) -> Callable[[], None]:
    from torch_emugpu.measure.models import GPT, GPTConfig, gpt_loss, image_size, torchvision_model

    amp = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.amp]
    net: torch.nn.Module
    if args.model == "gpt2":
        gpt = GPT(GPTConfig(context=max(1024, args.seq_len))).to(device)
        x = torch.randint(0, gpt.cfg.vocab_size, (args.batch_size, args.seq_len), device=device)

        def loss_fn() -> torch.Tensor:
            return gpt_loss(gpt, x, x)

        net = gpt
    else:
        net = torchvision_model(args.model).to(device)
        size = image_size(args.model)
        x = torch.randn(args.batch_size, 3, size, size, device=device)
        y = torch.randint(0, 1000, (args.batch_size,), device=device)

        def loss_fn() -> torch.Tensor:
            return torch.nn.functional.cross_entropy(net(x), y)

    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

    def step() -> None:
        with torch.autocast("emugpu", dtype=amp or torch.float32, enabled=amp is not None):
            loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main(args: argparse.Namespace) -> int:
    if args.batch_size < 1 or args.iterations < 1 or args.seq_len < 1:
        raise ValueError("--batch-size, --iterations and --seq-len must be at least 1")
    if not args.profiles:
        os.environ["EMUGPU_PROFILES"] = "off"  # the cost model is the only time source
    import torch_emugpu

    warnings.filterwarnings("ignore", message=".*no profile matched.*")  # on purpose here

    torch_emugpu.configure(gpu=args.gpu)
    device = torch.device("emugpu", 0)
    step = _model_and_step(args, device)
    step()  # warm-up: shapes are learnt, optimizer state allocated
    device_module.synchronize()
    reset_cost_report()
    device_module.reset_engine_stats()
    _C._cost_trace_start(0, 1 << 22)
    t0 = time.perf_counter()
    for _ in range(args.iterations):
        step()
    device_module.synchronize()
    wall = time.perf_counter() - t0
    rows = cost_report()
    rules = rule_rows(_C._cost_trace(0))
    busy = device_module.engine_stats()["compute_busy_s"]
    print(
        f"{args.model}, batch {args.batch_size}, {args.amp if args.amp != 'none' else 'float32'}, on "
        f"{device_module.get_device_name()} ({'profiles on' if args.profiles else 'cost model only'}), "
        f"per training iteration (AdamW):"
    )
    print(format_cost_report(rows, per=args.iterations))
    print("\nthe rule that timed each family:")
    print(format_rule_rows(rules, per=args.iterations))
    if args.profiles:
        profiled = format_profiled_regions(torch_emugpu.region_report())
        print("\n" + (profiled or "no profile matched: every op's time is the cost model's above"))
    params = kernel_params()
    print(f"kernel parameters: {params.pop('source')} (" + ", ".join(f"{k} {v:.3g}" for k, v in params.items()) + ")")
    print(
        f"compute engine busy {busy * 1e3 / args.iterations:.3f} ms per iteration; "
        f"host wall {wall * 1e3 / args.iterations:.1f} ms per iteration here"
    )
    return 0
