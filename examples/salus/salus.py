#!/usr/bin/env python3
"""Salus / GPEmu: three ResNet-50 training jobs started 30 s apart on one GPU.

Salus (MLSys'20) and GPEmu (VLDB'25) share a GPU between training jobs at
iteration granularity, first come first served: GPEmu reports one job alone
at 217.8 images/s on a P100, two at 110.8 each and three at 73.9 each, the
survivors speeding up again as jobs finish. This script runs the scenario on
an emulated GPU owned by emugpud: job k starts when the running jobs' clocks
pass k x 30 s (of emulated time), each trains a fixed number of iterations,
all under the virtual clock with the modelled host, so the figures do not
depend on this machine. It prints each phase's per-job throughput beside the
published figures and writes the timeline (JSON and a PNG).

    python examples/salus/salus.py [--sharing fifo] [--gpu p100] [--batch 32] [--iterations 500]

--sharing time-slice shows the driver's default instead (each slice loses a
context switch); fair and priority work too.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tqdm import tqdm

from torch_emugpu.cli import daemon as daemon_cli

HERE = Path(__file__).resolve().parent
PUBLISHED = {1: 217.8, 2: 110.8, 3: 73.9}  # GPEmu's Salus reproduction: images/s per job on a P100

# One job: ResNet-50 with SGD on a fixed synthetic batch. It builds everything on the CPU and
# says "ready"; on a line from stdin (its start time) it moves to the emulated GPU, sleeps (in
# virtual time) until that time and prints one line per iteration: [index, virtual time].
JOB = """
import json, sys, time, torch, torchvision
batch, iters = int(sys.argv[1]), int(sys.argv[2])
model = torchvision.models.resnet50()
x, y = torch.randn(batch, 3, 224, 224), torch.randint(0, 1000, (batch,))
print("ready", flush=True)
due = float(sys.stdin.readline())
import torch_emugpu
model, x, y = model.to("emugpu"), x.to("emugpu"), y.to("emugpu")
time.sleep(max(0.0, due - time.time()))  # virtual: joins the running jobs at its start time
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
torch.emugpu.synchronize()
print(json.dumps([-1, time.time()]), flush=True)
for i in range(iters):
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    torch.emugpu.synchronize()
    print(json.dumps([i, time.time()]), flush=True)
"""


def _reader(k: int, proc: subprocess.Popen, out: queue.Queue) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("["):
            out.put((k, json.loads(line)))
    out.put((k, None))


def run(args: argparse.Namespace) -> list[list[float]]:
    """Per job: its start time and the virtual time each iteration ended."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    env.update(EMUGPU_CLOCK="virtual", EMUGPU_HOST="modelled")
    with tempfile.TemporaryDirectory() as tmp:
        address = f"unix:{Path(tmp) / 'emugpud.sock'}"
        cmd = daemon_cli.command(f"{args.gpu}:1", address, args.sharing)
        daemon = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert daemon.stdout is not None and "listening" in daemon.stdout.readline()
        env["EMUGPU_DAEMON"] = address
        procs: list[subprocess.Popen] = []
        try:
            for _ in range(args.jobs):  # built (on the CPU) before the first one starts
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", JOB, str(args.batch), str(args.iterations)],
                        env=env,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
            for p in procs:
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            lines: queue.Queue = queue.Queue()
            stamps: list[list[float]] = [[] for _ in procs]
            done: set[int] = set()
            started = 0
            bar = tqdm(total=args.jobs * args.iterations, desc=f"{args.jobs} jobs, {args.sharing}", unit="it")

            def start(k: int, due: float) -> None:
                assert procs[k].stdin is not None
                procs[k].stdin.write(f"{due}\n")
                procs[k].stdin.flush()
                threading.Thread(target=_reader, args=(k, procs[k], lines), daemon=True).start()

            start(0, 0.0)
            started = 1
            while len(done) < len(procs):
                k, item = lines.get(timeout=600)
                if item is None:
                    done.add(k)
                    continue
                stamps[k].append(item[1])
                bar.update(item[0] >= 0)
                # The next job is started a little before the running jobs' clocks reach its start
                # time: it waits there (emugpud keeps clocks together) until they arrive, so that it
                # never starts behind them.
                if started < len(procs):
                    due = stamps[0][0] + started * args.offset
                    running = [s[-1] for j, s in enumerate(stamps[:started]) if j not in done and s]
                    if running and min(running) >= due - args.offset / 2:
                        start(started, due)
                        started += 1
            bar.close()
            for p in procs:
                p.wait(60)
                if p.returncode != 0:
                    raise RuntimeError(f"a job failed with exit status {p.returncode}")
            return stamps
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            daemon.terminate()
            daemon.wait(30)


