"""Cached pinned allocate/free against plain host allocate/free of the same
size, in the same process: `torch.empty(n, pin_memory=True)` (emugpu's mlock
allocator, which keeps freed blocks for reuse as CUDA's host allocator does)
against `torch.empty(n)` (the CPU allocator: malloc/free), both freed at once.
Target: at most 2x.

    python benchmarks/pinned_alloc.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import torch_emugpu  # noqa: F401  (registers emugpu's pinned allocator)

SIZES = (4 << 10, 1 << 20, 16 << 20, 128 << 20)


def per_call(pin: bool, nbytes: int, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        del t
    return (time.perf_counter() - t0) / calls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=7, help="samples per size; the median is printed (default 7)")
    args = p.parse_args()
    torch.empty(1, pin_memory=True)  # the allocator and its first block
    print(f"{'size':>10} {'pinned us':>10} {'malloc us':>10} {'ratio':>7}")
    for nbytes in SIZES:
        calls = 2000 if nbytes <= 1 << 20 else 200
        per_call(True, nbytes, 10)  # the first block of this size class is mapped and locked once
        pinned = statistics.median(per_call(True, nbytes, calls) for _ in range(args.repeats))
        plain = statistics.median(per_call(False, nbytes, calls) for _ in range(args.repeats))
        print(f"{nbytes:>10} {pinned * 1e6:10.2f} {plain * 1e6:10.2f} {pinned / plain:6.2f}x")
    stats = torch.emugpu.host_memory_stats()
    print(
        f"pinned requests {stats['requests']}, cache hits {stats['cache_hits']}, "
        f"blocks mapped {stats['num_host_alloc']}, locked {stats['locked_bytes'] / 2**20:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
