"""The data-stall main job: `torch-emugpu train --data DIR` trains a
torchvision classifier on a real image folder through a torchvision
DataLoader (worker processes decoding and augmenting on the CPU, pin_memory,
prefetch), on an emulated GPU, and says where each epoch's time went.

The split follows DS-Analyzer's differential method (Mohan et al., "Analyzing
and Mitigating Data Stalls in DNN Training", VLDB 2021):

1. the GPU alone: iterations on a batch already on the device give the time
   the GPU needs per batch (its demand, in images/s);
2. a baseline epoch with every file in the page cache: the GPU time the
   epoch lacks beyond (1) and beyond the copies is the preprocessing stall
   (the CPU pipeline, and the training loop's own host work);
3. the epochs asked for, with `--cache-fraction` of the files cached and the
   rest dropped from the page cache (posix_fadvise DONTNEED): what they lack
   beyond the baseline is the fetch stall.

Per epoch it reports the epoch time, images/s, the GPU-busy fraction (the
emulated compute engine), accelerator utilisation as MLPerf Storage defines it
(compute time the GPU needed over the epoch's time), the fetch, preprocessing
and transfer stalls (transfer: the copy engine's time moving input batches,
which a loop that copies on its compute stream waits for), the time the loop
waited for batches, peak device memory, and the host pipeline's rate
next to the GPU's demand. `--timeline PNG` draws the last epoch.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

import torch_emugpu
from torch_emugpu import _C
from torch_emugpu.data import WorkerDiedError, datasets, death_hint, exit_description
from torch_emugpu.data.preprocessing import MEAN, STD, train_batch_on_device
from torch_emugpu.device import device_module
from torch_emugpu.measure.common import atomic_output
from torch_emugpu.measure.models import torchvision_model


@dataclass
class EpochReport:
    label: str
    images: int
    epoch_s: float
    gpu_busy_s: float  # emulated compute engine busy
    gpu_needed_s: float  # iterations x the GPU-alone time per iteration
    transfer_s: float  # host-to-device copy engine busy
    data_wait_s: float  # host time blocked in the loader
    cached_fraction: float
    cache_note: str | None
    peak_bytes: int
    fetch_stall_s: float = 0.0
    prep_stall_s: float = 0.0
    timeline: dict[str, list[tuple[float, float]]] = field(default_factory=dict, repr=False)

    @property
    def images_per_s(self) -> float:
        return self.images / self.epoch_s

    @property
    def au(self) -> float:
        """MLPerf Storage's accelerator utilisation: compute time over the epoch's time."""
        return min(1.0, self.gpu_needed_s / self.epoch_s)

    @property
    def data_stall_s(self) -> float:
        """The epoch's time the GPU did not compute and did not wait for copies."""
        return max(0.0, self.epoch_s - self.gpu_busy_s - self.transfer_s)


@dataclass
class DataTrainResult:
    model: str
    gpu: str
    batch_size: int
    workers: int
    pin_memory: bool
    gpu_preprocessing: bool
    gpu_iteration_s: float
    pipeline_images_per_s: float
    baseline: EpochReport | None
    epochs: list[EpochReport]
    skipped_files: int
    failed_files: int


def _check(workers: int, cache_fraction: float, epochs: int, batch_size: int) -> None:
    if workers < 0:
        raise ValueError(f"--workers: expected 0 or more DataLoader worker processes, got {workers}")
    if not 0.0 <= cache_fraction <= 1.0:
        raise ValueError(f"--cache-fraction: expected a fraction of the dataset from 0 to 1, got {cache_fraction}")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"--epochs and --batch-size must be >= 1, got {epochs} and {batch_size}")


def _loader(
    found: datasets.Scan, batch_size: int, workers: int, pin: bool, gpu_prep: bool, limit: int | None, seed: int
) -> tuple[torch.utils.data.DataLoader, datasets.ImageFiles]:
    from torchvision.transforms import v2 as T

    if gpu_prep:
        ds = datasets.ImageFiles(found, decode="bytes")
        collate = datasets.collate_bytes
    else:
        tf = T.Compose(
            [
                T.RandomResizedCrop(224, antialias=True),
                T.RandomHorizontalFlip(),
                T.PILToTensor(),
                T.ToDtype(torch.float32, scale=True),
                T.Normalize(MEAN, STD),
            ]
        )
        ds = datasets.ImageFiles(found, transform=tf)
        collate = None
    data: torch.utils.data.Dataset = ds
    if limit is not None:
        data = torch.utils.data.Subset(ds, range(min(limit, len(ds))))
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        pin_memory=pin and not gpu_prep,
        drop_last=True,
        collate_fn=collate,
        prefetch_factor=2 if workers else None,
        generator=torch.Generator().manual_seed(seed),
    )
    return loader, ds


