"""Photo-like JPEG images, and the frame header that gives a JPEG's size.

`torch-emugpu dataset make` writes its images with `render`, and the
preprocessing profiler times decoding on the same kind of image, so that a
measured table fits the datasets it times. `jpeg_header` reads what the
emulated decoder charges for (the size) without decoding.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageDraw

# the start-of-frame markers SOFn, which carry the size: C0-CF but for C4 (DHT), C8 (JPG) and CC (DAC)
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def render(rng: np.random.Generator, w: int, h: int) -> Image.Image:
    """A photo-like image: a smooth colour field, shapes with edges, then grain.

    The grain (full-resolution luma, half-resolution chroma: JPEG keeps chroma at
    half resolution anyway) is what makes the files photo-sized: at quality 90
    about 0.7 bytes per pixel, as ImageNet's ~110 KB for ~160 k pixels. Its
    amplitude varies per image, as detail does between photos.
    """
    luma_amp = int(rng.integers(56, 185))
    chroma_amp = int(rng.integers(16, 49))
    top = 256 - luma_amp - chroma_amp  # base + grain never exceeds 255: plain uint8 adds
    gw, gh = (int(v) for v in rng.integers(2, 7, size=2))
    coarse = Image.fromarray(rng.integers(0, top, size=(gh, gw, 3), dtype=np.uint8))
    img = coarse.resize((w, h), Image.Resampling.BILINEAR)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 12))):
        x0, x1 = sorted(int(v) for v in rng.integers(-w // 4, w + w // 4 + 1, size=2))
        y0, y1 = sorted(int(v) for v in rng.integers(-h // 4, h + h // 4 + 1, size=2))
        fill = tuple(int(c) for c in rng.integers(0, top, size=3))
        shape = rng.integers(3)
        if shape == 0:
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        elif shape == 1:
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        else:
            xs, ys = rng.integers(0, w, size=5), rng.integers(0, h, size=5)
            draw.polygon([(int(x), int(y)) for x, y in zip(xs, ys, strict=True)], fill=fill)
    luma = Image.frombytes("L", (w, h), rng.bytes(w * h)).point([v * (luma_amp + 1) >> 8 for v in range(256)])
    cw, ch = (w + 1) // 2, (h + 1) // 2
    chroma = Image.frombytes("RGB", (cw, ch), rng.bytes(3 * cw * ch))
    chroma = chroma.point([v * (chroma_amp + 1) >> 8 for v in range(256)] * 3).resize((w, h), Image.Resampling.NEAREST)
    pixels = np.asarray(img) + np.asarray(Image.merge("RGB", (luma, luma, luma)))
    pixels += np.asarray(chroma)
    return Image.fromarray(pixels)


def jpeg_header(data: torch.Tensor | bytes) -> tuple[int, int, int]:
    """(components, height, width) from a JPEG's frame header; ValueError if there is none."""
    raw = data.numpy().data if isinstance(data, torch.Tensor) else memoryview(data)  # no copy
    if bytes(raw[:2]) != b"\xff\xd8":
        raise ValueError(f"not a JPEG: expected the start-of-image marker FF D8, got {raw[:2].hex(' ') or 'nothing'}")
    i = 2
    while i + 4 <= len(raw):
        if raw[i] != 0xFF:
            break
        marker = raw[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        length = int.from_bytes(raw[i + 2 : i + 4], "big")
        if marker in _SOF:
            if i + 10 > len(raw):
                break
            height = int.from_bytes(raw[i + 5 : i + 7], "big")
            width = int.from_bytes(raw[i + 7 : i + 9], "big")
            return raw[i + 9], height, width
        i += 2 + length
    raise ValueError(f"JPEG without a frame header (SOF marker) in its {len(raw)} bytes: truncated or corrupt")
