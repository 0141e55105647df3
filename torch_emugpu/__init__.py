"""torch-emugpu: an emulated GPU device for stock PyTorch.

    import torch                       # autoloads torch_emugpu (torch.backends entry point)
    model = model.to("emugpu")         # ops take the time they would on the emulated GPU

See README.md for configuration (EMUGPU_GPU, EMUGPU_DEVICE_COUNT, EMUGPU_MODE).
"""

from __future__ import annotations

import torch

from . import _config

try:
    from . import _C  # registers the PrivateUse1 kernels, guard and allocator
except ImportError as _error:  # the profiler and importers work without it
    _C = None  # type: ignore[assignment]
    _C_ERROR: ImportError | None = _error
else:
    _C_ERROR = None

__version__ = "0.1.0"
__all__ = ["configure", "config", "gpu_names", "use_profile", "profiled_as", "region_report", "__version__"]

_current: _config.Config | None = None


def configure(gpu: str | None = None, device_count: int | None = None, mode: str | None = None) -> None:
    """(Re)configure the emulated GPUs; arguments left out come from the environment.

    Must run before emugpu tensors exist (or after they are all freed), except
    that `mode` alone may change at any time.
    """
    global _current
    if _C is None:
        raise RuntimeError(f"torch-emugpu's compiled extension is not available ({_C_ERROR}); "
                           "build it with `pip install --no-build-isolation .` (the profiler and importers "
                           "work without it)")
    if gpu is None and device_count is None and mode is not None and _current is not None:
        _C._set_mode(_config.parse_mode(mode, "mode"))
        _current = _config.Config(_current.gpu, _current.device_count, mode, _current.catalog)
        return
    base = _current
    cfg = _config.from_environment(
        gpu=gpu if gpu is not None else (base.gpu if base else None),
        device_count=device_count if device_count is not None else (base.device_count if base else None),
        mode=mode if mode is not None else (base.mode if base else None),
    )
    _C._configure(cfg.catalog, cfg.gpu, cfg.device_count, cfg.mode)
    _current = cfg
    from . import profiles

    profiles.reload()


def config() -> _config.Config:
    """The configuration in force (configuring from the environment if needed)."""
    _ensure_configured()
    assert _current is not None
    return _current


def gpu_names() -> list[str]:
    """Names of every GPU in the catalog."""
    _ensure_configured()
    return list(_C._gpu_names())


def _ensure_configured() -> None:
    if _current is None:
        configure()


def use_profile(module: torch.nn.Module, model: str) -> torch.nn.Module:
    """Names the measured profile `module` runs under, e.g. use_profile(net, "resnet50")."""
    from . import profiles

    return profiles.use_profile(module, model)


def profiled_as(model: str):  # type: ignore[no-untyped-def]
    """Context manager: root modules run inside use the profile named `model`."""
    from . import profiles

    return profiles.profiled_as(model)


def region_report(device: int | None = None) -> list[dict]:
    """Which source (profile file, exact/interpolated/extrapolated, or cost model) timed each region."""
    from . import profiles

    return profiles.region_report(device)


def _register() -> None:
    from . import device_module

    if torch._C._get_privateuse1_backend_name() != "emugpu":
        torch.utils.rename_privateuse1_backend("emugpu")
    if not hasattr(torch, "emugpu"):
        torch._register_device_module("emugpu", device_module)
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)


if _C is not None:
    _register()
