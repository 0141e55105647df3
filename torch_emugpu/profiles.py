"""Measured profiles drive the emulated clock.

Profiles (JSON, schema in profiles/README.md) are found on a search path:
the directories in EMUGPU_PROFILE_PATH (separated by os.pathsep) first, then
the user's directory ($XDG_DATA_HOME/torch-emugpu/profiles, by default
~/.local/share/torch-emugpu/profiles), then the profiles shipped with the
package. When a model running on emugpu matches a profile for the emulated
GPU (by name, given with `use_profile`/`profiled_as`, or by its parameter
count), its forward pass is charged the profiled forward time for the
observed batch size, and everything from the end of the forward to the next
forward (loss, backward, optimizer step) the profiled backward+update time.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torch_emugpu import _C

__all__ = ["search_path", "user_profile_dir", "reload", "available", "lookup", "use_profile", "profiled_as",
           "region_report"]


def user_profile_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "torch-emugpu" / "profiles"


def packaged_profile_dir() -> Path:
    here = Path(__file__).resolve().parent
    inside = here / "profiles"
    return inside if inside.is_dir() else here.parent / "profiles"


def search_path() -> list[Path]:
    """Directories searched for profiles, first match wins."""
    env = [Path(p) for p in os.environ.get("EMUGPU_PROFILE_PATH", "").split(os.pathsep) if p.strip()]
    return [*env, user_profile_dir(), packaged_profile_dir()]


_lock = threading.RLock()
_summaries: list[dict[str, Any]] | None = None


def reload() -> list[dict[str, Any]]:
    """(Re)reads every profile on the search path; a malformed file raises ValueError naming it."""
    global _summaries
    import torch_emugpu

    torch_emugpu._ensure_configured()  # GPU names are checked against the catalog (configure() reloads too)
    with _lock:
        _summaries = list(_C._load_profiles([str(p) for p in search_path()]))
        _plans.clear()
        _sources.clear()
        _warned.clear()
    if _summaries:
        _install_hooks()
    return _summaries


def available() -> list[dict[str, Any]]:
    """Summaries (gpu, model, parameters, source, path, tables) of the loaded profiles."""
    return list(_summaries if _summaries is not None else reload())


def lookup(model: str | None = None, batch_size: int = 1, gpu: str | None = None,
           parameters: int | None = None, gpu_count: int = 1) -> dict[str, Any] | None:
    """The profile entry for (GPU, model) at `batch_size`, interpolated, or None."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    import torch_emugpu

    torch_emugpu._ensure_configured()
    if _summaries is None:
        reload()
    gpu = gpu or torch.emugpu.get_device_name()
    return _C._profile_lookup(gpu, model or "", parameters, int(batch_size), int(gpu_count))


def find(gpu: str, model: str) -> dict[str, Any]:
    """The profile of `model` on `gpu` (loose GPU name); ValueError listing what exists otherwise."""
    import torch_emugpu

    torch_emugpu._ensure_configured()
    rows = available()
    for r in rows:
        if r["model"] != model:
            continue
        smallest = r["tables"][0][1][0]
        entry = _C._profile_lookup(gpu, model, None, smallest, 1)
        if entry is not None:
            return entry
    have = sorted({f"{r['gpu']}/{r['model']}" for r in rows})
    raise ValueError(f"no profile for model '{model}' on GPU '{gpu}'; available: {', '.join(have) or 'none'} "
                     f"(searched {', '.join(str(p) for p in search_path())})")


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
    for key, label in (("forward_s", "forward"), ("backward_s", "backward + update"),
                       ("transfer_pageable_s", "H2D copy (pageable)")):
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
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --- model-level regions ---------------------------------------------------------------


@dataclass
class _Plan:
    device: int
    forward_key: str
    backward_key: str
    forward_s: float
    backward_s: float
    entry: dict[str, Any]


_plans: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[int, str | None], _Plan | None]] = (
    weakref.WeakKeyDictionary())
_module_info: weakref.WeakKeyDictionary[torch.nn.Module, tuple[int, int] | None] = weakref.WeakKeyDictionary()
_explicit: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
_scoped = threading.local()
_active: dict[int, torch.nn.Module] = {}  # thread id -> root module inside its forward
_sources: dict[str, dict[str, Any]] = {}
_warned: set[str] = set()
_hooks_installed = False


def use_profile(module: torch.nn.Module, model: str) -> torch.nn.Module:
    """Names the profile `module` runs under (e.g. "resnet50"); returns `module`."""
    _explicit[module] = model
    _install_hooks()
    return module


