"""N identical GPU-bound jobs sharing one emulated GPU through emugpud: each
job's throughput against the same job alone, per policy, in one run. A job
is a training-like loop (20 fp32 4096^3 matmuls and a read-back per
iteration) on an emulated H100 under the virtual clock and the modelled host,
so the figures do not depend on this machine's load. The jobs start their
timed loops together; their median iteration time is compared with the job
alone under the same daemon. Target (fifo, fair): each job gets 1/N of the
job alone within 2%; time-slice also loses a context switch per slice.

    python benchmarks/daemon_sharing.py [--jobs 1 2 3] [--policies fifo fair time-slice] [--iterations N]
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

from tqdm import tqdm

from torch_emugpu.cli import daemon as daemon_cli

JOB = """
import json, sys, time, torch, torch_emugpu
iters = int(sys.argv[1])
x = torch.randn(4096, 4096, device="emugpu")
w = torch.randn(4096, 4096, device="emugpu")
for _ in range(2):
    (x @ w).sum().item()
print("ready", flush=True)
sys.stdin.readline()
times = []
for i in range(iters):
    t0 = time.perf_counter()
    for _ in range(20):
        y = x @ w
    y.sum().item()
    times.append(time.perf_counter() - t0)
print(json.dumps(times), flush=True)
"""


def run_jobs(address: str, n: int, iterations: int) -> list[float]:
    """Median iteration time (s) of each of n jobs started together."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    env.update(EMUGPU_DAEMON=address, EMUGPU_CLOCK="virtual", EMUGPU_HOST="modelled")
    jobs = []
    for _ in range(n):
        p = subprocess.Popen(
            [sys.executable, "-c", JOB, str(iterations)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        jobs.append(p)
    for p in jobs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    out = []
    for p in jobs:
        stdout, _ = p.communicate(timeout=600)
        out.append(statistics.median(json.loads(stdout.strip().splitlines()[-1])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, nargs="+", default=[2, 3], help="numbers of jobs sharing (default 2 3)")
    parser.add_argument("--policies", nargs="+", default=["fifo", "fair", "time-slice"], help="sharing policies")
    parser.add_argument("--iterations", type=int, default=40, help="iterations per job (default 40)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(policy, n) for policy in args.policies for n in args.jobs]
        for policy, n in tqdm(runs, desc="policies x jobs", unit="run"):
            address = f"unix:{Path(tmp) / (policy + '.sock')}"
            daemon = subprocess.Popen(daemon_cli.command("h100:1", address, policy), stdout=subprocess.PIPE, text=True)
            try:
                assert daemon.stdout is not None and "listening" in daemon.stdout.readline()
                alone = run_jobs(address, 1, 6)[0]
                shared = run_jobs(address, n, args.iterations)
                rows.append((policy, n, alone, shared))
            finally:
                daemon.terminate()
                daemon.wait(30)
    print(f"{'policy':11} {'jobs':>4}  {'alone ms':>9}  {'each ms (median)':>18}  {'throughput x N':>15}")
    for policy, n, alone, shared in rows:
        worst = max(abs(alone / s * n - 1) for s in shared)
        each = ", ".join(f"{s * 1e3:.2f}" for s in shared)
        share = statistics.mean(alone / s * n for s in shared)
        print(f"{policy:11} {n:>4}  {alone * 1e3:>9.2f}  {each:>18}  {share:>11.4f} (worst error {worst:.2%})")


if __name__ == "__main__":
    main()
