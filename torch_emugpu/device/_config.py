"""The configuration in force, as the compiled core reports it.

The environment (EMUGPU_GPU, EMUGPU_DEVICE_COUNT, EMUGPU_MODE, EMUGPU_CATALOG,
EMUGPU_EXCHANGE, ...)
is parsed in one place, the C++ core (csrc/core/config.cpp), so that the
device count is right whoever asks first (autograd, torch.accelerator, a
DataLoader); `torch_emugpu.configure()` passes explicit values down.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    gpu: str
    device_count: int
    mode: str
    catalog: str
    exchange: str  # how backend `emu`'s ranks exchange: auto, tcp or shm
    host_copy_gbps: float  # staging rate of pageable host<->device copies
    host_op_us: float  # the emulated host's time per launched op (0: this host's pace)
