#!/usr/bin/env python3
"""What emugpud's MPS policy sees of a training job: its kernels by class.

Traces one training iteration (after two warm-up iterations) of each job
named as `collocation.py` names them (MODEL:BATCH:DTYPE) on an emulated GPU
(no profiles, so every kernel comes from the cost model) and prints, per
bin (the classes a process reports to the daemon under `--sharing mps`: by
SM demand, below a quarter of the SMs, a half, three quarters, more; `bw`
for the kernels that draw at least half of the peak memory bandwidth
alone), the bin's share of the job's kernel time, its kernels'
time-weighted mean demand, block hold time, duration and share of the
peak bandwidth, and two figures the policy does not use: the fraction of
the peak FLOP/s its kernels draw alone and the share of its time in
memory-bound kernels.

    python benchmarks/mps_classes.py mobilenet_v2:128:bf16 vgg11:64:fp32 [--gpu h100]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def classes(job: str) -> tuple[int, float, list[dict[str, float]]]:
    """(ops, kernel ms, per-bin rows) of one traced iteration of `job`."""
    import torch

    from torch_emugpu import _C

    sys.path.insert(0, str(HERE))
    from collocation import JobSpec, Trainer

    trainer = Trainer(JobSpec.parse(job), torch.device("emugpu"))
    for _ in range(2):
        trainer.step()
    torch.emugpu.synchronize()
    _C._cost_trace_start(0, 1 << 20)
    trainer.step()
    torch.emugpu.synchronize()
    ops = [o for o in _C._cost_trace(0) if o["charged_ns"] > 0]
    total = sum(o["charged_ns"] for o in ops)
    keys = ("time", "demand", "hold", "kernel", "bandwidth", "compute", "memory_bound", "kernels")
    bins = [dict.fromkeys(keys, 0.0) for _ in range(8)]
    for o in ops:
        d = float(o["charged_ns"])
        demand = min(max(o["demand"], 0.0), 1.0)
        bandwidth = min(o["peak_memory_ns"] / d, 1.0)
        # As the device bins them (csrc/core/time_share.h): SM quarter, then bandwidth-bound or not.
        b = bins[min(int(demand * 4), 3) + (4 if bandwidth >= 0.5 else 0)]
        b["time"] += d
        b["demand"] += demand * d
        b["hold"] += o["hold_ns"] * d
        b["kernel"] += d * d
        b["bandwidth"] += bandwidth * d
        b["compute"] += min(o["peak_compute_ns"] / d, 1.0) * d
        b["memory_bound"] += 0.0 if o["compute_bound"] else d
        b["kernels"] += 1
    rows = []
    for i, b in enumerate(bins):
        if b["time"] > 0:
            t = b["time"]
            rows.append(
                {
                    "bin": f"{i % 4}{' bw' if i >= 4 else ''}",
                    "fraction": t / total,
                    "kernels": b["kernels"],
                    **{k: b[k] / t for k in ("demand", "bandwidth", "compute", "memory_bound")},
                    "hold_us": b["hold"] / t / 1e3,
                    "kernel_us": b["kernel"] / t / 1e3,
                }
            )
    return len(ops), total / 1e6, rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("jobs", nargs="+", help="MODEL:BATCH:DTYPE, as benchmarks/collocation.py names jobs")
    parser.add_argument("--gpu", default="h100", help="the emulated GPU (default h100)")
    args = parser.parse_args()
    os.environ.update(EMUGPU_GPU=args.gpu, EMUGPU_PROFILES="off", EMUGPU_CLOCK="virtual", EMUGPU_HOST="modelled")
    import warnings

    warnings.filterwarnings("ignore", message="emugpu: no (measured )?profile")
    print(
        f"{'job':24} {'bin':>4} {'time':>5} {'kernels':>7} {'demand':>6} {'hold us':>8} {'kernel us':>9} "
        f"{'bw':>5} {'flops':>5} {'mem-bound':>9}"
    )
    for job in args.jobs:
        ops, ms, rows = classes(job)
        for r in rows:
            print(
                f"{job:24} {r['bin']:>4} {r['fraction']:5.2f} {int(r['kernels']):7d} {r['demand']:6.2f} "
                f"{r['hold_us']:8.1f} {r['kernel_us']:9.1f} {r['bandwidth']:5.2f} {r['compute']:5.2f} "
                f"{r['memory_bound']:9.2f}"
            )
        print(f"{job:24} {ops} ops, {ms:.2f} ms of kernels")


if __name__ == "__main__":
    main()
