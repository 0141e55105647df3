"""Measures GPU-side image preprocessing on a real GPU (`torch-emugpu profile
--preprocessing`): what DALI- or FFCV-style pipelines and
`torchvision.io.decode_jpeg(..., device="cuda")` cost there.

For each operation and batch size it times, after warm-up, one call on the
GPU and records the median per call: JPEG decode with nvJPEG (batched list
decode) at several image sizes, resize with antialiasing to a shorter side of
256, random-resized crop to 224x224, centre crop, horizontal flip, conversion
to float with normalisation, and stacking single images into a batch. Inputs
are photo-like JPEGs generated in the process (as `torch-emugpu dataset make`
makes them), never zeros. Runs with plain PyTorch and torchvision, without the
compiled extension. The output is one JSON file per GPU that torch-emugpu's
preprocessing ops read; already measured points are kept unless --force.
"""

from __future__ import annotations

import datetime
import io
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from torch_emugpu.measure.common import VERSION, device_name, gpu_dir_name, robust_median, write_json_atomic
from torch_emugpu.measure.images import render

SCHEMA = "torch-emugpu preprocessing v1"
# (width, height): a thumbnail, ImageNet's most common size, a photo, a large photo
DECODE_SIZES = ((224, 224), (500, 375), (1024, 768), (2048, 1536))
BATCHES = (1, 32, 128)
SHORT = 256  # resize target of the shorter side, as torchvision's ImageNet recipe
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _jpeg(width: int, height: int, seed: int) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    render(np.random.default_rng(seed), width, height).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _timer(device: torch.device) -> Callable[[Callable[[], Any], int, int], list[float]]:
    """Per-call seconds of `fn`, `samples` times the mean over `reps` calls."""
    cuda = device.type == "cuda"

    def time_it(fn: Callable[[], Any], reps: int, samples: int) -> list[float]:
        for _ in range(3):
            fn()
        out = []
        for _ in range(samples):
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            if cuda:
                torch.cuda.synchronize(device)
            out.append((time.perf_counter() - t0) / reps)
        return out

    return time_it


# Called with no arguments; `...` because each lambda binds its loop variables as defaulted parameters,
# which mypy cannot match against Callable[[], Any] ("cannot infer type of lambda").
def _points(device: torch.device, quick: bool) -> Iterator[tuple[dict[str, Any], Callable[..., Any]]]:
    """(record without timings, the call to time) for every point."""
    from torchvision.io import decode_jpeg
    from torchvision.transforms.v2 import functional as F

    gen = torch.Generator().manual_seed(0)
    sizes = DECODE_SIZES[:2] if quick else DECODE_SIZES
    batches = (1, 4) if quick else BATCHES
    for w, h in sizes:
        for batch in batches:
            # distinct images per batch slot: nvJPEG's batched path must not see repeats
            datas = [torch.frombuffer(bytearray(_jpeg(w, h, seed)), dtype=torch.uint8) for seed in range(batch)]
            rec = {
                "op": "decode_jpeg",
                "batch": batch,
                "in_shape": [3, h, w],
                "out_shape": [3, h, w],
                "dtype": "uint8",
                "compressed_bytes": sum(d.numel() for d in datas),
            }
            if device.type == "cuda":
                yield rec, lambda datas=datas: decode_jpeg(datas, device=device)
            else:
                yield rec, lambda datas=datas: [decode_jpeg(d) for d in datas]
    for w, h in sizes:
        img = torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=gen).to(device)
        oh, ow = (SHORT, round(w * SHORT / h)) if h <= w else (round(h * SHORT / w), SHORT)
        for batch in batches:
            imgs = [img.clone() for _ in range(batch)]
            yield (
                {
                    "op": "resize",
                    "batch": batch,
                    "in_shape": [3, h, w],
                    "out_shape": [3, oh, ow],
                    "dtype": "uint8",
                    "antialias": True,
                },
                lambda imgs=imgs: [F.resize(i, [SHORT], antialias=True) for i in imgs],
            )
            yield (
                {
                    "op": "resized_crop",
                    "batch": batch,
                    "in_shape": [3, h, w],
                    "out_shape": [3, 224, 224],
                    "dtype": "uint8",
                    "antialias": True,
                },
                lambda imgs=imgs, h=h, w=w: [
                    F.resized_crop(i, h // 8, w // 8, 3 * h // 4, 3 * w // 4, [224, 224], antialias=True) for i in imgs
                ],
            )
    for batch in batches:
        singles = [
            torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8, generator=gen).to(device) for _ in range(batch)
        ]
        stacked = torch.stack(singles)
        big = torch.randint(0, 256, (batch, 3, 256, 256), dtype=torch.uint8, generator=gen).to(device)
        shape = [3, 224, 224]
        yield (
            {"op": "stack", "batch": batch, "in_shape": shape, "out_shape": shape, "dtype": "uint8"},
            lambda singles=singles: torch.stack(singles),
        )
        yield (
            {"op": "center_crop", "batch": batch, "in_shape": [3, 256, 256], "out_shape": shape, "dtype": "uint8"},
            lambda big=big: F.center_crop(big, [224, 224]).contiguous(),
        )
        yield (
            {"op": "horizontal_flip", "batch": batch, "in_shape": shape, "out_shape": shape, "dtype": "uint8"},
            lambda stacked=stacked: F.horizontal_flip(stacked),
        )
        yield (
            {
                "op": "to_float_normalize",
                "batch": batch,
                "in_shape": shape,
                "out_shape": shape,
                "dtype": "uint8",
                "out_dtype": "float32",
            },
            lambda stacked=stacked: F.normalize(F.to_dtype(stacked, torch.float32, scale=True), MEAN, STD),
        )


