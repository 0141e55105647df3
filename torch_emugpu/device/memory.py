"""Memory statistics of the emulated CUDA caching allocator, shaped like torch.cuda's."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from torch_emugpu import _C
from torch_emugpu.device._devices import DeviceLike as _DeviceLike
from torch_emugpu.device._devices import index as _index


def memory_stats(device: _DeviceLike = None) -> dict[str, Any]:
    """Flat, sorted statistics with torch.cuda.memory_stats()' keys."""
    nested = _C._memory_stats(_index(device))
    flat: dict[str, Any] = {}
    for key, value in nested.items():
        if isinstance(value, dict):
            for pool, stats in value.items():
                for stat, number in stats.items():
                    flat[f"{key}.{pool}.{stat}"] = number
        else:
            flat[key] = value
    return OrderedDict(sorted(flat.items()))


def host_memory_stats() -> dict[str, Any]:
    """Pinned host memory (pin_memory, DataLoader pin_memory=True), flat and sorted as
    torch.cuda.host_memory_stats(): allocations/allocated_bytes (blocks owned, handed out or
    cached), active_requests/active_bytes (handed out), num_host_alloc/num_host_free; and
    requests, cache_hits, cached_bytes, locked_bytes (what mlock pinned) and locked (False once
    the system refused to lock pages: the memory is then ordinary)."""
    flat: dict[str, Any] = {}
    for key, value in _C._host_memory_stats().items():
        if isinstance(value, dict):
            flat.update({f"{key}.{stat}": number for stat, number in value.items()})
        else:
            flat[key] = value
    return OrderedDict(sorted(flat.items()))


def reset_peak_host_memory_stats() -> None:
    _C._host_reset_peak_stats()


def reset_accumulated_host_memory_stats() -> None:
    _C._host_reset_accumulated_stats()


def memory_allocated(device: _DeviceLike = None) -> int:
    return int(memory_stats(device)["allocated_bytes.all.current"])


def max_memory_allocated(device: _DeviceLike = None) -> int:
    return int(memory_stats(device)["allocated_bytes.all.peak"])


def memory_reserved(device: _DeviceLike = None) -> int:
    return int(memory_stats(device)["reserved_bytes.all.current"])


def max_memory_reserved(device: _DeviceLike = None) -> int:
    return int(memory_stats(device)["reserved_bytes.all.peak"])


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    _C._reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: _DeviceLike = None) -> None:
    _C._reset_accumulated_memory_stats(_index(device))


def empty_cache() -> None:
    """Releases every cached, unused segment (of every emulated device)."""
    _index(None)
    _C._empty_cache()


def mem_get_info(device: _DeviceLike = None) -> tuple[int, int]:
    """(free, total) bytes of the emulated GPU, as cudaMemGetInfo reports them."""
    free, total = _C._mem_get_info(_index(device))
    return int(free), int(total)


def _format_size(n: int) -> str:
    for unit in ("B ", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:6d} {unit}" if unit == "B " else f"{n:6.0f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


def _format_count(n: int) -> str:
    return f"{n:7d}   " if abs(n) < 10**6 else f"{n / 1000:6.0f}K  "


def memory_summary(device: _DeviceLike = None, abbreviated: bool = False) -> str:
    """A table of the allocator's statistics, laid out like torch.cuda.memory_summary()."""
    idx = _index(device)
    stats = memory_stats(idx)
    name = _C._device_properties(idx)["name"]
    rows = [
        ("allocated_bytes", "Allocated memory", _format_size),
        ("active_bytes", "Active memory", _format_size),
        ("requested_bytes", "Requested memory", _format_size),
        ("reserved_bytes", "GPU reserved memory", _format_size),
        ("inactive_split_bytes", "Non-releasable memory", _format_size),
        ("allocation", "Allocations", _format_count),
        ("active", "Active allocs", _format_count),
        ("segment", "GPU reserved segments", _format_count),
        ("inactive_split", "Non-releasable allocs", _format_count),
    ]
    pools = (
        [("all", "")]
        if abbreviated
        else [("all", ""), ("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
    )
    rule = "=" * 75
    thin = "-" * 75
    lines = [
        rule,
        f"|{f'emugpu memory summary, device ID {idx} ({name})':^73}|",
        thin,
        f"|{'  CUDA OOMs: ' + str(stats['num_ooms']):<36}|"
        f"{'  cudaMalloc retries: ' + str(stats['num_alloc_retries']):<36}|",
        rule,
        "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |",
    ]
    for key, title, fmt in rows:
        lines.append(thin)
        for pool, label in pools:
            prefix = f"{key}.{pool}."
            text = title if pool == "all" else label
            lines.append(
                f"|{text:<23}| {fmt(stats[prefix + 'current'])} | {fmt(stats[prefix + 'peak'])} | "
                f"{fmt(stats[prefix + 'allocated'])} | {fmt(stats[prefix + 'freed'])} |"
            )
    lines.append(rule)
    return "\n".join(lines) + "\n"
