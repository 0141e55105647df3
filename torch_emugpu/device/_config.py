"""The configuration in force, as the compiled core reports it.

The environment (EMUGPU_GPU, EMUGPU_DEVICE_COUNT, EMUGPU_MODE, EMUGPU_CATALOG,
EMUGPU_EXCHANGE, ...)
is parsed in one place, the C++ core (csrc/core/config.cpp), so that the
device count is right whoever asks first (autograd, torch.accelerator, a
DataLoader); `torch_emugpu.configure()` passes explicit values down.
"""

from __future__ import annotations

import operator
import reprlib
from dataclasses import dataclass
from typing import Any

MAX_DEVICES = 64  # kMaxDevices in csrc/core/config.h
MODES = ("timing", "compute")
CLOCKS = ("real", "virtual")
HOSTS = ("measured", "modelled")


@dataclass(frozen=True)
class Config:
    gpu: str
    device_count: int
    mode: str
    catalog: str
    exchange: str  # how backend `emu`'s ranks exchange: auto, tcp or shm
    host_copy_gbps: float  # staging rate of pageable host<->device copies
    host_op_us: float  # the emulated host's time per launched op (0: this host's pace)
    clock: str = "real"  # real: the host sleeps until the GPU is done; virtual: nothing sleeps
    host: str = "measured"  # under the virtual clock: measured or modelled host work
    host_speed: float = 1.0  # how many times faster the emulated host is than this one
    host_cost_file: str = ""  # EMUGPU_HOST_COST: a host cost file pricing the modelled host ("": the H100's host)


def _found(value: Any) -> str:
    return f"{type(value).__name__} {reprlib.repr(value)}"


def check_clock_arguments(clock: Any, host: Any, host_speed: Any) -> float | None:
    """Checks configure()'s clock arguments' types (the core checks their values); returns host_speed as a float."""
    if clock is not None and not isinstance(clock, str):
        raise TypeError(f"configure(clock=...): expected one of {', '.join(map(repr, CLOCKS))}, got {_found(clock)}")
    if host is not None and not isinstance(host, str):
        raise TypeError(f"configure(host=...): expected one of {', '.join(map(repr, HOSTS))}, got {_found(host)}")
    if host_speed is None:
        return None
    if isinstance(host_speed, bool) or not isinstance(host_speed, (int, float)):
        raise TypeError(
            f"configure(host_speed=...): expected a number, how many times faster the emulated host is "
            f"(e.g. 1.5), got {_found(host_speed)}"
        )
    return float(host_speed)


def check_arguments(gpu: Any, device_count: Any, mode: Any) -> int | None:
    """Checks configure()'s arguments before they reach the compiled core,
    whose binding would otherwise answer a wrong type or an int beyond C's
    with "Unable to cast Python instance"; returns device_count as an int."""
    if gpu is not None and not isinstance(gpu, str):
        raise TypeError(
            f"configure(gpu=...): expected a GPU name as a str, e.g. 'v100' (torch-emugpu gpus lists them), "
            f"got {_found(gpu)}"
        )
    if mode is not None and not isinstance(mode, str):
        raise TypeError(f"configure(mode=...): expected one of {', '.join(map(repr, MODES))}, got {_found(mode)}")
    if device_count is None:
        return None
    # bool is an int to Python, but configure(device_count=True) is a mistake, not 1 GPU;
    # numpy's integers have __index__ and are welcome
    if isinstance(device_count, bool) or not hasattr(type(device_count), "__index__"):
        raise TypeError(
            f"configure(device_count=...): expected an int number of emulated GPUs from 1 to {MAX_DEVICES}, "
            f"got {_found(device_count)}"
        )
    count = operator.index(device_count)
    if count < 1:
        raise ValueError(f"device_count: expected a positive number of emulated GPUs (1 to {MAX_DEVICES}), got {count}")
    if count > MAX_DEVICES:
        raise ValueError(
            f"device_count: expected at most {MAX_DEVICES} emulated GPUs, got {reprlib.repr(count)}; "
            f"emulate {MAX_DEVICES} or fewer per process (torchrun runs more processes)"
        )
    return count
