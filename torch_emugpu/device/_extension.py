"""The compiled extension torch_emugpu._C, or why it is missing.

Imported once, here, so that the package's __init__ and the modules below it
agree on whether the device exists; the measuring tools (measure/) run
without it, so only the device's functions ask for it, with a message that
says how to build it.
"""

from __future__ import annotations

import torch

from torch_emugpu import _build_info

# Before _C loads: built against another torch, it would fail on a missing symbol, or load and misbehave.
MISMATCH = _build_info.torch_mismatch(torch.__version__, _build_info.build_info())
ERROR: ImportError | None
if MISMATCH is None:
    try:
        # Registers the PrivateUse1 kernels, guard and allocator. By its full name: where the file is missing,
        # the error then says so, not that the half-imported package has no `_C` ("circular import").
        import torch_emugpu._C as _C
    except ImportError as _error:  # the measuring tools work without it
        _C = None  # type: ignore[assignment]
        ERROR = _error
    else:
        ERROR = None
else:
    if not _build_info.diagnosing():
        raise MISMATCH
    _C = None  # type: ignore[assignment]  # `torch-emugpu doctor` runs on, to report it
    ERROR = MISMATCH

BUILD_HINT = (
    "build it with `pip install --no-build-isolation -e .` in the source tree (or run scripts/setup.sh); "
    "the profiler and importers work without it"
)


def require() -> None:
    """Raises RuntimeError, saying how to build it, when the extension is missing."""
    if _C is None:
        raise RuntimeError(f"torch-emugpu's compiled extension torch_emugpu._C is missing ({ERROR}); {BUILD_HINT}")


def ensure_configured() -> None:
    """Configures the emulated GPUs from the environment on first use."""
    require()
    _C._ensure_configured()
