"""torch-emugpu: an emulated GPU device for stock PyTorch.

    import torch                       # autoloads torch_emugpu (torch.backends entry point)
    model = model.to("emugpu")         # ops take the time they would on the emulated GPU

See README.md for configuration (EMUGPU_GPU, EMUGPU_DEVICE_COUNT, EMUGPU_MODE).
"""

from __future__ import annotations

import contextlib
import os
from types import ModuleType
from typing import Any

import torch

from ._version import __version__
from .device import _config, _virtual_time
from .device._extension import _C
from .device._extension import BUILD_HINT as _BUILD_HINT
from .device._extension import ERROR as _C_ERROR
from .device._extension import MISMATCH as _TORCH_MISMATCH
from .device._extension import ensure_configured as _ensure_configured
from .device._extension import require as _require_extension
from .device._launcher import is_launcher as _is_launcher
from .device.cost_report import cost_report, kernel_params, reset_cost_report

__all__ = [
    "configure",
    "config",
    "gpu_names",
    "use_profile",
    "profiled_as",
    "region_report",
    "utilization",
    "host_bound_report",
    "cost_report",
    "reset_cost_report",
    "kernel_params",
    "clock_report",
    "reset_clock_report",
    "__version__",
]


def configure(
    gpu: str | None = None,
    device_count: int | None = None,
    mode: str | None = None,
    *,
    clock: str | None = None,
    host: str | None = None,
    host_speed: float | None = None,
) -> None:
    """(Re)configure the emulated GPUs; arguments left out keep their current
    value, or come from the environment before the first configuration.

    `clock`: "real" (the host sleeps until the emulated GPU is done) or
    "virtual" (nothing sleeps; Python's clocks read emulated time). Under the
    virtual clock, `host` says how the host's own work advances time:
    "measured" (this thread's CPU time, divided by `host_speed`) or "modelled"
    (a fixed cost per op: the same times on every rerun and machine).

    Must run before emugpu tensors exist (or after they are all freed), except
    that `mode` alone may change at any time. A wrong type raises TypeError, a
    value out of range ValueError, naming the argument.
    """
    device_count = _config.check_arguments(gpu, device_count, mode)
    host_speed = _config.check_clock_arguments(clock, host, host_speed)
    _require_extension()
    clock_given = clock is not None or host is not None or host_speed is not None
    if gpu is None and device_count is None and mode is not None and not clock_given and _C._configured():
        _C._set_mode(mode)
        return
    if _C._configured():
        current = config()
        gpu = current.gpu if gpu is None else gpu
        device_count = current.device_count if device_count is None else device_count
        mode = current.mode if mode is None else mode
        clock = current.clock if clock is None else clock
        host = current.host if host is None else host
        host_speed = current.host_speed if host_speed is None else host_speed
    _C._configure(gpu, device_count, mode, clock, host, host_speed)  # reads the profiles and calibration too
    _virtual_time.follow_configuration()
    from .timing import planner

    planner.profiles_reloaded()


def clock_report() -> dict[str, Any]:
    """Which clock runs ("clock": real or virtual) and, under the virtual one,
    how fast: "speedup" (emulated seconds per wall second), "elapsed_s",
    "wall_s", and where the emulated time went: "host_s" (the host's own
    work), "waited_s" (waits for the device or other processes), "slept_s"
    (time.sleep), since the process started or the last reset_clock_report()."""
    _ensure_configured()
    return _virtual_time.clock_report()


def reset_clock_report() -> None:
    """Restarts clock_report()'s figures."""
    _ensure_configured()
    _C._clock_reset_stats()


def config() -> _config.Config:
    """The configuration in force (configuring from the environment if needed)."""
    _require_extension()
    return _config.Config(**_C._config())


def gpu_names() -> list[str]:
    """Names of every GPU in the catalog."""
    _require_extension()
    return list(_C._gpu_names())


