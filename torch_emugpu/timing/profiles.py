"""Measured profiles: where they are found, and their lookup.

Profiles (JSON, schema in profiles/README.md) are found on a search path:
the directories in EMUGPU_PROFILE_PATH (separated by os.pathsep) first, then
the user's directory ($XDG_DATA_HOME/torch-emugpu/profiles, by default
~/.local/share/torch-emugpu/profiles), then the profiles shipped with the
package. The emulated GPU's calibration file (the cost model's kernel
parameters) is looked up in the same directories. The compiled core resolves
the path (csrc/core/config.*), reads both whenever the device is configured,
and parses and interpolates profiles (csrc/core/profile_db.*); the region
planner (planner.py) applies the entry that matches a model.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch_emugpu import _C
from torch_emugpu.device import device_module
from torch_emugpu.device._extension import ensure_configured, require
from torch_emugpu.measure.common import atomic_output, user_profile_dir

__all__ = [
    "search_path",
    "calibration_path",
    "user_profile_dir",
    "reload",
    "available",
    "lookup",
    "find",
    "plot",
    "on_reload",
]


def search_path() -> list[Path]:
    """Directories searched for profiles, first match wins; none with EMUGPU_PROFILES=off."""
    return [Path(p) for p in _search_path()["profiles"]]


def calibration_path() -> list[Path]:
    """Directories searched for the emulated GPU's calibration file, first match wins: the profile
    directories, also under EMUGPU_PROFILES=off (a calibration belongs to the cost model, not to a
    profile); none with EMUGPU_CALIBRATION=off."""
    return [Path(p) for p in _search_path()["calibration"]]


def _search_path() -> dict[str, list[str]]:
    # The core resolves it (csrc/core/config.h), the one place the environment is read.
    require()
    return _C._search_path()


# Told after every reload, with the summaries: the region planner installs its hooks once profiles exist.
# It subscribes, so that this module needs nothing from it.
_listeners: list[Callable[[list[dict[str, Any]]], None]] = []


def on_reload(listener: Callable[[list[dict[str, Any]]], None]) -> None:
    """Calls `listener(summaries)` after every reload (once, however often it is registered)."""
    if listener not in _listeners:
        _listeners.append(listener)


def reload() -> list[dict[str, Any]]:
    """(Re)reads every profile, and the calibration file of the emulated GPU, on the search path (as
    configuring does); a malformed file raises ValueError naming it and the field."""
    require()
    summaries = list(_C._reload_profiles())
    for listener in _listeners:
        listener(summaries)
    return summaries


def available() -> list[dict[str, Any]]:
    """Summaries (gpu, model, parameters, source, path, tables) of the loaded profiles."""
    require()
    return list(_C._profile_summaries())


def lookup(
    model: str | None = None,
    batch_size: int = 1,
    gpu: str | None = None,
    parameters: int | None = None,
    gpu_count: int = 1,
) -> dict[str, Any] | None:
    """The profile entry for (GPU, model) at `batch_size`, interpolated, or None."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    ensure_configured()
    gpu = gpu or device_module.get_device_name()
    return _C._profile_lookup(gpu, model or "", parameters, int(batch_size), int(gpu_count))


def find(gpu: str, model: str) -> dict[str, Any]:
    """The profile of `model` on `gpu` (loose GPU name); ValueError listing what exists otherwise."""
    ensure_configured()
    rows = available()
    for r in rows:
        if r["model"] != model:
            continue
        smallest = r["tables"][0][1][0]
        entry = _C._profile_lookup(gpu, model, None, smallest, 1)
        if entry is not None:
            return entry
    have = sorted({f"{r['gpu']}/{r['model']}" for r in rows})
    raise ValueError(
        f"no profile for model '{model}' on GPU '{gpu}'; available: {', '.join(have) or 'none'} "
        f"(searched {', '.join(str(p) for p in search_path())})"
    )


def plot(doc: dict[str, Any], path: str | Path) -> None:
    """Writes a PNG of time and memory against batch size for one profile document."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("plotting needs matplotlib: pip install matplotlib") from None
    batches = doc["batches"]
    fig, (t_ax, m_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (
        ("forward_s", "forward"),
        ("backward_s", "backward + update"),
        ("transfer_pageable_s", "H2D copy (pageable)"),
    ):
        points = [(b["batch_size"], b[key] * 1e3) for b in batches if b.get(key) is not None]
        if points:
            t_ax.plot(*zip(*points, strict=True), marker=".", label=label)
    t_ax.set(xlabel="batch size", ylabel="time (ms)", title=f"{doc['model']} on {doc['gpu']}: time")
    t_ax.legend()
    for key, label in (("peak_bytes", "peak"), ("persistent_bytes", "persistent")):
        points = [(b["batch_size"], b[key] / 2**20) for b in batches if b.get(key) is not None]
        if points:
            m_ax.plot(*zip(*points, strict=True), marker=".", label=label)
    m_ax.set(xlabel="batch size", ylabel="memory (MiB)", title="memory")
    if m_ax.lines:
        m_ax.legend()
    fig.suptitle(f"source: {doc['provenance']['source']}"[:120], fontsize=8)
    fig.tight_layout()
    with atomic_output(path, fsync=False) as f:  # replaces a symlink at `path`, never writes through it
        fig.savefig(f, format=os.path.splitext(path)[1][1:] or "png", dpi=100)
    plt.close(fig)
