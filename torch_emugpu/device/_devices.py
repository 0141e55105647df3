"""Device indices as torch.cuda accepts them (None, int, "emugpu:1",
torch.device), shared by torch.emugpu's device, stream and memory functions."""

from __future__ import annotations

from collections.abc import Callable

import torch

from torch_emugpu import _C

DeviceLike = torch.device | str | int | None

# Run mode (as_cuda.install) sets this: "cuda" devices name emugpu ones, and an ordinal out of range
# raises CUDA's error, which this makes.
cuda_ordinal_error: Callable[[int], Exception] | None = None


def ensure_configured() -> None:
    """Configures the emulated GPUs from the environment on first use."""
    _C._ensure_configured()


_context = False  # a device context exists (torch.cuda.is_initialized's meaning)


def context_created() -> None:
    global _context
    _context = True


def has_context() -> bool:
    """Whether a device was selected, initialized or allocated on (not merely counted)."""
    global _context
    if not _context and _C._configured():
        # Allocations come from C++ paths (factories, copies) that never pass through Python here.
        _context = any(
            int(_C._memory_stats(i)["allocation"]["all"]["allocated"]) > 0 for i in range(int(_C._device_count()))
        )
    return _context


def count() -> int:
    ensure_configured()
    return int(_C._device_count())


def current() -> int:
    ensure_configured()
    context_created()
    return int(_C._current_device())


def index(device: DeviceLike = None, create_context: bool = True) -> int:
    """The emugpu device index `device` names; IndexError when out of range. Naming a device
    (set_device, synchronize, streams, properties) creates its context, as in CUDA; seeding does not
    (`create_context=False`: torch.cuda.manual_seed defers to the context's creation)."""
    ensure_configured()
    if create_context:
        context_created()
    if device is None:
        return int(_C._current_device())
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "emugpu" and not (device.type == "cuda" and cuda_ordinal_error is not None):
            raise ValueError(f"expected an emugpu device, got {device}")
        device = int(_C._current_device()) if device.index is None else device.index
    if isinstance(device, int):
        n = int(_C._device_count())
        if not 0 <= device < n:
            if cuda_ordinal_error is not None:
                raise cuda_ordinal_error(device)
            raise IndexError(
                f"emugpu device index out of range: expected 0 <= index < {n}, got {device};"
                " set EMUGPU_DEVICE_COUNT for more devices"
            )
        return device
    raise TypeError(f"expected a device, a device string or an index, got {type(device).__name__}")
