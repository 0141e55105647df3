"""GPU-side image preprocessing on emugpu: JPEG decoding as nvJPEG does it for
`torchvision.io.decode_jpeg(..., device="cuda")`, timed from the emulated
GPU's measured preprocessing table.

    from torch_emugpu.data.preprocessing import decode_jpeg
    images = decode_jpeg(list_of_jpeg_byte_tensors, device="emugpu")   # list of uint8 [C, H, W]

The sizes come from each JPEG's header. In compute mode the pixels are
decoded for real (on the host, written into device memory without a charged
copy: the data is already where nvJPEG would leave it); in timing mode they
are placeholders. The output is charged to the emulated allocator, and the
call's time to the current stream: from `<GPU>/preprocessing.json` on the
profile search path (`torch-emugpu profile --preprocessing`), interpolated in
pixels per image and batch size; without a table for the emulated GPU, from
another GPU's table scaled by SM count, or from a per-image and per-pixel
cost fitted to our H100 measurement (see `_FALLBACK`).

Resize, crop, flip, normalize and the other torchvision.transforms.v2 ops
run on emugpu tensors as they are (aten ops timed by the per-op cost model,
not by the table, whose per-call times are mostly the measured machine's host
launching small kernels; README.md says why and lists the ops).
"""

from __future__ import annotations

import io
import json
import warnings
from bisect import bisect_left
from functools import lru_cache
from pathlib import Path
from typing import Any, TypedDict

import torch

from torch_emugpu.measure.common import gpu_dir_name
from torch_emugpu.measure.images import jpeg_header

_MODES = {"UNCHANGED": None, "GRAY": 1, "RGB": 3}


class _Fallback(TypedDict):
    gpu: str
    sm_count: int
    image_s: float
    call_s: float
    pixel_s: float


# nvJPEG on the H100 we measured (profiles/NVIDIA_H100_80GB_HBM3/preprocessing.json, batch 128 and 1):
# per image about 29 us + 113 us / batch of fixed cost and 0.27 ns per pixel.
_FALLBACK = _Fallback(gpu="NVIDIA H100 80GB HBM3", sm_count=132, image_s=29e-6, call_s=113e-6, pixel_s=0.27e-9)


def _mode_channels(mode: Any) -> int | None:
    name = getattr(mode, "name", mode)
    name = str(name).upper()
    if name not in _MODES:
        raise ValueError(f"decode_jpeg: expected mode UNCHANGED, GRAY or RGB, got {mode!r}")
    return _MODES[name]


@lru_cache(maxsize=8)
def _table(gpu: str, search: tuple[str, ...]) -> tuple[dict[int, list[tuple[float, float]]], str] | None:
    """The decode rows of `gpu`'s preprocessing table, else of the first other GPU's; with its GPU name."""
    own = [Path(d) / gpu_dir_name(gpu) / "preprocessing.json" for d in search]
    others = [p for d in search for p in sorted(Path(d).glob("*/preprocessing.json"))]
    for path in [*own, *others]:
        if not path.is_file():
            continue
        doc = json.loads(path.read_text())
        rows = [r for r in doc.get("ops", []) if r.get("op") == "decode_jpeg"]
        if doc.get("schema") == "torch-emugpu preprocessing v1" and rows:
            by_batch: dict[int, list[tuple[float, float]]] = {}
            for r in rows:
                pixels = float(r["in_shape"][1] * r["in_shape"][2])
                by_batch.setdefault(int(r["batch"]), []).append((pixels, float(r["time_s"]) / int(r["batch"])))
            return {b: sorted(v) for b, v in sorted(by_batch.items())}, doc["gpu"]
    return None