def _key(rec: dict[str, Any]) -> tuple[Any, ...]:
    return (rec["op"], rec["batch"], tuple(rec["in_shape"]), tuple(rec["out_shape"]), rec["dtype"])


def path_for(out: Path, gpu: str) -> Path:
    return out / gpu_dir_name(gpu) / "preprocessing.json"


def run(
    out: Path, device: torch.device, samples: int = 7, quick: bool = False, force: bool = False, progress: bool = True
) -> Path:
    from tqdm import tqdm

    gpu = device_name(device)
    path = path_for(out, gpu)
    doc: dict[str, Any] | None = None
    if path.is_file() and not force:
        import json

        doc = json.loads(path.read_text())
        if doc.get("schema") != SCHEMA or doc.get("gpu") != gpu:
            raise ValueError(
                f"{path}: expected a {SCHEMA!r} file for {gpu!r}, got schema {doc.get('schema')!r} "
                f"for {doc.get('gpu')!r}; use --force to measure anew"
            )
    if doc is None:
        import torchvision

        doc = {
            "schema": SCHEMA,
            "gpu": gpu,
            "ops": [],
            "provenance": {
                "tool": f"torch-emugpu profile --preprocessing {VERSION}",
                "torch": torch.__version__,
                "torchvision": torchvision.__version__,
                "date": datetime.date.today().isoformat(),
                "aggregation": f"median over {samples} samples of the mean per call, outliers beyond 3 MAD dropped",
                "source": f"measured on {gpu} ({socket.gethostname()})",
            },
        }
    done = {_key(r) for r in doc["ops"]}
    time_it = _timer(device)
    points = list(_points(device, quick))
    for rec, fn in tqdm(points, desc=f"preprocessing on {gpu}", unit="op", disable=not progress):
        if _key(rec) in done:
            continue
        first = time_it(fn, 1, 1)[0]
        reps = max(1, min(50, int(0.02 / max(first, 1e-6))))  # at least ~20 ms per sample
        rec["time_s"] = robust_median(time_it(fn, reps, samples))
        doc["ops"].append(rec)
        write_json_atomic(path, doc)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return path