def utilization(device: int | None = None) -> int:
    """Percent of the last second the emulated GPU's compute engine was busy (torch.cuda.utilization)."""
    return _device_module().utilization(device)


def host_bound_report(device: int | None = None) -> dict[str, float | int]:
    """Whether the emulated GPU sat idle waiting for this host to launch work.

    Host time is cut into windows of at least half a second, closed at host
    waits (synchronize, .item(), D2H copies); the first is warm-up. A window
    is host-bound when the device sat idle more than 10% of it: times measured
    then are this machine's host (and the ranks sharing its cores), not the
    GPU's. Keys: windows, host_bound_windows, last_idle_fraction,
    worst_idle_fraction, idle_ns (total idle time so far). A warning says so
    the first time it happens.
    """
    _ensure_configured()
    index = _device_module().current_device() if device is None else torch.device("emugpu", device).index
    return dict(_C._host_bound_stats(index))


def use_profile(module: torch.nn.Module, model: str) -> torch.nn.Module:
    """Names the measured profile `module` runs under, e.g. use_profile(net, "resnet50")."""
    from .timing import planner

    return planner.use_profile(module, model)


def profiled_as(model: str) -> contextlib.AbstractContextManager[None]:
    """Context manager: root modules run inside use the profile named `model`."""
    from .timing import planner

    return planner.profiled_as(model)


def region_report(device: int | None = None) -> list[dict]:
    """Which source (profile file, exact/interpolated/extrapolated, or cost model) timed each region."""
    from .timing import planner

    return planner.region_report(device)


def _device_module() -> ModuleType:
    from .device import device_module  # what torch.emugpu is, typed (PyTorch adds torch.emugpu at run time)

    return device_module


def _start_virtual_clock() -> None:
    """Under EMUGPU_CLOCK=virtual, Python's clocks read virtual time from the
    import on: the device is configured now so that they never switch later.
    A launcher (torchrun) keeps the real clock; its workers start the virtual
    one. A configuration error is left for the first use to raise."""
    if os.environ.get("EMUGPU_CLOCK", "").strip().lower() != "virtual" or _is_launcher():
        return
    try:
        _C._ensure_configured()
    except Exception:  # noqa: BLE001 - raised again, with its message, at the first use
        return
    _virtual_time.follow_configuration()


def _register() -> None:
    from .device import device_module

    if torch._C._get_privateuse1_backend_name() != "emugpu":
        torch.utils.rename_privateuse1_backend("emugpu")
    if not hasattr(torch, "emugpu"):
        torch._register_device_module("emugpu", device_module)
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    from .device import _loader_clock, _sharing, _shutdown, _ties, as_cuda
    from .distributed import _parallel
    from .timing import planner

    if as_cuda.requested():
        as_cuda.install()  # first: it narrows the device count to CUDA_VISIBLE_DEVICES before configuration
    _parallel.install()
    _loader_clock.install()
    _start_virtual_clock()
    _shutdown.install()
    _ties.install()
    _sharing.install()
    planner.activate()
    from . import compile as _compile

    _compile.install()
    if torch.distributed.is_available():
        from . import distributed

        distributed._install()


if _C is not None:
    _register()
else:
    # Let "emugpu" parse as a device name so that the error a user meets says what is missing; but not
    # beside CUDA, where the profiler runs without the extension: naming PrivateUse1 without a device
    # guard makes autograd's backward fail there ("not linked with support for emugpu devices").
    if torch._C._get_privateuse1_backend_name() == "privateuseone" and not torch.cuda.is_available():
        torch.utils.rename_privateuse1_backend("emugpu")
    import warnings

    if _TORCH_MISMATCH is None:  # else only `torch-emugpu doctor` gets here, and reports it
        warnings.warn(
            f"torch-emugpu: the compiled extension torch_emugpu._C is missing ({_C_ERROR}), so the emugpu "
            f"device is not available; {_BUILD_HINT}",
            RuntimeWarning,
            stacklevel=2,
        )