def _worker_died(it: Any, error: RuntimeError) -> WorkerDiedError | None:
    """If a worker of `it` has died: an error naming how it ended and what to
    do. PyTorch's own says "exited unexpectedly", without the signal."""
    dead = [w for w in getattr(it, "_workers", ()) if w.exitcode not in (None, 0)]
    if not dead:
        return None
    w = dead[0]
    return WorkerDiedError(
        f"train --data: DataLoader worker process {w.pid} {exit_description(w.exitcode)}; "
        f"{death_hint(w.exitcode)}. If memory ran out, use fewer --workers or a smaller --batch-size "
        f"(PyTorch said: {error})"
    )


def _gpu_iteration(
    net: torch.nn.Module, opt: torch.optim.Optimizer, device: torch.device, batch_size: int, iterations: int = 5
) -> float:
    """Seconds per iteration with the batch already on the device."""
    x = torch.randn(batch_size, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch_size,), device=device)

    def step() -> None:
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    step()
    device_module.synchronize()
    t0 = time.perf_counter()
    for _ in range(iterations):
        step()
    device_module.synchronize()
    return (time.perf_counter() - t0) / iterations


def _pipeline_rate(loader: torch.utils.data.DataLoader, batches: int, warmup: int = 1) -> float:
    """Images/s the loader alone delivers (files cached), after `warmup`
    batches: the workers start together, so their first batches arrive in
    a burst (or late, while they start) and say little of the steady rate."""
    it = iter(loader)
    n = 0
    try:
        for _ in range(warmup):
            next(it)
        t0 = time.perf_counter()
        for _ in range(batches):
            xb, _ = next(it)
            n += len(xb)
    except StopIteration:
        pass
    except RuntimeError as e:
        died = _worker_died(it, e)
        if died is None:
            raise
        raise died from e
    elapsed = time.perf_counter() - t0 if n else 0.0
    del it
    return n / elapsed if elapsed > 0 else float("nan")


def _epoch(
    label: str,
    loader: torch.utils.data.DataLoader,
    net: torch.nn.Module,
    opt: torch.optim.Optimizer,
    device: torch.device,
    pin: bool,
    gpu_prep: bool,
    gpu_iteration_s: float,
    cached: float,
    note: str | None,
    seed: int,
    progress: bool,
    record: bool,
) -> EpochReport:
    from tqdm import tqdm

    gen = torch.Generator().manual_seed(seed)
    index = device.index or 0
    device_module.synchronize()
    device_module.reset_peak_memory_stats()
    before = _C._engine_stats(index)
    waited = 0.0
    images = 0
    iterations = 0
    marks: list[tuple[float, float, Any, Any, Any]] = []  # host wait (start, end), copy end, step end events
    start_event = device_module.Event(enable_timing=True)
    start = time.perf_counter()
    start_event.record()
    bar = tqdm(total=len(loader), desc=label, unit="batch", disable=not progress, leave=False)
    it = iter(loader)
    try:
        while True:
            t0 = time.perf_counter()
            try:
                xb, yb = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            waited += t1 - t0
            copy_start = device_module.Event(enable_timing=True) if record else None
            if copy_start is not None:
                copy_start.record()
            x = train_batch_on_device(xb, device, generator=gen) if gpu_prep else xb.to(device, non_blocking=pin)
            y = yb.to(device, non_blocking=pin)
            copied = device_module.Event(enable_timing=True) if record else None
            if copied is not None:
                copied.record()
            loss = torch.nn.functional.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if record:
                done = device_module.Event(enable_timing=True)
                done.record()
                marks.append((t0 - start, t1 - start, copy_start, copied, done))
            images += len(yb)
            iterations += 1
            bar.update()
    except RuntimeError as e:  # a dying worker's SIGCHLD can raise anywhere in the loop
        died = _worker_died(it, e)
        if died is None:
            raise
        raise died from e
    device_module.synchronize()
    epoch_s = time.perf_counter() - start
    bar.close()
    after = _C._engine_stats(index)
    timeline: dict[str, list[tuple[float, float]]] = {}
    if record:
        ms = 1e-3
        timeline["waiting for data"] = [(a, b - a) for a, b, *_ in marks]
        timeline["copies" if not gpu_prep else "decode and copies"] = [
            (start_event.elapsed_time(c0) * ms, (c0.elapsed_time(c1)) * ms) for *_, c0, c1, _ in marks
        ]
        timeline["GPU compute"] = [(start_event.elapsed_time(c1) * ms, c1.elapsed_time(d) * ms) for *_, c1, d in marks]
    return EpochReport(
        label=label,
        images=images,
        epoch_s=epoch_s,
        gpu_busy_s=(after["compute"][1] - before["compute"][1]) / 1e9,
        gpu_needed_s=iterations * gpu_iteration_s,
        transfer_s=(after["h2d"][1] - before["h2d"][1]) / 1e9,
        data_wait_s=waited,
        cached_fraction=cached,
        cache_note=note,
        peak_bytes=device_module.max_memory_allocated(),
        timeline=timeline,
    )


