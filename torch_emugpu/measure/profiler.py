"""Measures per-batch training timings on a real GPU (or on the CPU, as a stand-in
for tests) and writes torch-emugpu profile files.

Runs with plain PyTorch and torchvision: it does not need torch-emugpu's
compiled extension, so it can be copied to (or installed on) any CUDA machine:

    torch-emugpu profile --models resnet18,resnet50 --batch-sizes 1,2,4,8,16,32,64,128,256

For each model and batch size it measures, after warm-up, the forward pass
(`model(x)`), the backward+update (loss, zero_grad, backward, SGD step), the
host-to-device copy of one input batch (pageable and pinned) and the peak and
persistent memory, drops outliers (more than 3 median absolute deviations from
the median) and records the median. Output is resumable: batch sizes already in
a profile file are skipped unless --force.

Once per run, before it writes its first profile, it also measures the host's
cost per launched op (`host_cost.measure_host_cost`: a Python op, a module's
op, a backward op, an optimizer's parameter, in microseconds, and the CPU) and
writes it into each profile it writes as `provenance.host`; a profile that
already has one (a resumed file) keeps it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from torch_emugpu.measure.common import (
    VERSION,
    device_name,
    gpu_dir_name,
    robust_median,
    user_profile_dir,
    write_json_atomic,
)
from torch_emugpu.measure.host_cost import measure_host_cost
from torch_emugpu.measure.models import image_size, torchvision_model

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_HOST_PROBE_S = 1.0  # five probes: about 5 s once per run


def measure(name: str, batch_size: int, device: torch.device, warmup: int, iterations: int) -> dict[str, Any]:
    """One profile entry; raises torch.OutOfMemoryError when the batch does not fit."""
    cuda = device.type == "cuda"
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    if cuda:
        torch.cuda.empty_cache()
    model = torchvision_model(name).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    size = image_size(name)
    x_host = torch.randn(batch_size, 3, size, size)
    y = torch.randint(0, 1000, (batch_size,), device=device)
    x = x_host.to(device)
    forward, backward = [], []
    for i in range(warmup + iterations):
        sync()
        t0 = time.perf_counter()
        out = model(x)
        sync()
        t1 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sync()
        t2 = time.perf_counter()
        del out, loss
        if i >= warmup:
            forward.append(t1 - t0)
            backward.append(t2 - t1)
    entry: dict[str, Any] = {
        "batch_size": batch_size,
        "forward_s": robust_median(forward),
        "backward_s": robust_median(backward),
        "transfer_pageable_s": None,
        "transfer_pinned_s": None,
        "peak_bytes": None,
        "persistent_bytes": None,
    }
    if cuda:
        pinned = x_host.pin_memory()
        for key, src, non_blocking in (("transfer_pageable_s", x_host, False), ("transfer_pinned_s", pinned, True)):
            samples = []
            for _ in range(max(iterations, 3)):
                sync()
                t0 = time.perf_counter()
                src.to(device, non_blocking=non_blocking)
                sync()
                samples.append(time.perf_counter() - t0)
            entry[key] = robust_median(samples)
        torch.cuda.reset_peak_memory_stats(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        del loss
        sync()
        entry["peak_bytes"] = torch.cuda.max_memory_allocated(device)
        entry["persistent_bytes"] = torch.cuda.memory_allocated(device) - x.nbytes - y.nbytes
    return entry


def profile_path(out: Path, gpu: str, model: str) -> Path:
    return out / gpu_dir_name(gpu) / f"{model}.json"


def load_existing(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def run(
    models: list[str],
    batch_sizes: list[int],
    out: Path,
    device: torch.device,
    warmup: int = 3,
    iterations: int = 10,
    force: bool = False,
    progress: bool = True,
    host_probe_s: float = DEFAULT_HOST_PROBE_S,
) -> list[Path]:
    from tqdm import tqdm

    if not models:
        raise ValueError("expected at least one model name")
    if not batch_sizes or min(batch_sizes) < 1:
        raise ValueError(f"batch sizes must be integers >= 1, got {batch_sizes}")
    if warmup < 0 or iterations < 1:
        raise ValueError("warm-up must be >= 0 and iterations >= 1")
    if not host_probe_s > 0:
        raise ValueError(f"host probe time: expected seconds > 0, got {host_probe_s!r}")
    import torchvision

    known = set(torchvision.models.list_models(module=torchvision.models))
    unknown = [m for m in models if m not in known]
    if unknown:
        raise ValueError(f"unknown torchvision model(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    gpu = device_name(device)
    written = []
    jobs = [(m, b) for m in models for b in sorted(set(batch_sizes))]
    bar = tqdm(jobs, desc=f"profiling on {gpu}", unit="run", disable=not progress)
    stopped: set[str] = set()
    host: dict[str, Any] | None = None

    def write(path: Path, doc: dict[str, Any]) -> None:
        nonlocal host
        if "host" not in doc["provenance"]:
            if host is None:  # measured once per run, when the first profile is written
                host = measure_host_cost(device, seconds_per_probe=host_probe_s)
            doc["provenance"]["host"] = host
        write_json_atomic(path, doc)

    for model, bs in bar:
        bar.set_postfix_str(f"{model} @ {bs}")
        path = profile_path(out, gpu, model)
        doc = load_existing(path) if not force else None
        if doc is None:
            doc = {
                "schema": "torch-emugpu profile v1",
                "gpu": gpu,
                "model": model,
                "fingerprint": {"parameters": sum(p.numel() for p in torchvision_model(model).parameters())},
                "input": {"shape": [3, image_size(model), image_size(model)], "dtype": "float32"},
                "provenance": {
                    "tool": f"torch-emugpu profile {VERSION}",
                    "torch": torch.__version__,
                    "dtype": "float32",
                    "amp": False,
                    "optimizer": "SGD(lr=0.01, momentum=0.9, weight_decay=1e-4)",
                    "aggregation": f"median of {iterations} iterations after {warmup} warm-up, "
                    "outliers beyond 3 MAD dropped",
                    "date": datetime.date.today().isoformat(),
                    "source": f"measured on {gpu} ({socket.gethostname()})",
                },
                "batches": [],
            }
        if model in stopped or any(b["batch_size"] == bs for b in doc["batches"]):
            continue
        try:
            entry = measure(model, bs, device, warmup, iterations)
        except torch.OutOfMemoryError:
            stopped.add(model)
            doc["provenance"]["note"] = f"batch size {bs} and larger did not fit in memory"
            write(path, doc)
            continue
        doc["batches"] = sorted([*doc["batches"], entry], key=lambda b: b["batch_size"])
        write(path, doc)
        if path not in written:
            written.append(path)
    return written


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default=None, help="comma-separated torchvision model names, e.g. resnet18,resnet50")
    p.add_argument(
        "--preprocessing",
        action="store_true",
        help="measure GPU-side image preprocessing (nvJPEG decode, resize, crop, flip, normalize) instead of models",
    )
    p.add_argument(
        "--batch-sizes",
        default=",".join(map(str, DEFAULT_BATCH_SIZES)),
        help="comma-separated batch sizes (default: 1,2,4,...,256)",
    )
    p.add_argument("--device", default="auto", help="cuda, cuda:N or cpu (default: cuda if available, else cpu)")
    p.add_argument("--out", default=None, help="output directory (default: the user profile directory)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up iterations per batch size (default: 3)")
    p.add_argument("--iterations", type=int, default=10, help="measured iterations per batch size (default: 10)")
    p.add_argument("--force", action="store_true", help="measure batch sizes already in the output again")
    p.add_argument(
        "--host-probe-seconds",
        type=float,
        default=DEFAULT_HOST_PROBE_S,
        help=f"time of each of the five host-cost probes, measured once per run (default: {DEFAULT_HOST_PROBE_S:g})",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def main(args: argparse.Namespace) -> int:
    try:
        sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--batch-sizes: expected comma-separated integers, got {args.batch_sizes!r}") from None
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA GPU is available on this machine; use --device cpu")
    out = Path(args.out) if args.out else user_profile_dir()
    if args.preprocessing:
        from torch_emugpu.measure import preprocessing_profiler

        print(preprocessing_profiler.run(out, device, progress=not args.no_progress))
        if not args.models:
            return 0
    if not args.models:
        raise ValueError("--models: expected comma-separated torchvision model names (or --preprocessing)")
    paths = run(
        [m.strip() for m in args.models.split(",") if m.strip()],
        sizes,
        out,
        device,
        args.warmup,
        args.iterations,
        args.force,
        progress=not args.no_progress,
        host_probe_s=args.host_probe_seconds,
    )
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m torch_emugpu.measure.profiler",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
