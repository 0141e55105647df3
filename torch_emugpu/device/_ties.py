"""Tied parameters stay tied when a module moves to emugpu, as on CUDA.

`Module._apply` keeps a parameter object (and so its ties) only where
PyTorch can shallow-copy the new tensor into the old one, which it never can
between CPU and an out-of-tree device: each module sharing the parameter
would get a copy of its own (GPT-2's `wte` and `lm_head`), doubling memory
and splitting gradients. The root call of `_apply` therefore converts each
tensor once and puts the converted object back into every slot that shared
the original.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

_original_apply = torch.nn.Module._apply
_state = threading.local()

Slot = tuple[torch.nn.Module, str, str]  # module, "_parameters" or "_buffers", name


def _shared_slots(root: torch.nn.Module) -> dict[int, list[Slot]]:
    slots: dict[int, list[Slot]] = {}
    for module in root.modules():
        for kind in ("_parameters", "_buffers"):
            for name, tensor in getattr(module, kind).items():
                if tensor is not None:
                    slots.setdefault(id(tensor), []).append((module, kind, name))
    return {key: group for key, group in slots.items() if len(group) > 1}


def _apply_keeping_ties(
    self: torch.nn.Module, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
) -> torch.nn.Module:
    if getattr(_state, "inside", False) or not recurse:
        return _original_apply(self, fn, recurse)
    shared = _shared_slots(self)
    if not shared:
        return _original_apply(self, fn, recurse)
    converted: dict[int, tuple[Any, Any]] = {}  # id -> (original, result): keeps ids unique

    def once(t: torch.Tensor) -> torch.Tensor:
        hit = converted.get(id(t))
        if hit is None:
            hit = converted[id(t)] = (t, fn(t))
        return hit[1]

    _state.inside = True
    try:
        result = _original_apply(self, once, recurse)
    finally:
        _state.inside = False
    for group in shared.values():
        first_module, first_kind, first_name = group[0]
        tied = getattr(first_module, first_kind)[first_name]
        for module, kind, name in group[1:]:
            getattr(module, kind)[name] = tied
    return result


def install() -> None:
    if torch.nn.Module._apply is not _apply_keeping_ties:
        torch.nn.Module._apply = _apply_keeping_ties  # type: ignore[method-assign]
