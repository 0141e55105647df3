"""torch.distributed backend `emu` for emugpu tensors (in progress).

Importing torch_emugpu registers it for the `emugpu` device and makes it the
default there, as `nccl` is for cuda: `init_process_group()`,
`init_process_group("emu")`, `init_process_group(device_id=torch.device("emugpu", r))`
and `"cpu:gloo,emugpu:emu"` all pick it. See README.md "Distributed (in progress)".
"""

from __future__ import annotations

import torch.distributed as dist

from ._backend import DATA_THRESHOLD_BYTES, EmuBackend, EmuWork, create_backend
from ._exchange import Exchange, ExchangeError

__all__ = ["DATA_THRESHOLD_BYTES", "EmuBackend", "EmuWork", "Exchange", "ExchangeError", "BACKEND_NAME"]

BACKEND_NAME = "emu"


def _install() -> None:
    """Registers backend `emu` for the emugpu device (once per process)."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, create_backend, devices=["emugpu"])
