"""What the per-op cost model charged, per op family, and why:
`torch_emugpu.cost_report()` reads it from a running program (`torch-emugpu
explain` prints it for a model's training iteration), `kernel_params()` says
which parameters the model times kernels with.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_emugpu.device import device_module
from torch_emugpu.device._extension import _C, ensure_configured


def cost_report(device: int | None = None, reset: bool = False) -> list[dict[str, Any]]:
    """Per op family, what the cost model charged `device` since the last reset, the most time first.

    Keys: family, ops, kernels (launches: a convolution's backward is two,
    a foreach op one per chunk of tensors), time_s, share (of the time charged), tflops and
    gbps (achieved), compute_of_peak and memory_of_peak (the family's FLOPs at
    the dtype's peak, and its bytes at the memory's peak bandwidth, as
    fractions of the time charged), bound ("compute" or "memory": what most of
    its ops were), flops, bytes. Ops the model has no family for are charged
    by the bytes they move and reported as "unmodelled (by bytes)". Kernels that profiled regions re-timed
    count with what the cost model charged them."""
    ensure_configured()
    index = device_module.current_device() if device is None else torch.device("emugpu", device).index
    raw = list(_C._cost_report(index))
    if reset:
        _C._reset_cost_report(index)
    total = sum(r["time_ns"] for r in raw) or 1
    rows = []
    for r in raw:
        t = r["time_ns"] or 1
        rows.append(
            {
                "family": r["family"],
                "ops": r["ops"],
                "kernels": r["kernels"],
                "time_s": r["time_ns"] / 1e9,
                "share": r["time_ns"] / total,
                "tflops": r["flops"] / t / 1e3,
                "gbps": r["bytes"] / t,
                "compute_of_peak": r["peak_compute_ns"] / t,
                "memory_of_peak": r["peak_memory_ns"] / t,
                "bound": "compute" if 2 * r["compute_bound_ops"] > r["ops"] else "memory",
                "flops": r["flops"],
                "bytes": r["bytes"],
            }
        )
    return rows


def kernel_params(device: int | None = None) -> dict[str, Any]:
    """The per-op cost model's kernel parameters for `device` and their `source`: "table: <architecture>"
    (csrc/core/kernel_params.cpp) or "calibration: <file>" (fitted to a `torch-emugpu calibrate` sweep
    for this GPU found on the profile search path)."""
    ensure_configured()
    index = device_module.current_device() if device is None else torch.device("emugpu", device).index
    return dict(_C._current_kernel_params(index))


def reset_cost_report(device: int | None = None) -> None:
    """Starts cost_report() over."""
    cost_report(device, reset=True)
