"""Configuration: which GPU is emulated, how many devices, which mode.

Read from the environment (EMUGPU_GPU, EMUGPU_DEVICE_COUNT, EMUGPU_MODE,
EMUGPU_CATALOG) unless `torch_emugpu.configure()` sets them explicitly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_GPU = "NVIDIA A100-SXM4-40GB"
MODES = ("timing", "compute")


@dataclass(frozen=True)
class Config:
    gpu: str
    device_count: int
    mode: str
    catalog: str


def default_catalog() -> str:
    here = Path(__file__).resolve().parent
    for candidate in (here / "profiles" / "gpus.json", here.parent / "profiles" / "gpus.json"):
        if candidate.is_file():
            return str(candidate)
    return str(here / "profiles" / "gpus.json")


def parse_device_count(value: object, source: str) -> int:
    try:
        count = int(str(value).strip())
    except ValueError:
        raise ValueError(
            f"{source}: expected a positive integer number of emulated GPUs, got {value!r}"
        ) from None
    if count < 1:
        raise ValueError(f"{source}: expected a positive number of emulated GPUs (1 or more), got {count}")
    return count


def parse_mode(value: str, source: str) -> str:
    mode = value.strip().lower()
    if mode not in MODES:
        raise ValueError(f"{source}: expected one of {', '.join(MODES)}, got {value!r}")
    return mode


def from_environment(
    gpu: str | None = None, device_count: int | None = None, mode: str | None = None
) -> Config:
    env = os.environ
    if gpu is None:
        gpu = env.get("EMUGPU_GPU", "").strip() or DEFAULT_GPU
    if device_count is None:
        raw = env.get("EMUGPU_DEVICE_COUNT")
        device_count = 1 if raw is None or raw.strip() == "" else parse_device_count(raw, "EMUGPU_DEVICE_COUNT")
    else:
        device_count = parse_device_count(device_count, "device_count")
    if mode is None:
        raw = env.get("EMUGPU_MODE")
        mode = "timing" if raw is None or raw.strip() == "" else parse_mode(raw, "EMUGPU_MODE")
    else:
        mode = parse_mode(mode, "mode")
    catalog = env.get("EMUGPU_CATALOG", "").strip() or default_catalog()
    return Config(gpu=gpu, device_count=device_count, mode=mode, catalog=catalog)