@contextlib.contextmanager
def profiled_as(model: str) -> Iterator[None]:
    """Root modules run inside the block use the profile named `model`."""
    previous = getattr(_scoped, "model", None)
    _scoped.model = model
    _install_hooks()
    try:
        yield
    finally:
        _scoped.model = previous


def _device_and_parameters(module: torch.nn.Module) -> tuple[int, int] | None:
    if module in _module_info:
        return _module_info[module]
    info = None
    params = list(module.parameters())
    if params and params[0].device.type == "emugpu":
        info = (params[0].device.index or 0, sum(p.numel() for p in params))
    _module_info[module] = info
    return info


def _batch_size(args: tuple[Any, ...]) -> int | None:
    for a in args:
        if isinstance(a, torch.Tensor):
            return int(a.shape[0]) if a.dim() > 0 else None
    return None


def _plan_for(module: torch.nn.Module, args: tuple[Any, ...]) -> _Plan | None:
    info = _device_and_parameters(module)
    if info is None:
        return None
    batch = _batch_size(args)
    if batch is None or batch < 1:
        return None
    device, parameters = info
    name = _explicit.get(module) or getattr(_scoped, "model", None)
    cached = _plans.setdefault(module, {})
    if (batch, name) in cached:
        return cached[(batch, name)]
    entry = lookup(model=name, batch_size=batch, gpu=torch.emugpu.get_device_name(device),
                   parameters=None if name else parameters)
    plan = None
    label = name or f"{type(module).__name__}({parameters} parameters)"
    if entry is None:
        _sources[label] = {"source": "cost model", "batch_size": batch}
        if name:
            warnings.warn(f"emugpu: no profile for model '{name}' on {torch.emugpu.get_device_name(device)}; "
                          f"its time comes from the cost model (torch-emugpu profiles lists what exists)",
                          stacklevel=3)
    else:
        model = entry["model"]
        if entry["kind"] == "extrapolated" and entry["path"] not in _warned:
            _warned.add(entry["path"])
            sizes = entry["tables"][0][1]
            warnings.warn(f"emugpu: batch size {batch} lies outside the profiled range {sizes[0]}-{sizes[-1]} of "
                          f"{entry['path']}; extrapolating linearly", stacklevel=3)
        plan = _Plan(device, f"{model}@{batch}:forward", f"{model}@{batch}:backward",
                     entry["forward_s"], entry["backward_s"], entry)
        for region in (plan.forward_key, plan.backward_key):
            _sources[region] = {"source": entry["path"], "kind": entry["kind"], "batch_size": batch}
    cached[(batch, name)] = plan
    return plan


def _use_measured_transfer(plan: _Plan, args: tuple[Any, ...]) -> None:
    entry = plan.entry
    pageable = entry.get("transfer_pageable_s")
    if not pageable:
        return
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is None:
        return
    nbytes = first.numel() * first.element_size()
    pinned = entry.get("transfer_pinned_s")
    _C._set_measured_transfer(plan.device, 0.0, nbytes / pageable, nbytes / pinned if pinned else 0.0)


def _pre_hook(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
    root = _active.get(threading.get_ident())
    if root is not None and root is not module:
        return  # a submodule of the running root
    plan = _plan_for(module, args)
    if plan is None:
        return
    _active[threading.get_ident()] = module
    _use_measured_transfer(plan, args)
    _C._region_begin(plan.device, plan.forward_key, plan.forward_s, False)


def _post_hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
    if _active.get(threading.get_ident()) is not module:
        return
    del _active[threading.get_ident()]
    plan = _plan_for(module, args)
    if plan is not None:
        # Loss, backward and the optimizer step run until the next forward,
        # or until the loop waits for the device (synchronize, .item(), ...).
        _C._region_begin(plan.device, plan.backward_key, plan.backward_s, True)


def _install_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    torch.nn.modules.module.register_module_forward_pre_hook(_pre_hook)
    torch.nn.modules.module.register_module_forward_hook(_post_hook)
    _hooks_installed = True


def region_report(device: int | None = None) -> list[dict[str, Any]]:
    """Per region: its source (profile file and whether exact, interpolated or
    extrapolated), the profiled target, the time charged and the scale applied;
    models that matched no profile are listed with source "cost model"."""
    index = torch.emugpu.current_device() if device is None else device
    rows = []
    for r in _C._region_report(index):
        rows.append({**r, **_sources.get(r["key"], {"source": "unknown"})})
    for label, info in _sources.items():
        if info["source"] == "cost model":
            rows.append({"key": label, **info})
    return rows
