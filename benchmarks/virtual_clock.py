"""The virtual clock against the real one: the same training job (the train
command's loop: forward, loss, backward, optimizer step, synchronize) under
EMUGPU_CLOCK=real and under EMUGPU_CLOCK=virtual with the measured and the
modelled host, each in a fresh process.

Prints per case and clock the emulated iteration time the job reports, its
ratio to the real clock's (equivalence: within 1% where the real clock is not
host-bound), the emulated GPU's busy time per iteration (an iteration longer
than it was host-bound), and the speed-up (emulated seconds per wall second;
the real clock's is 1 by construction).

The `decoder` case is a 6.7B-parameter decoder (GPT-3 6.7B's layout: 32
layers of width 4096, 2,048 tokens) at batch 1 with bf16 autocast and AdamW
on an emulated H200, built on the device (it would not fit this machine's
memory on the CPU). It runs under the virtual clock only; its speed-up is
the point (target 10x).

`--busy N` runs every case again with N busy processes beside it (one
spinning Python loop each) and prints each clock's figure loaded against
quiet: the modelled host must report the same time, the measured one within
2%, the real clock shows the host's load.

    python benchmarks/virtual_clock.py [--cases resnet50,gpt2,decoder] [--iterations 10] [--busy 2]
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
    "decoder": ("gpt-6.7b", 1, "bf16", "adamw"),
}
# The 6.7B decoder's AdamW state needs more than an H100's 80 GB.
GPUS = {"decoder": ("h200", 2048)}
CLOCKS = [("real", "measured"), ("virtual", "measured"), ("virtual", "modelled")]

CHILD = """
import json, sys, time
import torch_emugpu
from torch_emugpu.cli import train
model, batch, amp, optimizer, iterations = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
gpu, seq_len = sys.argv[6], int(sys.argv[7])
r = train.run(model=model, gpu=gpu, batch_size=batch, iterations=iterations, warmup=2, optimizer=optimizer,
              amp=amp, seq_len=seq_len, progress=False)
print(json.dumps({"iteration_s": r.iteration_s, "gpu_busy_s": r.gpu_busy_s, "clock": r.clock,
                  "emulated_per_wall": r.emulated_per_wall}))
"""

BUSY = "while True: pass"
# The decoder runs under the virtual clock only: under the real one an iteration takes as long as on the GPU.
VIRTUAL_ONLY = {"decoder"}


def run_case(case: str, clock: str, host: str, iterations: int) -> dict[str, float | str]:
    model, batch, amp, optimizer = CASES[case]
    gpu, seq_len = GPUS.get(case, ("h100", 1024))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    env.update({"EMUGPU_CLOCK": clock, "EMUGPU_HOST": host, "EMUGPU_GPU": gpu})
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(batch), amp, optimizer, str(iterations), gpu, str(seq_len)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_s"] = time.monotonic() - t0
    return result


def run_all(cases: list[str], iterations: int, desc: str) -> dict[tuple[str, str, str], dict[str, float | str]]:
    runs = [(c, clock, host) for c in cases for clock, host in CLOCKS if clock == "virtual" or c not in VIRTUAL_ONLY]
    return {
        (c, clock, host): run_case(c, clock, host, iterations) for c, clock, host in tqdm(runs, desc=desc, unit="run")
    }


def label(clock: str, host: str) -> str:
    return "real" if clock == "real" else f"virtual ({host} host)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    p.add_argument("--iterations", type=int, default=10, help="measured iterations per run (default 10)")
    p.add_argument("--busy", type=int, default=0, help="run again beside N busy processes (default 0: quiet only)")
    args = p.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            p.error(f"unknown case {c!r}; known: {', '.join(CASES)}")
    results = run_all(cases, args.iterations, "quiet runs")
    print(
        f"{'case':10} {'clock':24} {'emulated ms/it':>14} {'vs real':>8} {'GPU busy ms/it':>14} "
        f"{'emulated s per wall s':>22}"
    )
    for key, r in results.items():
        c, clock, host = key
        real = results.get((c, "real", "measured"))
        emulated, speed = float(r["iteration_s"]), float(r["emulated_per_wall"])
        versus = f"{emulated / float(real['iteration_s']):8.4f}" if real else f"{'-':>8}"
        busy = float(r["gpu_busy_s"])
        print(f"{c:10} {label(clock, host):24} {emulated * 1e3:14.2f} {versus} {busy * 1e3:14.2f} {speed:22.2f}")
    if args.busy > 0:
        spinners = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
        try:
            loaded = run_all(cases, args.iterations, f"runs beside {args.busy} busy processes")
        finally:
            for s in spinners:
                s.kill()
                s.wait()
        print(f"\nbeside {args.busy} busy processes, against the quiet runs above")
        header = f"{'quiet ms/it':>14} {'loaded ms/it':>14} {'loaded / quiet':>16} {'identical':>10}"
        print(f"{'case':10} {'clock':24} {header}")
        for key, r in loaded.items():
            c, clock, host = key
            quiet, now = float(results[key]["iteration_s"]), float(r["iteration_s"])
            same = "yes" if quiet == now else "no"
            print(
                f"{c:10} {label(clock, host):24} {quiet * 1e3:14.4f} {now * 1e3:14.4f} {now / quiet:16.5f} {same:>10}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
