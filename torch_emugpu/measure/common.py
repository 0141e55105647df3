"""What the measuring tools share: the version their files record, the
robust median they keep of each measurement, the measured device's name,
where a GPU's measured data go, and how files are written.

The emulator reads the same places (its profile search path begins with the
user's directory, and looks up a GPU's folder by `gpu_dir_name`), so they are
defined once, here, where the tools can use them without the extension.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

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


def _umask() -> int:
    """The process's umask, read without changing it (os.umask would, for a moment, in every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], fsync: bool = True) -> Iterator[IO[bytes]]:
    """A binary file that becomes `path` when the block ends without error.

    The temporary file gets an unpredictable name, created exclusively
    (mkstemp) in `path`'s directory: a fixed name such as `path.tmp` lets
    another user plant a symlink there, and the writer (root, say) then
    overwrites whatever the link points to. `os.replace` renames over `path`,
    replacing a symlink there rather than writing through it, so readers see
    the old file or the whole new one. The file ends with the mode a plain
    open() would give (0666 less the umask; mkstemp's is 0600). `fsync`
    makes the data durable before the rename, so a crash leaves the old
    file, not an empty new one. On any error the temporary file is removed.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _non_finite(doc: Any, where: str = "") -> tuple[str, float] | None:
    """The first place in `doc` holding NaN or an infinity, as a path like `batches[3].forward_s`."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return where or "the document", doc
    if isinstance(doc, dict):
        for key, value in doc.items():
            found = _non_finite(value, f"{where}.{key}" if where else str(key))
            if found:
                return found
    elif isinstance(doc, (list, tuple)):
        for i, value in enumerate(doc):
            found = _non_finite(value, f"{where}[{i}]")
            if found:
                return found
    return None


def write_json_atomic(path: str | os.PathLike[str], doc: Any) -> None:
    """Writes a JSON document so that readers never see half of it (see `atomic_output`).

    NaN and infinities are refused (ValueError naming the key): JSON has no
    such values, and the emulator's C++ parser (nlohmann/json) rejects the
    `NaN` that Python's json writes by default.
    """
    target = Path(path)
    try:
        text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    except ValueError as e:
        found = _non_finite(doc)
        where = f"{found[0]} is {found[1]}" if found else str(e)
        raise ValueError(
            f"{target}: not written: {where}; JSON holds finite numbers only. "
            "A measurement that failed should be left out or written as null"
        ) from e
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(target) as f:
        f.write(text.encode())
