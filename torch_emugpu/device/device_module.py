"""`torch.emugpu`: the torch.cuda-like API of the emulated GPUs."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from torch_emugpu import _C
from torch_emugpu.device import _devices
from torch_emugpu.device.memory import (
    empty_cache,
    host_memory_stats,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_host_memory_stats,
    reset_accumulated_memory_stats,
    reset_peak_host_memory_stats,
    reset_peak_memory_stats,
)

__all__ = [
    "is_available",
    "is_initialized",
    "init",
    "device_count",
    "current_device",
    "set_device",
    "device",
    "device_of",
    "synchronize",
    "get_device_name",
    "get_device_properties",
    "get_device_capability",
    "Stream",
    "Event",
    "current_stream",
    "default_stream",
    "set_stream",
    "stream",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "empty_cache",
    "mem_get_info",
    "memory_stats",
    "memory_summary",
    "host_memory_stats",
    "reset_peak_host_memory_stats",
    "reset_accumulated_host_memory_stats",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "initial_seed",
    "get_rng_state",
    "set_rng_state",
    "get_rng_state_all",
    "set_rng_state_all",
    "get_amp_supported_dtype",
    "is_bf16_supported",
    "utilization",
    "engine_stats",
    "reset_engine_stats",
]

_DeviceLike = _devices.DeviceLike
_index = _devices.index


def _lazy_init() -> None:
    """Creates the device context (torch.cuda._lazy_init/init): is_initialized() is True from here on."""
    _devices.ensure_configured()
    _devices.context_created()


def init() -> None:
    """As torch.cuda.init(): initializes the emulated devices now rather than at their first use."""
    _lazy_init()


def _is_in_bad_fork() -> bool:
    """True in a fork()ed child of a process that used emugpu: like CUDA, it may not use the devices."""
    return bool(_C._in_bad_fork())


def is_initialized() -> bool:
    """Whether a device context exists, as torch.cuda.is_initialized() means it: True after init(),
    set_device(), current_device(), synchronize(), a stream, an event or the first allocation on an
    emulated GPU; not after device_count() or is_available() alone (init_device_mesh relies on it to
    set each rank's device); False in a fork()ed child."""
    return _devices.has_context() and not _is_in_bad_fork()


def __getattr__(name: str) -> object:
    # torch.cuda's module flag, which torch.utils.checkpoint and torch.random.fork_rng's callers read
    # to decide whether to save and restore the device's RNG state.
    if name == "_initialized":
        return is_initialized()
    raise AttributeError(f"module 'torch.emugpu' has no attribute {name!r}")


def is_available() -> bool:
    """Always True: emulated GPUs need no hardware."""
    return True


def device_count() -> int:
    return _devices.count()


def current_device() -> int:
    return _devices.current()


def set_device(device: _DeviceLike) -> None:
    _C._set_device(_index(device))


class device:  # noqa: N801  (mirrors torch.cuda.device)
    """Context manager that makes `idx` the current emugpu device."""

    def __init__(self, idx: _DeviceLike) -> None:
        self.idx = _index(idx)
        self.prev = -1

    def __enter__(self) -> None:
        self.prev = current_device()
        set_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        set_device(self.prev)


class device_of(device):  # noqa: N801
    """Context manager that makes the device of tensor `obj` current."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.device.type == "emugpu" else current_device())


def synchronize(device: _DeviceLike = None) -> None:
    """Blocks until the emulated GPU has finished everything launched on it
    (collectives of backend `emu` whose end is not known yet included)."""
    _C._synchronize(_index(device))


@dataclass(frozen=True)
class EmuGpuDeviceProperties:
    name: str
    total_memory: int
    multi_processor_count: int
    major: int
    minor: int
    fp32_flops: float
    tf32_flops: float
    fp16_flops: float
    bf16_flops: float
    memory_bandwidth: float
    pcie_generation: int
    pcie_width: int
    nvlink_bandwidth: float
    # MIG: the profile of an instance ("3g.40gb", empty for a whole GPU), its GPU's name and
    # its UUID (as CUDA_VISIBLE_DEVICES and EMUGPU_VISIBLE_DEVICES name it); the profiles a
    # whole GPU can be split into.
    mig_profile: str = ""
    parent_name: str = ""
    uuid: str = ""
    mig_profiles: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return (
            f"_EmuGpuDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1 << 20)}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


def get_device_properties(device: _DeviceLike = None) -> EmuGpuDeviceProperties:
    raw = dict(_C._device_properties(_index(device)))
    raw["mig_profiles"] = tuple(raw.get("mig_profiles", ()))
    return EmuGpuDeviceProperties(**raw)


def get_device_name(device: _DeviceLike = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: _DeviceLike = None) -> tuple[int, int]:
    p = get_device_properties(device)
    return p.major, p.minor


def utilization(device: _DeviceLike = None) -> int:
    """Percent of the recent time the emulated GPU ran kernels, as torch.cuda.utilization() reports it
    from NVML: the GPU's, from every process using it. A process's own GPU: the last second (host time)
    of its compute engine. A GPU of emugpud's: the chance that some attached process had work over the
    daemon's window (smi's GPU-Util); process_utilization() gives each process's part."""
    index = _index(device)
    gpu = _C._daemon_gpu(index)
    if gpu < 0:
        return int(_C._utilization(index))
    from torch_emugpu.cli import daemon as daemon_cli

    return daemon_cli.gpu_utilization(daemon_cli.status(_daemon_address()), gpu)


def _daemon_address() -> str:
    attachment = _C._daemon_attachment()
    assert attachment is not None, "a device with a daemon GPU belongs to an attached process"
    return str(attachment["address"])


