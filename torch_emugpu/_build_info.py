"""What the compiled extension was built with, and the check, made before `_C` loads, that the running
torch is the one it was built against.

CMake writes the facts at build time (build/torch/build_info.json) and setup.py ships them beside `_C` as
`_build.json`: torch's version, the compiler, the C++ ABI, Python. A wheel also requires that torch
(`torch==X.Y.Z`), so pip refuses or replaces another one; this check catches what gets past pip
(`--no-deps`, a torch changed afterwards), where loading `_C` would fail on a missing symbol or worse.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ._version import __version__

BUILD_FILE = Path(__file__).with_name("_build.json")


class TorchMismatchError(ImportError):
    """The running torch is not the one torch-emugpu's extension was built against."""


def build_info() -> dict[str, Any] | None:
    """The build's facts, or None where the extension was not built by setup.py (or not built at all)."""
    try:
        info = json.loads(BUILD_FILE.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def public_version(version: str) -> str:
    """2.14.1 for 2.14.1+cu130: the CPU and CUDA builds of one torch release share the extension's ABI."""
    return version.split("+", 1)[0]


def torch_mismatch(running: str, info: dict[str, Any] | None) -> TorchMismatchError | None:
    """The error to raise when `running` (torch.__version__) is not the torch `info` was built against."""
    built = info.get("torch") if info else None
    if not isinstance(built, str) or public_version(built) == public_version(running):
        return None
    return TorchMismatchError(
        f"torch-emugpu {__version__} was built against torch {built}, but this environment has torch {running}; "
        f"its compiled extension loads only in the torch it was built against. Either install that torch "
        f"(pip install torch=={public_version(built)}), or rebuild torch-emugpu against this one from its "
        f"source, in this environment (pip install --force-reinstall --no-deps SDIST-OR-CHECKOUT). "
        f"`torch-emugpu doctor` shows both."
    )


def diagnosing() -> bool:
    """True inside `torch-emugpu doctor`, which imports the package to report the mismatch that would
    otherwise stop the import (argv[0] is "-m" while `python -m torch_emugpu doctor` imports it)."""
    argv = sys.argv
    return len(argv) > 1 and argv[1] == "doctor" and Path(argv[0]).name in ("torch-emugpu", "-m", "__main__.py")
