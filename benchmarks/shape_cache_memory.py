"""Host memory per shape-cache entry, and the cache's bound per process.

A sweep over ever-new shapes (variable-length batches, a shape search) makes
one shape-cache entry per (op, argument metadata). The same loop runs twice
in one process: first over new shapes (entries are made), then over the same
shapes again (every op hits; nothing is cached anew): the second pass is the
baseline for whatever else the loop costs. Bytes per entry = (RSS growth of
the first pass - RSS growth of the second) / entries made. Target: at most
480 bytes per entry (what an entry took before the cost model's OpCost was
cached with it), and a bounded total per process however many threads run
ops.

    python benchmarks/shape_cache_memory.py [--shapes N]
"""

from __future__ import annotations

import argparse
import gc

import torch

import torch_emugpu
from torch_emugpu import _C

TARGET_BYTES = 480


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def sweep(shapes: int) -> None:
    # Three ops per shape (a matmul, an add, a reduction) on two tensors: what a layer's forward does.
    for n in range(1, shapes + 1):
        a = torch.empty(n, 64, device="emugpu")
        b = torch.empty(64, 32, device="emugpu")
        (a @ b + 1).sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=int, default=20000, help="distinct shapes to sweep (default 20000)")
    args = parser.parse_args()
    torch_emugpu.configure(gpu="h100", mode="timing")
    sweep(200)  # warm-up: the ops' first calls, the allocator's first blocks
    torch.emugpu.empty_cache()
    gc.collect()
    before = rss_bytes()
    misses_before = _C._shape_cache_stats()[1]  # each miss makes an entry (older builds have no entry count)
    sweep(args.shapes)
    torch.emugpu.synchronize()
    gc.collect()
    first = rss_bytes() - before
    made = _C._shape_cache_stats()[1] - misses_before
    mid = rss_bytes()
    sweep(args.shapes)  # the same shapes: every op hits
    torch.emugpu.synchronize()
    gc.collect()
    second = rss_bytes() - mid
    per_entry = (first - second) / max(made, 1)
    print(f"entries made: {made} ({args.shapes} shapes)")
    print(f"RSS growth, new shapes: {first / 1e6:.2f} MB; same shapes again (baseline): {second / 1e6:.2f} MB")
    print(f"bytes per entry: {per_entry:.0f} ({per_entry / TARGET_BYTES:.2f}x the {TARGET_BYTES}-byte target)")
    bound = 100_000 * per_entry
    print(f"per-process bound: 100,000 entries, about {bound / 1e6:.0f} MB, shared by every thread")
    if hasattr(_C, "_shape_cache_entries"):
        held = _C._shape_cache_entries()
        torch.emugpu.empty_cache()
        print(f"entries held: {held}; after empty_cache(): {_C._shape_cache_entries()}")


if __name__ == "__main__":
    main()
