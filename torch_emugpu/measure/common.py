"""What the measuring tools share: the version their files record, the
robust median they keep of each measurement, the measured device's name, and
where a GPU's measured data go.

The emulator reads the same places (its profile search path begins with the
user's directory, and looks up a GPU's folder by `gpu_dir_name`), so they are
defined once, here, where the tools can use them without the extension.
"""

from __future__ import annotations

import os
import platform
import statistics
from pathlib import Path

import torch

from torch_emugpu._version import __version__

VERSION = __version__  # written in _version.py only


def robust_median(samples: list[float]) -> float:
    """Median after dropping samples more than 3 MADs from the median."""
    med = statistics.median(samples)
    mad = statistics.median(abs(s - med) for s in samples)
    kept = [s for s in samples if mad == 0 or abs(s - med) <= 3 * mad]
    return statistics.median(kept)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()}"


def gpu_dir_name(gpu: str) -> str:
    """The folder of a GPU's measured data (profiles, preprocessing table, calibration) under a profile dir."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in gpu)


def user_profile_dir() -> Path:
    """The user's profile directory: $XDG_DATA_HOME/torch-emugpu/profiles (by default under ~/.local/share)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "torch-emugpu" / "profiles"
