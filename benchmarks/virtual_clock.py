"""The virtual clock against the real one: the same training job (the train
command's loop: forward, loss, backward, optimizer step, synchronize) under
EMUGPU_CLOCK=real and under EMUGPU_CLOCK=virtual with the measured and the
modelled host, each in a fresh process.

Prints per case and clock the emulated iteration time the job reports, its
ratio to the real clock's (equivalence: within 1% where the real clock is not
host-bound), the emulated GPU's busy time per iteration (an iteration longer
than it was host-bound), and the speed-up (emulated seconds per wall second;
the real clock's is 1 by construction).

    python benchmarks/virtual_clock.py [--cases resnet50,gpt2] [--iterations 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from tqdm import tqdm

# (name, model, batch, amp, optimizer): the targets are resnet50 at 256 and GPT-2 124M bf16 at 16
CASES = {
    "resnet50": ("resnet50", 256, "none", "sgd"),
    "gpt2": ("gpt2", 16, "bf16", "adamw"),
}
CLOCKS = [("real", "measured"), ("virtual", "measured"), ("virtual", "modelled")]

CHILD = """
import json, sys, time
import torch_emugpu
from torch_emugpu.cli import train
model, batch, amp, optimizer, iterations = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
r = train.run(model=model, gpu="h100", batch_size=batch, iterations=iterations, warmup=2, optimizer=optimizer,
              amp=amp, progress=False)
print(json.dumps({"iteration_s": r.iteration_s, "gpu_busy_s": r.gpu_busy_s, "clock": r.clock,
                  "emulated_per_wall": r.emulated_per_wall}))
"""


def run_case(case: str, clock: str, host: str, iterations: int) -> dict[str, float | str]:
    model, batch, amp, optimizer = CASES[case]
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    env.update({"EMUGPU_CLOCK": clock, "EMUGPU_HOST": host, "EMUGPU_GPU": "h100"})
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(batch), amp, optimizer, str(iterations)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_s"] = time.monotonic() - t0
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    p.add_argument("--iterations", type=int, default=10, help="measured iterations per run (default 10)")
    args = p.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            p.error(f"unknown case {c!r}; known: {', '.join(CASES)}")
    results: dict[tuple[str, str, str], dict[str, float | str]] = {}
    runs = [(c, clock, host) for c in cases for clock, host in CLOCKS]
    for c, clock, host in tqdm(runs, desc="runs", unit="run"):
        results[(c, clock, host)] = run_case(c, clock, host, args.iterations)
    print(
        f"{'case':10} {'clock':24} {'emulated ms/it':>14} {'vs real':>8} {'GPU busy ms/it':>14} "
        f"{'emulated s per wall s':>22}"
    )
    for c in cases:
        real = float(results[(c, "real", "measured")]["iteration_s"])
        for clock, host in CLOCKS:
            r = results[(c, clock, host)]
            label = "real" if clock == "real" else f"virtual ({host} host)"
            emulated, speed = float(r["iteration_s"]), float(r["emulated_per_wall"])
            busy = float(r["gpu_busy_s"])
            print(f"{c:10} {label:24} {emulated * 1e3:14.2f} {emulated / real:8.4f} {busy * 1e3:14.2f} {speed:22.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