def run(
    data: str | os.PathLike[str],
    model: str = "resnet50",
    gpu: str | None = None,
    batch_size: int = 64,
    epochs: int = 1,
    workers: int = 4,
    pin_memory: bool = True,
    cache_fraction: float = 1.0,
    gpu_preprocessing: bool = False,
    limit: int | None = None,
    seed: int = 0,
    timeline: str | None = None,
    progress: bool = True,
) -> DataTrainResult:
    _check(workers, cache_fraction, epochs, batch_size)
    import torchvision

    known = torchvision.models.list_models(module=torchvision.models)
    if model not in known:
        raise ValueError(
            f"--data trains image classifiers: expected a torchvision classification model "
            f"(e.g. resnet50), got {model!r}; known: {', '.join(sorted(known))}"
        )
    found = datasets.scan(data)
    torch_emugpu.configure(gpu=gpu)
    device = torch.device("emugpu", 0)
    net = torchvision_model(model).to(device).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    gpu_s = _gpu_iteration(net, opt, device, batch_size)
    loader, ds = _loader(found, batch_size, workers, pin_memory, gpu_preprocessing, limit, seed)
    if len(loader) == 0:
        raise ValueError(
            f"{found.root} holds {len(found.files)} usable images, fewer than one batch of "
            f"{batch_size}; use a smaller --batch-size or more images"
        )
    paths = [p for p, _ in found.files][:limit]
    datasets.set_page_cache(paths, 1.0)
    warmup = min(max(1, workers), max(1, len(loader) // 4))
    rate = _pipeline_rate(loader, batches=min(len(loader) - warmup, max(16, 2 * workers)), warmup=warmup)
    epoch = functools.partial(
        _epoch,
        net=net,
        opt=opt,
        device=device,
        pin=pin_memory,
        gpu_prep=gpu_preprocessing,
        gpu_iteration_s=gpu_s,
        progress=progress,
    )
    baseline = None
    if cache_fraction < 1.0:
        baseline = epoch("baseline (all cached)", loader, cached=1.0, note=None, seed=seed, record=False)
    reports = []
    for e in range(epochs):
        cached, note = datasets.set_page_cache(paths, cache_fraction, seed=seed)
        r = epoch(
            f"epoch {e + 1}/{epochs}",
            loader,
            cached=cached,
            note=note,
            seed=seed + e + 1,
            record=timeline is not None and e == epochs - 1,
        )
        base = baseline or r  # all cached: the epoch is its own baseline, and nothing is fetched
        r.prep_stall_s = base.data_stall_s
        r.fetch_stall_s = max(0.0, r.data_stall_s - base.data_stall_s)
        reports.append(r)
    if timeline:
        plot_timeline(reports[-1], timeline, f"{model} on {device_module.get_device_name()}")
    return DataTrainResult(
        model=model,
        gpu=device_module.get_device_name(),
        batch_size=batch_size,
        workers=workers,
        pin_memory=pin_memory,
        gpu_preprocessing=gpu_preprocessing,
        gpu_iteration_s=gpu_s,
        pipeline_images_per_s=rate,
        baseline=baseline,
        epochs=reports,
        skipped_files=len(found.skipped),
        failed_files=ds.failed_count,
    )


def plot_timeline(r: EpochReport, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(r.timeline.items())
    fig, ax = plt.subplots(figsize=(12, 1 + 0.6 * len(rows)))
    colors = ["tab:red", "tab:orange", "tab:green"]
    for i, (_, spans) in enumerate(rows):
        ax.broken_barh(spans, (i - 0.4, 0.8), color=colors[i % len(colors)])
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.set_xlabel("seconds since the epoch started (emulated time)")
    ax.set_xlim(0, r.epoch_s)
    ax.set_title(f"{title}: {r.label}, {r.images_per_s:.0f} images/s, AU {r.au:.0%}")
    fig.tight_layout()
    with atomic_output(path, fsync=False) as f:  # replaces a symlink at `path`, never writes through it
        fig.savefig(f, format=os.path.splitext(path)[1][1:] or "png", dpi=120)
    plt.close(fig)


def summary(res: DataTrainResult) -> str:
    demand = res.batch_size / res.gpu_iteration_s
    lines = [
        f"model              {res.model} (batch {res.batch_size}) on emulated {res.gpu}",
        f"data loader        {res.workers} workers, pin_memory={res.pin_memory}, "
        f"{'GPU' if res.gpu_preprocessing else 'CPU'} preprocessing",
        f"GPU demand         {demand:.1f} images/s ({res.gpu_iteration_s * 1e3:.2f} ms per batch on the GPU alone)",
        f"host pipeline      {res.pipeline_images_per_s:.1f} images/s (the loader alone, files cached) -> "
        + ("the host pipeline limits" if res.pipeline_images_per_s < demand else "the GPU limits"),
    ]
    if res.skipped_files or res.failed_files:
        lines.append(f"unusable files     {res.skipped_files} skipped by the scan, {res.failed_files} failed to decode")
    for r in ([res.baseline] if res.baseline else []) + res.epochs:
        lines += [
            f"{r.label}: {r.epoch_s:.2f} s, {r.images} images, {r.images_per_s:.1f} images/s"
            + (f", {r.cached_fraction:.0%} of the files cached" if r is not res.baseline else ""),
            f"  GPU busy {r.gpu_busy_s / r.epoch_s:.1%}, AU {r.au:.1%} (MLPerf Storage: compute time / epoch time)",
        ]
        if r is not res.baseline:
            lines.append(
                f"  stalls: fetch {r.fetch_stall_s:.2f} s, preprocessing {r.prep_stall_s:.2f} s, "
                f"transfer {r.transfer_s:.2f} s; waited for batches {r.data_wait_s:.2f} s"
            )
        lines.append(f"  peak device memory {r.peak_bytes / 2**30:.2f} GiB")
        if r.cache_note:
            lines.append(f"  note: {r.cache_note}")
    return "\n".join(lines)


# _ActionsContainer: the base that a parser and its argument groups share (cli/train.py passes a group).
def add_arguments(p: argparse._ActionsContainer) -> None:
    p.add_argument(
        "--data",
        default=None,
        metavar="DIR",
        help="train on this image folder (DIR/<class>/<image>) through a DataLoader and report the "
        "data stalls; without it, synthetic batches",
    )
    p.add_argument("--epochs", type=int, default=1, help="epochs over --data (default 1)")
    p.add_argument("--workers", type=int, default=4, help="DataLoader worker processes for --data (default 4)")
    p.add_argument(
        "--pin-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pin the loader's batches and copy them with non_blocking=True (default: on)",
    )
    p.add_argument(
        "--cache-fraction",
        type=float,
        default=1.0,
        help="fraction of --data kept in the page cache, the rest dropped before each epoch (default 1: all cached)",
    )
    p.add_argument(
        "--gpu-preprocessing",
        action="store_true",
        help="workers only read the files; decode (nvJPEG), crop, flip and normalize on the GPU",
    )
    p.add_argument("--limit", type=int, default=None, help="use at most this many images of --data")
    p.add_argument("--timeline", default=None, metavar="PNG", help="draw the last epoch's timeline (matplotlib)")


def main(args: argparse.Namespace) -> int:
    res = run(
        args.data,
        model=args.model,
        gpu=args.gpu,
        batch_size=args.batch_size,
        epochs=args.epochs,
        workers=args.workers,
        pin_memory=args.pin_memory,
        cache_fraction=args.cache_fraction,
        gpu_preprocessing=args.gpu_preprocessing,
        limit=args.limit,
        timeline=args.timeline,
        progress=not args.no_progress,
    )
    print(summary(res))
    if args.timeline:
        print(f"timeline written to {args.timeline}")
    return 0