def phases(stamps: list[list[float]], batch: int) -> list[dict[str, Any]]:
    """Between consecutive starts and ends: the jobs running and each one's images/s (the median of
    its iterations that lie wholly inside the phase)."""
    t0 = stamps[0][0]
    events = sorted({s[0] for s in stamps} | {s[-1] for s in stamps})
    out = []
    for a, b in zip(events, events[1:], strict=False):
        row: dict[str, Any] = {"from_s": a - t0, "to_s": b - t0, "jobs": {}}
        for k, s in enumerate(stamps):
            if s[0] <= a and s[-1] >= b:
                inside = [e - d for d, e in zip(s, s[1:], strict=False) if d >= a and e <= b]
                if inside:
                    row["jobs"][k] = batch / statistics.median(inside)
        if row["jobs"]:
            out.append(row)
    return out


def plot(stamps: list[list[float]], batch: int, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = stamps[0][0]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for k, s in enumerate(stamps):
        ax.plot(
            [e - t0 for e in s[1:]], [batch / (e - d) for d, e in zip(s, s[1:], strict=False)], label=f"job {k + 1}"
        )
    for n, v in PUBLISHED.items():
        ax.axhline(v, color="grey", linestyle=":", linewidth=0.8)
        ax.text(0, v, f" GPEmu, {n} job{'s' if n > 1 else ''}", va="bottom", fontsize=7, color="grey")
    ax.set_xlabel("emulated time (s)")
    ax.set_ylabel("images/s per job")
    ax.set_title(title)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sharing", default="fifo", help="emugpud's policy (default fifo, as Salus and GPEmu)")
    p.add_argument("--gpu", default="p100", help="the emulated GPU (default p100, as GPEmu's experiment)")
    p.add_argument("--jobs", type=int, default=3, help="jobs (default 3)")
    p.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    p.add_argument("--iterations", type=int, default=500, help="iterations each job trains (default 500)")
    p.add_argument("--offset", type=float, default=30.0, help="emulated seconds between starts (default 30)")
    p.add_argument("--out", type=Path, default=HERE, help="where the JSON and the PNG go (default: this folder)")
    args = p.parse_args()
    stamps = run(args)
    rows = phases(stamps, args.batch)
    print(f"{'phase (s)':>14}  {'jobs':>4}  {'images/s per job (emulated)':40}  GPEmu (published)")
    for r in rows:
        n = len(r["jobs"])
        rates = ", ".join(f"job {k + 1}: {v:.1f}" for k, v in r["jobs"].items())
        published = f"{PUBLISHED[n]:.1f}" if n in PUBLISHED else "-"
        print(f"{r['from_s']:6.1f}-{r['to_s']:6.1f}  {n:>4}  {rates:40}  {published}")
    name = f"salus_{args.sharing}_{args.gpu}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(
        json.dumps({"args": vars(args) | {"out": str(args.out)}, "phases": rows, "stamps": stamps}, indent=1)
    )
    plot(
        stamps,
        args.batch,
        f"{args.jobs} x ResNet-50 (batch {args.batch}) on an emulated {args.gpu}, {args.sharing}",
        args.out / f"{name}.png",
    )
    print(f"wrote {args.out / (name + '.json')} and {args.out / (name + '.png')}")


if __name__ == "__main__":
    main()
