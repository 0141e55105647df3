"""Host time per op of a process attached to emugpud against the same process
on its own GPUs, in one run: a resnet50 training step (timing mode, emulated
H100) measured unattached and attached, alternately, in one process (each
attachment a fresh configuration). An attached process takes its allocator's
segments from the daemon and nothing per op, so the ratio should be near 1.
Target: at most 1.1x.

    python benchmarks/daemon_overhead.py [--steps N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch
from overhead import make_step, measure, resnet50  # benchmarks/ is the script's directory

import torch_emugpu
from torch_emugpu.cli import daemon as daemon_cli


def per_op_us(steps: int) -> float:
    model, x, y = resnet50("emugpu")
    host_s, ops = measure(make_step(model, x, y, "sgd"), steps, True)
    del model, x, y
    torch.emugpu.synchronize()
    return host_s / ops * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="measured steps per round and setting (default 20)")
    parser.add_argument("--rounds", type=int, default=9, help="alternations of the two settings (default 9)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        address = f"unix:{Path(tmp) / 'emugpud.sock'}"
        daemon = subprocess.Popen(daemon_cli.command("h100:1", address), stdout=subprocess.PIPE, text=True)
        assert daemon.stdout is not None
        print(daemon.stdout.readline().strip())
        try:
            alone, attached = [], []
            for r in range(args.rounds):
                os.environ.pop("EMUGPU_DAEMON", None)
                torch_emugpu.configure(gpu="h100")
                alone.append(per_op_us(args.steps))
                os.environ["EMUGPU_DAEMON"] = address
                torch_emugpu.configure()
                attached.append(per_op_us(args.steps))
                print(f"round {r + 1}: alone {alone[-1]:.2f} us/op, attached {attached[-1]:.2f} us/op")
        finally:
            daemon.terminate()
            daemon.wait(30)
    a, b = statistics.median(alone), statistics.median(attached)
    print(f"resnet50 attached/alone = {b / a:.3f}x (median host time per op: attached {b:.2f} us, alone {a:.2f} us)")


if __name__ == "__main__":
    main()
