"""DataParallel on emugpu: device-generic versions of the CUDA-only parts of
``torch.nn.parallel.comm`` (broadcast, broadcast_coalesced, scatter, gather).

They are built from emugpu copies, so every GPU-to-GPU transfer is charged
over NVLink or PCIe peer-to-peer (as the catalog says) and ordered between
the two devices' streams as PyTorch orders CUDA peer copies. Other devices
keep PyTorch's own functions; ``reduce_add(_coalesced)`` are generic already.

``data_parallel_span`` tells the region planner (timing/planner.py) which devices
an ``nn.DataParallel`` step runs on, so that a profile's N-GPU table times
the whole step.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._utils import (
    _flatten_dense_tensors,
    _get_device_index,
    _reorder_tensors_as,
    _take_tensors,
    _unflatten_dense_tensors,
)
from torch.nn.parallel import comm

from torch_emugpu.device import device_module

_DeviceLike = int | str | torch.device
_original: dict[str, Callable[..., Any]] = {}


def _on_emugpu(*tensors: torch.Tensor) -> bool:
    return any(t.device.type == "emugpu" for t in tensors)


def _emu(index: int) -> torch.device:
    return torch.device("emugpu", index)


def _indices(devices: Sequence[_DeviceLike]) -> list[int]:
    return [_get_device_index(d) for d in devices]


def broadcast(
    tensor: torch.Tensor, devices: Sequence[_DeviceLike] | None = None, *, out: Sequence[torch.Tensor] | None = None
) -> tuple[torch.Tensor, ...]:
    if not _on_emugpu(tensor, *(out or ())):
        return _original["broadcast"](tensor, devices, out=out)
    if (devices is None) == (out is None):
        raise RuntimeError(
            f"broadcast: expected exactly one of 'devices' and 'out', got devices={devices} "
            f"and out={'None' if out is None else f'{len(out)} tensors'}"
        )
    if out is not None:
        for o in out:
            o.copy_(tensor)
        return tuple(out)
    assert devices is not None  # exactly one of the two, checked above
    # As on CUDA, the tensor itself stands for its own device.
    return tuple(tensor if tensor.device == _emu(d) else tensor.to(_emu(d)) for d in _indices(devices))


def broadcast_coalesced(
    tensors: Sequence[torch.Tensor], devices: Sequence[_DeviceLike], buffer_size: int = 10485760
) -> list[list[torch.Tensor]]:
    if not _on_emugpu(*tensors):
        return _original["broadcast_coalesced"](tensors, devices, buffer_size)
    indices = _indices(devices)
    source = tensors[0].device if tensors else _emu(indices[0])
    outputs: list[list[torch.Tensor]] = [[] for _ in indices]
    # Small tensors travel in flat buffers of up to buffer_size bytes: one
    # copy per buffer, as CUDA's broadcast_coalesced does.
    for chunk in _take_tensors(list(tensors), buffer_size):
        flat = _flatten_dense_tensors(chunk)
        for out, d in zip(outputs, indices, strict=True):
            if _emu(d) == source:
                out.extend(chunk)
            else:
                out.extend(t.data for t in _unflatten_dense_tensors(flat.to(_emu(d)), chunk))
    # _take_tensors groups by type; give each device the callers' order back.
    return [list(_reorder_tensors_as(out, list(tensors))) for out in outputs]


def scatter(
    tensor: torch.Tensor,
    devices: Sequence[_DeviceLike] | None = None,
    chunk_sizes: Sequence[int] | None = None,
    dim: int = 0,
    streams: Sequence[torch.Stream | None] | None = None,
    *,
    out: Sequence[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    emugpu_target = out is not None and _on_emugpu(*out)
    if devices is not None:
        emugpu_target = torch.accelerator.current_accelerator().type == "emugpu"  # type: ignore[union-attr]
    if not (_on_emugpu(tensor) or emugpu_target):
        return _original["scatter"](tensor, devices, chunk_sizes, dim, streams, out=out)
    if out is not None:
        if devices is not None or chunk_sizes is not None:
            raise RuntimeError(
                "scatter: 'devices' and 'chunk_sizes' must be None when 'out' is given, got "
                f"devices={devices}, chunk_sizes={chunk_sizes}"
            )
        sizes = [o.size(dim) for o in out]
        for o, part in zip(out, tensor.split(sizes, dim), strict=True):
            o.copy_(part)
        return tuple(out)
    if devices is None:
        raise RuntimeError("scatter: expected 'devices' or 'out', got neither")
    indices = _indices(devices)
    if chunk_sizes is None:
        # As CUDA's: Tensor.chunk, so a small batch fills only the first
        # devices (5 over 4: 2+2+1), and DataParallel replicates to as many.
        parts = tensor.chunk(len(indices), dim)
    else:
        if len(chunk_sizes) != len(indices):
            raise ValueError(
                f"scatter: expected one chunk size per device ({len(indices)}), got "
                f"{len(chunk_sizes)}: {list(chunk_sizes)}"
            )
        if sum(chunk_sizes) != tensor.size(dim):
            raise ValueError(
                f"scatter: chunk sizes {list(chunk_sizes)} add up to {sum(chunk_sizes)}, expected "
                f"the size of dimension {dim}: {tensor.size(dim)}"
            )
        parts = tensor.split(list(chunk_sizes), dim)
    results = []
    for i, (part, d) in enumerate(zip(parts, indices[: len(parts)], strict=True)):
        stream = streams[i] if streams is not None else None
        on_stream = device_module.stream(stream) if stream is not None else contextlib.nullcontext()
        with torch.accelerator.device_index(d), on_stream:
            results.append(part.contiguous().to(_emu(d), non_blocking=True))
    return tuple(results)


def gather(
    tensors: Sequence[torch.Tensor],
    dim: int = 0,
    destination: _DeviceLike | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    if not _on_emugpu(*tensors, *((out,) if out is not None else ())):
        return _original["gather"](tensors, dim, destination, out=out)
    if out is not None and destination is not None:
        raise RuntimeError(f"gather: 'destination' must be None when 'out' is given, got {destination}")
    if out is None:
        if (
            destination == -1
            or destination == "cpu"
            or (isinstance(destination, torch.device) and destination.type == "cpu")
        ):
            where = torch.device("cpu")
        else:
            where = _emu(_get_device_index(destination, optional=True))
        shape = list(tensors[0].shape)
        shape[dim] = sum(t.size(dim) for t in tensors)
        out = torch.empty(shape, dtype=tensors[0].dtype, device=where)
    # Each input is copied straight into its slice of the output.
    for part, t in zip(out.split([t.size(dim) for t in tensors], dim), tensors, strict=True):
        part.copy_(t, non_blocking=True)
    return out


@dataclass(frozen=True)
class Span:
    """The devices one ``nn.DataParallel`` step runs on."""

    gpu_count: int  # devices with a replica
    primary: int  # device_ids[0]: holds the module; gradients are reduced and the optimizer steps there
    others: tuple[int, ...]  # the other replicas' devices, and the output device if it is none of them


def batch_dim(module: torch.nn.Module) -> int:
    """The dimension nn.DataParallel scatters its inputs along (0 for other modules)."""
    return module.dim if isinstance(module, torch.nn.DataParallel) else 0


def data_parallel_span(module: torch.nn.Module, batch: int) -> Span | None:
    """For an ``nn.DataParallel`` over emugpu devices that scatters `batch`
    over two or more of them, the devices its step runs on; else None."""
    if not isinstance(module, torch.nn.DataParallel) or module.src_device_obj.type != "emugpu":
        return None
    ids = list(module.device_ids)
    # scatter splits with Tensor.chunk: ceil(batch / N) per chunk, so a small
    # batch may fill fewer devices than device_ids names (5 over 4: 2+2+1).
    per_chunk = math.ceil(batch / len(ids)) if ids else 0
    used = ids[: math.ceil(batch / per_chunk)] if per_chunk else []
    if len(used) < 2:
        return None
    output = module.output_device
    return Span(len(used), used[0], tuple(used[1:]) + (() if output in used or output < 0 else (output,)))


def install() -> None:
    """Routes torch.nn.parallel.comm's CUDA-only functions through these for emugpu tensors."""
    if _original:
        return
    for name, fn in (
        ("broadcast", broadcast),
        ("broadcast_coalesced", broadcast_coalesced),
        ("scatter", scatter),
        ("gather", gather),
    ):
        _original[name] = getattr(comm, name)
        setattr(comm, name, fn)
