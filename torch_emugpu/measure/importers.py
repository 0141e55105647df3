"""Importers that turn other profile databases into torch-emugpu profiles."""

from __future__ import annotations

import csv
import datetime
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from torch_emugpu.measure.common import write_json_atomic

MiB = 1 << 20


def _read_table(path: Path) -> dict[int, list[float]]:
    """CSV with a header and a batch-size first column (GPEmu writes '1.0')."""
    rows: dict[int, list[float]] = {}
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file, expected a header and rows of batch_size,values")
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                rows[int(float(row[0]))] = [float(x) for x in row[1:]]
            except (ValueError, IndexError):
                raise ValueError(f"{path}:{line}: expected numbers, got {row}") from None
    return rows


def _nonnegative(value: float) -> float | None:
    return value if value >= 0 else None


def _parameter_count(model: str) -> int | None:
    """Parameters of the torchvision model of that name (built on the meta device), if torchvision has it."""
    try:
        import torch

        from torch_emugpu.measure.models import torchvision_model

        with torch.device("meta"):
            net = torchvision_model(model)
        return sum(p.numel() for p in net.parameters())
    except Exception:  # noqa: BLE001  (unknown or unbuildable: no fingerprint)
        return None


def _compute_root(src: Path) -> Path:
    for root in (src, src / "profiled_data"):
        if (root / "time" / "compute" / "forward").is_dir():
            return root
    raise ValueError(
        f"{src} is not in GPEmu's profiled_data layout: expected the directory "
        f"{src / 'time' / 'compute' / 'forward'} (holding <GPU>/<model>/time_by_batch_size.csv)"
    )


def import_gpemu(
    src: str | Path, out: str | Path, progress: bool = True, on_skip: Callable[[str], None] | None = None
) -> list[Path]:
    """Converts GPEmu's published `profiled_data/` layout into profile files,
    one per (GPU, model), under `out/<GPU>/<model>.json`. Returns their paths."""
    root = _compute_root(Path(src))
    out = Path(out)
    forward_root = root / "time" / "compute" / "forward"
    pairs = sorted((g.name, m.name) for g in forward_root.iterdir() if g.is_dir() for m in g.iterdir() if m.is_dir())
    if not pairs:
        raise ValueError(f"{forward_root} holds no <GPU>/<model> directories")
    written: list[Path] = []
    fingerprints: dict[str, int | None] = {}
    today = datetime.date.today().isoformat()
    for gpu, model in tqdm(pairs, desc="importing GPEmu profiles", unit="profile", disable=not progress):
        fwd_path = forward_root / gpu / model / "time_by_batch_size.csv"
        bwd_path = root / "time" / "compute" / "backward" / gpu / model / "time_by_batch_size.csv"
        if not fwd_path.is_file() or not bwd_path.is_file():
            if on_skip:
                on_skip(f"{gpu}/{model}: expected {fwd_path} and {bwd_path}")
            continue
        forward, backward = _read_table(fwd_path), _read_table(bwd_path)
        transfer_path = root / "time" / "transfer" / gpu / model / "data_transfer_time_by_batch_size.csv"
        transfer = _read_table(transfer_path) if transfer_path.is_file() else {}
        memory_path = root / "memory" / gpu / model / "memory.csv"
        memory = _read_table(memory_path) if memory_path.is_file() else {}
        batches = []
        for bs in sorted(set(forward) & set(backward)):
            if forward[bs][0] <= 0 or backward[bs][0] <= 0:
                continue
            entry: dict[str, float | int | None] = {
                "batch_size": bs,
                "forward_s": forward[bs][0],
                "backward_s": backward[bs][0],
                "transfer_pageable_s": transfer[bs][0] if bs in transfer else None,
                "transfer_pinned_s": None,
                # The published memory tables are linear fits that go negative
                # at some batch sizes; such values are dropped, not clamped.
                "peak_bytes": _nonnegative(memory[bs][0] * MiB) if bs in memory else None,
                "persistent_bytes": _nonnegative(memory[bs][1] * MiB) if len(memory.get(bs, [])) > 1 else None,
            }
            batches.append(entry)
        if not batches:
            if on_skip:
                on_skip(f"{gpu}/{model}: no batch size with both forward and backward times")
            continue
        if model not in fingerprints:
            fingerprints[model] = _parameter_count(model)
        doc = {
            "schema": "torch-emugpu profile v1",
            "gpu": gpu.replace("_", " "),
            "model": model,
            "fingerprint": {"parameters": fingerprints[model]} if fingerprints[model] else None,
            "input": {"shape": [3, 224, 224], "dtype": "float32"},
            "provenance": {
                "tool": "GPEmu profiler (imported by torch-emugpu import gpemu)",
                "torch": "unknown (not recorded by GPEmu)",
                "dtype": "float32",
                "amp": False,
                "optimizer": "SGD(momentum=0.9, weight_decay=1e-4)",
                "aggregation": "GPEmu: mean of a few batches with the slowest two dropped; memory in MiB as published",
                "date": today,
                "source": f"GPEmu profiled_data imported from {Path(src).resolve()}",
            },
            "batches": batches,
        }
        target = out / gpu / f"{model}.json"
        write_json_atomic(target, doc)
        written.append(target)
    return written