def _interp(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise linear through `points`, extrapolated from the end segments, never below a tenth of the nearest."""
    if len(points) == 1:
        return points[0][1] * x / points[0][0]
    i = min(max(bisect_left([p[0] for p in points], x), 1), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    near = y0 if abs(x - x0) < abs(x - x1) else y1
    return max(y, 0.1 * near)


_warned: set[str] = set()


def decode_seconds(pixels: list[int], device_index: int) -> float:
    """Emulated seconds of one batched decode of images of `pixels` each."""
    import torch_emugpu
    from torch_emugpu import _C
    from torch_emugpu.device import device_module
    from torch_emugpu.timing import profiles

    gpu = torch_emugpu.config().gpu
    sm = device_module.get_device_properties(device_index).multi_processor_count
    batch = len(pixels)
    found = _table(gpu, tuple(str(p) for p in profiles.search_path()))
    if found is None:
        f = _FALLBACK
        scale = f["sm_count"] / sm
        _warn_once(
            gpu,
            f"emugpu: no preprocessing table on the search path; JPEG decoding on {gpu} is timed from "
            f"nvJPEG's cost on the {f['gpu']} scaled by SM count ({f['sm_count']} vs {sm})",
        )
        return scale * sum(f["image_s"] + f["call_s"] / batch + f["pixel_s"] * p for p in pixels)
    table, source = found
    scale = 1.0
    if source != gpu:
        other = _C._gpu_properties(source)["multi_processor_count"]
        scale = other / sm
        _warn_once(
            gpu,
            f"emugpu: no preprocessing table for {gpu}; JPEG decoding is timed from the {source}'s "
            f"table scaled by SM count ({other} vs {sm}). Measure one with `torch-emugpu profile "
            f"--preprocessing` on that GPU",
        )
    sizes = list(table)
    j = min(max(bisect_left(sizes, batch), 1), len(sizes) - 1) if len(sizes) > 1 else 0
    lo, hi = sizes[max(j - 1, 0)], sizes[j]

    def per_image(p: int) -> float:
        a, b = _interp(table[lo], p), _interp(table[hi], p)
        if hi == lo or batch <= lo:
            return a if batch <= lo else b
        if batch >= hi:
            return b
        return a + (b - a) * (batch - lo) / (hi - lo)

    return scale * sum(per_image(p) for p in pixels)


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def _decode_host(data: torch.Tensor, channels: int | None) -> torch.Tensor:
    from PIL import Image

    modes: dict[int | None, str] = {1: "L", 3: "RGB"}
    with Image.open(io.BytesIO(bytes(data.numpy()))) as source:
        im = source.convert(modes.get(channels, "L" if source.mode == "L" else "RGB"))
        pixels = torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8)
        return pixels.view(im.height, im.width, -1).permute(2, 0, 1)


def decode_jpeg(
    input: torch.Tensor | list[torch.Tensor], mode: Any = "UNCHANGED", device: str | torch.device = "emugpu"
) -> torch.Tensor | list[torch.Tensor]:
    """torchvision.io.decode_jpeg for emugpu: uint8 [C, H, W] tensors on the device, one per input."""
    device = torch.device(device)
    if device.type != "emugpu":
        from torchvision.io import decode_jpeg as tv_decode

        return tv_decode(input, mode=mode, device=device)
    import torch_emugpu
    from torch_emugpu import _C

    datas = input if isinstance(input, list) else [input]
    if not datas:
        return []
    for i, d in enumerate(datas):
        if not isinstance(d, torch.Tensor) or d.dtype != torch.uint8 or d.dim() != 1 or d.device.type != "cpu":
            raise ValueError(
                f"decode_jpeg: expected 1-D uint8 CPU tensors of JPEG bytes, got input {i} as "
                f"{type(d).__name__}"
                + (f" {d.dtype} {list(d.shape)} on {d.device}" if isinstance(d, torch.Tensor) else "")
            )
    want = _mode_channels(mode)
    index = device.index if device.index is not None else torch.emugpu.current_device()
    headers = [jpeg_header(d) for d in datas]
    compute = torch_emugpu.config().mode == "compute"
    outs = []
    for d, (components, h, w) in zip(datas, headers, strict=True):
        channels = want or (1 if components == 1 else 3)
        out = torch.empty((channels, h, w), dtype=torch.uint8, device=torch.device("emugpu", index))
        if compute:
            _C._host_view(out).copy_(_decode_host(d, want))
            _C._set_materialized(out, True)
        outs.append(out)
    _C._emulate_kernel(index, decode_seconds([h * w for _, h, w in headers], index))
    return outs if isinstance(input, list) else outs[0]


MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def train_batch_on_device(
    datas: list[torch.Tensor], device: torch.device, size: int = 224, generator: torch.Generator | None = None
) -> torch.Tensor:
    """torchvision's ImageNet training recipe on the device (as DALI runs it): decode, random-resized crop,
    horizontal flip with probability 1/2, scale to [0, 1] and normalize; one float32 [N, 3, size, size] batch."""
    from torchvision.transforms.v2 import RandomResizedCrop
    from torchvision.transforms.v2 import functional as F

    if device.type == "emugpu":
        images = decode_jpeg(datas, mode="RGB", device=device)
    else:
        from torchvision.io import ImageReadMode
        from torchvision.io import decode_jpeg as tv_decode

        images = tv_decode(datas, mode=ImageReadMode.RGB, device=device)
    out = []
    for img in images:
        top, left, h, w = RandomResizedCrop.get_params(img, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
        img = F.resized_crop(img, top, left, h, w, [size, size], antialias=True)
        if torch.rand((), generator=generator) < 0.5:
            img = F.horizontal_flip(img)
        out.append(img)
    batch = F.to_dtype(torch.stack(out), torch.float32, scale=True)
    return F.normalize(batch, list(MEAN), list(STD))