def process_utilization(device: _DeviceLike = None) -> list[dict[str, int | float | str]]:
    """Per process using the emulated GPU, as nvidia-smi's process table (and NVML's per-process
    utilization): pid, name, `sm` (percent of the recent window its kernels had work), `share` (the
    fraction of the GPU's speed its kernels got) and `memory` (bytes its allocator holds). This process
    alone for a GPU of its own; every attached process for a GPU of emugpud's."""
    import os

    index = _index(device)
    gpu = _C._daemon_gpu(index)
    if gpu < 0:
        sm = int(_C._utilization(index))
        return [{"pid": os.getpid(), "name": "", "sm": sm, "share": 1.0, "memory": memory_reserved(index)}]
    from torch_emugpu.cli import daemon as daemon_cli

    s = daemon_cli.status(_daemon_address())
    return [
        {
            "pid": p["pid"],
            "name": p["name"],
            "sm": round(100 * p["busy"][gpu]),
            "share": p["share"][gpu],
            "memory": p["bytes"][gpu],
        }
        for p in s["processes"]
        if p["bytes"][gpu] > 0 or p["busy"][gpu] > 0
    ]


def engine_stats(device: _DeviceLike = None) -> dict[str, float | int]:
    """Emulated busy time (seconds) and launches per engine (compute, h2d, d2h,
    collective: torch.distributed collectives of backend `emu`) since the last
    reset_engine_stats(), and the host's time blocked waiting."""
    raw = _C._engine_stats(_index(device))
    out: dict[str, float | int] = {}
    for engine in ("compute", "h2d", "d2h", "collective"):
        launches, busy_ns = raw[engine]
        out[f"{engine}_launches"] = int(launches)
        out[f"{engine}_busy_s"] = busy_ns / 1e9
    out["host_blocked_s"] = raw["host_blocked_ns"] / 1e9
    # Under the virtual clock: emulated seconds per wall second since the last reset (the real clock's is 1).
    out["emulated_s_per_wall_s"] = float(_C._clock_stats().get("speedup", 1.0))
    return out


def reset_engine_stats(device: _DeviceLike = None) -> None:
    """Restarts engine_stats()'s figures (and the clock's, torch_emugpu.clock_report())."""
    _C._reset_engine_stats(_index(device))
    _C._clock_reset_stats()


# --- streams and events ------------------------------------------------------


class _EmuGpuKind(type):
    """isinstance() says yes to the torch type on an emugpu device.

    torch.Stream and torch.Event check their arguments' exact types, so the
    emugpu constructors return those types rather than subclasses.
    """

    _base: type

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls._base) and torch.device(obj.device).type == "emugpu"  # type: ignore[attr-defined]


class Stream(metaclass=_EmuGpuKind):
    """An emulated CUDA stream (a torch.Stream): its own position on the device's timeline."""

    _base = torch.Stream

    def __new__(cls, device: _DeviceLike = None, priority: int = 0) -> torch.Stream:  # type: ignore[misc]
        return torch.Stream(device=torch.device("emugpu", _index(device)), priority=priority)


class Event(metaclass=_EmuGpuKind):
    """An event on the emulated timeline (a torch.Event); elapsed_time() is emulated GPU time."""

    _base = torch.Event

    def __new__(  # type: ignore[misc]
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> torch.Event:
        return torch.Event(
            device=torch.device("emugpu", current_device()),
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )


def current_stream(device: _DeviceLike = None) -> torch.Stream:
    return torch._C._accelerator_getStream(_index(device))


def default_stream(device: _DeviceLike = None) -> torch.Stream:
    current = torch._C._accelerator_getStream(_index(device))
    return torch.Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    if stream is None:
        return
    torch._C._accelerator_setStream(stream)


@contextlib.contextmanager
def stream(stream: torch.Stream | None) -> Iterator[None]:
    """Makes `stream` current (on its device) inside the block."""
    if stream is None:
        yield
        return
    prev_device = current_device()
    prev = current_stream(stream.device_index)
    set_device(stream.device_index)
    set_stream(stream)
    try:
        yield
    finally:
        set_stream(prev)
        set_device(prev_device)


# --- random numbers ------------------------------------------------------------


def _generator(device: _DeviceLike = None, create_context: bool = True) -> torch.Generator:
    return _C._default_generator(_index(device, create_context))


# Seeding creates no device context, as torch.cuda's defers it (torch.manual_seed seeds every device
# before init_device_mesh, which picks each rank's device only while no context exists). In a forked
# child (a DataLoader worker's worker_init_fn, Hugging Face's seed_worker) it does nothing, as CUDA's
# queues it for a context the child can never make.
def _not_in_forked_child(seeding: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(seeding)
    def wrapper(*args: Any) -> None:
        if not _is_in_bad_fork():
            seeding(*args)

    return wrapper


@_not_in_forked_child
def manual_seed(seed: int) -> None:
    _generator(create_context=False).manual_seed(int(seed))


@_not_in_forked_child
def manual_seed_all(seed: int) -> None:
    for i in range(_devices.count()):
        _generator(i, create_context=False).manual_seed(int(seed))


@_not_in_forked_child
def seed() -> None:
    _generator(create_context=False).seed()


@_not_in_forked_child
def seed_all() -> None:
    s = _generator(0, create_context=False).seed()
    for i in range(1, _devices.count()):
        _generator(i, create_context=False).manual_seed(s)


def initial_seed() -> int:
    return int(_generator().initial_seed())


def get_rng_state(device: _DeviceLike = "emugpu") -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "emugpu") -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# --- autocast ------------------------------------------------------------------


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Dtypes torch.autocast("emugpu") may use: fp16 always, bf16 from sm_80 on."""
    return [torch.float16, torch.bfloat16] if is_bf16_supported() else [torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return including_emulation or get_device_capability()[0] >= 8
