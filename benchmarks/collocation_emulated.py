#!/usr/bin/env python3
"""The interference model against real collocated training jobs.

`benchmarks/collocation.py` measured pairs of training jobs sharing one real
H100 (benchmarks/data/h100/collocation.json: each job alone, then each pair
under the driver's time slicing and under MPS). This script runs the same
jobs (the same models, batches, precisions and optimizers, built by that
script's own Trainer) on an emulated H100 attached to emugpud, alone and in
the same pairs, under the virtual clock with the modelled host, and compares
each job's slowdown (its median iteration time in the pair over alone) with
the measured one. The error is emulated slowdown / measured slowdown - 1;
the table prints it per job and the mean |error| per mode (Parallax, the
best published predictor: 4.33% under time slicing, 6.12% under MPS).

    python benchmarks/collocation_emulated.py [--modes time-slice] [--iterations 16]
        [--data benchmarks/data/h100/collocation.json] [--context-switch-us US] [--mps-overlap F]
        [--pairs 0 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

from torch_emugpu.cli import daemon as daemon_cli

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "h100" / "collocation.json"
# The measured modes, by the names emugpud's --sharing gives them.
MODES = {"time-slice": "time_slicing", "mps": "mps"}

WORKER = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch, torch_emugpu
from collocation import JobSpec, Trainer
trainer = Trainer(JobSpec.parse(sys.argv[2]), torch.device("emugpu"))
for _ in range(3):
    trainer.step()
torch.emugpu.synchronize()
print("ready", flush=True)
sys.stdin.readline()
times = []
iterations, seconds = int(sys.argv[3]), float(sys.argv[4])
start = t0 = time.perf_counter()
while len(times) < iterations or t0 - start < seconds:
    trainer.step()
    torch.emugpu.synchronize()
    t1 = time.perf_counter()
    times.append((t1 - t0) * 1e3)
    t0 = t1
print(json.dumps(times), flush=True)
"""


def run_group(address: str, jobs: list[str], iterations: int, seconds: float = 0.0) -> list[float]:
    """Median iteration time (ms, virtual clock) of each job of a group started together.

    Each job runs at least `iterations` iterations and for at least `seconds`
    of its (virtual) time: a group's jobs run for the same time, as the
    measured ones did, so that a job slowed less than its partner does not
    finish early and leave the partner's later iterations alone. The last
    iteration, which may end after the partner stopped, is left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    env.update(EMUGPU_DAEMON=address, EMUGPU_CLOCK="virtual", EMUGPU_HOST="modelled")
    procs = []
    for job in jobs:
        p = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(HERE), job, str(iterations), str(seconds)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"{job} did not start: {p.stderr.read() if p.stderr else ''}")
        procs.append(p)
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(stderr)
        # The first iterations run before the daemon knows every job's busy fraction: skip a quarter.
        times = json.loads(stdout.strip().splitlines()[-1])
        kept = times[len(times) // 4 : -1] if len(jobs) > 1 else times[len(times) // 4 :]
        out.append(statistics.median(kept))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", default=["time-slice"], choices=list(MODES), help="sharing modes")
    parser.add_argument("--iterations", type=int, default=16, help="timed iterations per job (default 16)")
    parser.add_argument("--data", type=Path, default=DATA, help="the measured collocation file")
    parser.add_argument("--context-switch-us", type=float, help="time-slice: emugpud's context switch (its default)")
    parser.add_argument("--mps-overlap", type=float, help="mps: emugpud's overlap (its default)")
    parser.add_argument("--pairs", type=int, nargs="+", help="only these pairs (indices in the data file's order)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    measured = json.loads(args.data.read_text())

    def chosen(mode: str) -> list[dict[str, Any]]:
        pairs = measured["modes"][MODES[mode]]["pairs"]
        return [p for i, p in enumerate(pairs) if args.pairs is None or i in args.pairs]

    jobs = sorted({j for mode in args.modes for p in chosen(mode) for j in p["jobs"]})
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            address = f"unix:{Path(tmp) / (mode + '.sock')}"
            cmd = daemon_cli.command("h100:1", address, mode)
            if args.context_switch_us is not None:
                cmd += ["--context-switch-us", str(args.context_switch_us)]
            if args.mps_overlap is not None:
                cmd += ["--mps-overlap", str(args.mps_overlap)]
            daemon = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            try:
                assert daemon.stdout is not None and "listening" in daemon.stdout.readline()
                pairs = chosen(mode)
                bar = tqdm(total=len(jobs) + len(pairs), desc=mode, unit="run")
                alone = {}
                for job in jobs:
                    alone[job] = run_group(address, [job], args.iterations)[0]
                    bar.update()
                for pair in pairs:
                    # Long enough for the slowest job to run its iterations at 3x its time alone.
                    seconds = args.iterations * max(alone[j] for j in pair["jobs"]) * 3 / 1e3
                    together = run_group(address, pair["jobs"], args.iterations, seconds)
                    solo = measured["solo_mps" if mode == "mps" else "solo"]
                    for job, member, emu in zip(pair["jobs"], pair["members"], together, strict=True):
                        real = member["median_ms"] / solo[job]["median_ms"]
                        emulated = emu / alone[job]
                        rows.append(
                            {
                                "mode": mode,
                                "pair": "+".join(pair["jobs"]),
                                "job": job,
                                "alone_ms": alone[job],
                                "paired_ms": emu,
                                "emulated_slowdown": emulated,
                                "measured_slowdown": real,
                                "error": emulated / real - 1,
                            }
                        )
                    bar.update()
                bar.close()
            finally:
                daemon.terminate()
                daemon.wait(30)
    print(f"{'mode':10} {'pair':40} {'job':22} {'alone ms':>9} {'emulated':>9} {'measured':>9} {'error':>7}")
    for r in rows:
        print(
            f"{r['mode']:10} {r['pair']:40} {r['job']:22} {r['alone_ms']:9.2f} "
            f"{r['emulated_slowdown']:8.3f}x {r['measured_slowdown']:8.3f}x {100 * r['error']:+6.1f}%"
        )
    for mode in args.modes:
        errors = [abs(r["error"]) for r in rows if r["mode"] == mode]
        print(f"{mode}: mean |error| {100 * statistics.mean(errors):.1f}% over {len(errors)} jobs in pairs")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
