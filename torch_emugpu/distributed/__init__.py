"""torch.distributed backend `emu` for emugpu tensors, and nn.DataParallel on
emugpu (_parallel.py).

The backend is C++ (csrc/backend/distributed, on the core's transports in
csrc/core/exchange); this package registers it. Importing torch_emugpu
registers it for the `emugpu` device and makes it the default there, as
`nccl` is for cuda: `init_process_group()`, `init_process_group("emu")`,
`init_process_group(device_id=torch.device("emugpu", r))` and
`"cpu:gloo,emugpu:emu"` all pick it. See docs/distributed.md.
"""

from __future__ import annotations

import atexit
import datetime

import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

__all__ = ["BACKEND_NAME", "DATA_THRESHOLD_BYTES", "create_backend"]

BACKEND_NAME = "emu"
# Per-tensor size up to which timing mode moves real bytes (core/exchange/words.h).
DATA_THRESHOLD_BYTES = 64 * 1024


def create_backend(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> _C10dBackend:
    """The creator c10d calls for backend `emu` (Backend.register_backend)."""
    from .. import _C

    return _C._EmuProcessGroup(store, rank, size, timeout.total_seconds())


def _drain_at_exit() -> None:
    """Lets each group's runner place what it holds before the interpreter
    ends (the other ranks reached those collectives too, or exited, which
    the transports notice)."""
    from .. import _C

    _C._drain_all_groups()


def _install() -> None:
    """Registers backend `emu` for the emugpu device (once per process)."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, create_backend, devices=["emugpu"])
    atexit.register(_drain_at_exit)
