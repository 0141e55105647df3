"""Clock accuracy: wall time of a training-like loop against its emulated time.

Each iteration launches a chain of matmuls on emugpu and ends with
torch.emugpu.synchronize() (a host blocking point), for emulated iteration
times of about 2 ms, 20 ms and 200 ms. The ratio measured wall time per
iteration / emulated time per iteration should be within 1% of 1.0.

    python benchmarks/clock_accuracy.py
"""

from __future__ import annotations

import argparse
import time

import torch

import torch_emugpu
from torch_emugpu import _C


def run(target_s: float, iterations: int) -> tuple[float, float]:
    a = torch.empty(2048, 2048, device="emugpu")
    a @ a  # shape rule computed once, outside the measurement
    torch.emugpu.synchronize()
    _C._reset_engine_stats(0)
    a @ a
    per_mm = _C._engine_stats(0)["compute"][1] / 1e9
    chain = max(1, round(target_s / per_mm))
    torch.emugpu.synchronize()
    _C._reset_engine_stats(0)
    t0 = time.perf_counter()
    for _ in range(iterations):
        for _ in range(chain):
            a @ a
        torch.emugpu.synchronize()
    wall = (time.perf_counter() - t0) / iterations
    emulated = _C._engine_stats(0)["compute"][1] / 1e9 / iterations
    return wall, emulated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    torch_emugpu.configure(gpu="v100")
    print(f"emulated {torch.emugpu.get_device_name()}")
    for target, iterations in ((0.002, 500), (0.020, 100), (0.200, 15)):
        wall, emulated = run(target, iterations)
        print(
            f"target {target * 1e3:6.1f} ms: ratio wall/emulated = {wall / emulated:.4f}   "
            f"(wall {wall * 1e3:8.3f} ms, emulated {emulated * 1e3:8.3f} ms per iteration, {iterations} iterations)"
        )


if __name__ == "__main__":
    main()
