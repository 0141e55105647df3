"""The data path: image datasets on disk, JPEG decoding on emugpu as nvJPEG
does it, and training fed by a DataLoader that says where each epoch's time
went."""

from __future__ import annotations

import signal


class WorkerDiedError(RuntimeError):
    """A worker process (of `dataset make`, or a DataLoader's under `train
    --data`) ended without finishing its work: killed by a signal, the
    out-of-memory killer's SIGKILL most often, or exited with an error status."""


def exit_description(exitcode: int | None) -> str:
    """How a process ended, from multiprocessing's exitcode (minus the signal number if a signal killed it)."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "an unknown signal"
        return f"was killed by signal {name} ({-exitcode})"
    return f"exited with status {exitcode}"


def death_hint(exitcode: int | None) -> str:
    """What to do about a worker that died so."""
    if exitcode == -signal.SIGKILL:
        return (
            "SIGKILL is what the kernel's out-of-memory killer sends when memory runs out "
            "(`dmesg` or the system journal says whether it did)"
        )
    return "its output above may say why"
