"""One DataLoader-fed training epoch per configuration, on a real GPU
(`--device cuda`, plain PyTorch) or an emulated one (`--device emugpu`), so
that the data path of the two can be compared: epoch time, images/s, and how
long the training loop waited for batches.

The pipeline is torchvision's ImageNet recipe: worker processes decode JPEGs
with PIL and apply RandomResizedCrop(224), RandomHorizontalFlip, ToTensor and
Normalize; the loop copies each batch to the device (non_blocking when pinned)
and runs SGD. With `gpu` preprocessing the workers only read the files, and
decode (nvJPEG on CUDA), crop, flip and normalize run on the device.
`--cold` drops the dataset's files from the page cache before each epoch
(posix_fadvise DONTNEED; say so when not permitted).

    python benchmarks/data_pipeline.py --data ./data --device cuda --models resnet18 \\
        --workers 1,2,4,8 --pin both --out real.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch

from torch_emugpu.data import datasets
from torch_emugpu.data.preprocessing import MEAN, STD, train_batch_on_device
from torch_emugpu.measure.common import write_json_atomic
from torch_emugpu.measure.models import torchvision_model


def epoch(
    found: datasets.Scan,
    model_name: str,
    device: torch.device,
    batch: int,
    workers: int,
    pin: bool,
    preprocessing: str,
    cold: bool,
    limit: int | None = None,
) -> dict[str, Any]:
    from torchvision.transforms import v2 as T

    backend = getattr(torch, device.type)
    model = torchvision_model(model_name).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    # warm the device (cuDNN/cuBLAS handles, allocator) on synthetic data, as a training run would be warm
    for _ in range(3):
        x = torch.randn(batch, 3, 224, 224, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    backend.synchronize(device)
    gpu_time = _synthetic_iteration(model, opt, device, batch)
    if preprocessing == "cpu":
        tf = T.Compose(
            [
                T.RandomResizedCrop(224, antialias=True),
                T.RandomHorizontalFlip(),
                T.PILToTensor(),
                T.ToDtype(torch.float32, scale=True),
                T.Normalize(MEAN, STD),
            ]
        )
        ds: torch.utils.data.Dataset = datasets.ImageFiles(found, transform=tf)
        collate = None
    elif preprocessing == "gpu":
        ds = datasets.ImageFiles(found, decode="bytes")
        collate = datasets.collate_bytes
    else:  # "none": decoded images already in memory, so the copies and the GPU are all there is
        ds = _Decoded(limit or len(found.files))
        collate = None
    if limit and preprocessing != "none":
        ds = torch.utils.data.Subset(ds, range(min(limit, len(ds))))
    cache_note = datasets.set_page_cache([path for path, _ in found.files], 0.0)[1] if cold else None
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        pin_memory=pin and preprocessing != "gpu",
        drop_last=True,
        collate_fn=collate,
        persistent_workers=False,
        prefetch_factor=2 if workers else None,
    )
    gen = torch.Generator().manual_seed(0)
    waited = 0.0
    images = 0
    backend.synchronize(device)
    start = time.perf_counter()
    it = iter(loader)
    while True:
        t0 = time.perf_counter()
        try:
            xb, yb = next(it)
        except StopIteration:
            break
        waited += time.perf_counter() - t0
        if preprocessing == "gpu":
            x = train_batch_on_device(xb, device, generator=gen)
        else:
            x = xb.to(device, non_blocking=pin)
        y = yb.to(device, non_blocking=pin)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        images += len(yb)
    backend.synchronize(device)
    wall = time.perf_counter() - start
    return {
        "model": model_name,
        "batch": batch,
        "workers": workers,
        "pin_memory": pin,
        "preprocessing": preprocessing,
        "cold": cold,
        "cache_note": cache_note,
        "images": images,
        "epoch_s": wall,
        "images_per_s": images / wall,
        "data_wait_s": waited,
        "gpu_only_iteration_s": gpu_time,
        "gpu_only_images_per_s": batch / gpu_time,
        "peak_bytes": backend.max_memory_allocated(device),
    }


class _Decoded(torch.utils.data.Dataset):
    """Images as a cache of decoded, augmented tensors would hold them (a few distinct ones, reused)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pool: list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.pool is None:  # made in the worker, not pickled to it
            self.pool = [torch.randn(3, 224, 224) for _ in range(16)]
        return self.pool[i % 16], i % 1000


def _synthetic_iteration(
    model: torch.nn.Module, opt: torch.optim.Optimizer, device: torch.device, batch: int, n: int = 10
) -> float:
    """Seconds per iteration with the batch already on the device: what the GPU alone allows."""
    backend = getattr(torch, device.type)
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    backend.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(n):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    backend.synchronize(device)
    return (time.perf_counter() - t0) / n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="image folder (torch-emugpu dataset make)")
    p.add_argument("--device", default="cuda", help="cuda or emugpu (default cuda)")
    p.add_argument("--models", default="resnet18", help="comma-separated torchvision models (default resnet18)")
    p.add_argument("--batch", type=int, default=128, help="batch size (default 128)")
    p.add_argument("--workers", default="4", help="comma-separated DataLoader worker counts (default 4)")
    p.add_argument("--pin", choices=["on", "off", "both"], default="on", help="pin_memory (default on)")
    p.add_argument(
        "--preprocessing",
        default="cpu",
        help="comma-separated: cpu (PIL in the workers), gpu (decode and augment on the device) "
        "or none (decoded tensors from memory) (default cpu)",
    )
    p.add_argument("--cold", action="store_true", help="drop the files from the page cache before each epoch")
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        help="use at most this many images (with none: this many, reusing decoded ones)",
    )
    p.add_argument("--out", required=True, help="JSON file the epochs are appended to")
    args = p.parse_args()
    device = torch.device(args.device)
    found = datasets.scan(args.data)
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else f"emulated {device}"
    out = Path(args.out)
    doc = (
        json.loads(out.read_text())
        if out.is_file()
        else {
            "schema": "torch-emugpu data pipeline v1",
            "device": label,
            "host": socket.gethostname(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "dataset": {"images": len(found.files), "bytes": found.total_bytes},
            "epochs": [],
        }
    )
    pins = {"on": [True], "off": [False], "both": [True, False]}[args.pin]
    for model in args.models.split(","):
        for prep in args.preprocessing.split(","):
            for workers in (int(w) for w in args.workers.split(",")):
                for pin in pins:
                    r = epoch(found, model, device, args.batch, workers, pin, prep, args.cold, args.limit)
                    doc["epochs"].append(r)
                    write_json_atomic(out, doc)
                    print(
                        f"{model:12} {prep} workers={workers:2d} pin={pin!s:5} cold={args.cold!s:5} "
                        f"{r['epoch_s']:7.2f} s {r['images_per_s']:8.1f} img/s  waited {r['data_wait_s']:6.2f} s"
                        f"  (GPU alone {r['gpu_only_images_per_s']:8.1f} img/s)",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
