#!/usr/bin/env python3
"""The collocation study: small training jobs sharing one GPU under time slicing, MPS and MIG.

Robroek, Yousefzadeh-Asl-Miandoab and Tozun ("An Analysis of Collocation on
GPUs for Deep Learning Training", EuroMLSys'24; on MIG alone, a 2022 preprint
by the same group: Kaas, Paleykov, Robroek and Tozun, "Deep Learning Training
on Multi-Instance GPUs") trained several models at once on one A100 and found
that collocating small jobs multiplies the GPU's training throughput (about
3x on MIG in the preprint, up to 4x in the paper) while each job's epoch gets
longer, that jobs that already fill the GPU gain little, that MIG partitions
do not interfere but are rigid, and that MPS is the best general choice.

This script runs the same kind of experiment on an emulated A100 or H100
owned by emugpud: N identical jobs (a torchvision model on a fixed synthetic
batch, SGD with momentum) start their timed loops together under

  time-slice   the CUDA driver's default between processes (--sharing time-slice)
  mps          kernels of several processes at once (--sharing mps)
  mps-capped   the same with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100/N per job
  mig          each job alone on its own MIG instance (N equal instances)

plus each job alone on the whole GPU and alone on one instance of each MIG
layout. All processes run the virtual clock with the modelled host, so the
figures are the same on any machine. It prints per-job throughput, the
aggregate throughput over one job alone, the epoch time of a dataset of
--dataset images and which jobs ran out of memory, and writes a JSON and a
PNG (collocation_<gpu>.json, collocation_<gpu>.png).

    python examples/collocation/collocation_study.py [--gpu a100] [--jobs resnet18:64:32 resnet50:128:224]
        [--modes time-slice mps mps-capped mig] [--counts 2 4] [--iterations 12]

A job is MODEL:BATCH:IMAGE (a torchvision classification model, its batch
size, its square input size; inputs of 64 pixels or less get 10 classes, as
CIFAR-10, larger ones 1000, as ImageNet).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from torch_emugpu.cli import daemon as daemon_cli

HERE = Path(__file__).resolve().parent
MODES = ("time-slice", "mps", "mps-capped", "mig")
# Per emulated GPU: the catalog name and, per number of jobs, the MIG profile that gives each job
# an instance of its own (N equal instances, the largest that N fit in).
GPUS: dict[str, dict[str, Any]] = {
    "a100": {"model": "a100", "mig": {1: "7g.40gb", 2: "3g.20gb", 3: "2g.10gb", 4: "1g.5gb"}},
    "h100": {"model": "h100", "mig": {1: "7g.80gb", 2: "3g.40gb", 3: "2g.20gb", 4: "1g.10gb"}},
}
# What the study published (see README.md for the sources); no per-configuration figures.
PUBLISHED = {
    "mig_small_aggregate": "about 3x (small ResNets on MIG, A100)",
    "best_aggregate": "up to 4x (collocated training, A100)",
}

# One job. On a first line from stdin it builds its model and batch on the emulated GPU and runs
# `warmup` iterations, then says "ready" (or, when the GPU's memory ran out, one JSON line
# {"oom": ...}, and exits); on a second line it times `iters` iterations (virtual clock) and prints
# {"times": [ms...], "peak": bytes, ...}.
WORKER = """
import json, sys, time
import torch, torchvision
import torch_emugpu
name, batch, size, iters, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
classes = 10 if size <= 64 else 1000
sys.stdin.readline()

def oom(e):
    print(json.dumps({"oom": str(e).splitlines()[0]}), flush=True)
    sys.exit(0)

try:
    with torch.device("emugpu"):
        model = torchvision.models.get_model(name, num_classes=classes)
        x, y = torch.randn(batch, 3, size, size), torch.randint(0, classes, (batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(warmup):
        step()
    torch.emugpu.synchronize()
except torch.OutOfMemoryError as e:
    oom(e)
print("ready", flush=True)
sys.stdin.readline()
times = []
try:
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
        torch.emugpu.synchronize()
        t1 = time.perf_counter()
        times.append((t1 - t0) * 1e3)
        t0 = t1
except torch.OutOfMemoryError as e:
    oom(e)
p = torch.emugpu.get_device_properties(0)
print(json.dumps({"times": times, "peak": torch.emugpu.max_memory_reserved(), "sms": p.multi_processor_count,
                  "capacity": torch.emugpu.mem_get_info(0)[1]}), flush=True)
"""


@dataclass(frozen=True)
class Job:
    model: str
    batch: int
    image: int

    @classmethod
    def parse(cls, text: str) -> Job:
        parts = text.split(":")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            raise argparse.ArgumentTypeError(f"job {text!r}: expected MODEL:BATCH:IMAGE, e.g. resnet18:64:32")
        return cls(parts[0], int(parts[1]), int(parts[2]))

    @property
    def name(self) -> str:
        return f"{self.model}:{self.batch}:{self.image}"


def run_group(address: str, job: Job, envs: list[dict[str, str]], iterations: int, warmup: int) -> list[dict[str, Any]]:
    """len(envs) copies of `job` (each with its extra environment) on the daemon at `address`: per job,
    {"status": "ok", "ms": median iteration, "peak_gib": ...} or {"status": "oom"}. The processes start
    (import) at once, build and warm up one after another (as jobs submitted in turn: each one's memory
    is held before the next asks, so which ones do not fit is decided by order, not by a race) and
    start their timed loops together."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("EMUGPU_", "CUDA_MPS_"))}
    base.update(EMUGPU_DAEMON=address, EMUGPU_CLOCK="virtual", EMUGPU_HOST="modelled")
    procs: list[subprocess.Popen] = []
    errs: list[IO[str]] = []
    out: list[dict[str, Any]] = []
    try:
        for extra in envs:
            err = tempfile.TemporaryFile("w+")
            args = [job.model, str(job.batch), str(job.image), str(iterations), str(warmup)]
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", WORKER, *args],
                    env=base | extra,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                )
            )
            errs.append(err)

        def failed(k: int) -> RuntimeError:
            errs[k].seek(0)
            return RuntimeError(f"{job.name} (job {k + 1}) failed:\n{errs[k].read()[-3000:]}")

        first = []
        for k, p in enumerate(procs):
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("build\n")
            p.stdin.flush()
            line = p.stdout.readline().strip()
            if line != "ready" and not line.startswith("{"):
                p.wait(60)
                raise failed(k)
            first.append(line)
        for p, line in zip(procs, first, strict=True):
            if line == "ready":
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
        for k, (p, line) in enumerate(zip(procs, first, strict=True)):
            stdout, _ = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise failed(k)
            doc = json.loads(line if line != "ready" else stdout.strip().splitlines()[-1])
            if "oom" in doc:
                out.append({"status": "oom", "error": doc["oom"]})
                continue
            # The first iterations run before the daemon knows every job's busy fraction: skip a quarter.
            ms = statistics.median(doc["times"][len(doc["times"]) // 4 :])
            out.append(
                {
                    "status": "ok",
                    "ms": ms,
                    "images_s": job.batch / ms * 1e3,
                    "peak_gib": doc["peak"] / 2**30,
                    "sms": doc["sms"],
                    "capacity_gib": doc["capacity"] / 2**30,
                }
            )
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        for err in errs:
            err.close()


class Daemon:
    """emugpud on a private socket, for one sharing policy or MIG layout."""

    def __init__(self, tmp: Path, gpu: str, sharing: str, mig: str | None = None) -> None:
        self.address = f"unix:{tmp / f'emugpud-{sharing}-{mig or 0}.sock'}"
        cmd = daemon_cli.command(f"{gpu}:1", self.address, sharing, mig)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening" not in line:
            self.proc.wait(30)
            raise RuntimeError(f"emugpud did not start: {line}{self.proc.stdout.read()}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The groups to run, in daemon order: each {"daemon": (sharing, mig), "job", "mode", "n", "envs"}."""
    mig = GPUS[args.gpu]["mig"]
    groups: list[dict[str, Any]] = []
    for job in args.jobs:

        def add(daemon: tuple[str, str | None], mode: str, envs: list[dict[str, str]], job: Job = job) -> None:
            groups.append({"daemon": daemon, "job": job, "mode": mode, "n": len(envs), "envs": envs})

        add(("time-slice", None), "alone", [{}])
        for n in args.counts:
            if "time-slice" in args.modes:
                add(("time-slice", None), "time-slice", [{}] * n)
            if "mps" in args.modes:
                add(("mps", None), "mps", [{}] * n)
            if "mps-capped" in args.modes:
                add(("mps", None), "mps-capped", [{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(100 // n)}] * n)
            if "mig" in args.modes:
                layout = ",".join([mig[n]] * n)
                add(("time-slice", layout), "mig-solo", [{"EMUGPU_VISIBLE_DEVICES": "0:0"}])
                add(("time-slice", layout), "mig", [{"EMUGPU_VISIBLE_DEVICES": f"0:{k}"} for k in range(n)])
    # One daemon at a time: group by daemon, keeping the order within each.
    order = list(dict.fromkeys(g["daemon"] for g in groups))
    return sorted(groups, key=lambda g: order.index(g["daemon"]))


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    groups = plan(args)
    rows: list[dict[str, Any]] = []
    gpu = GPUS[args.gpu]["model"]
    bar = tqdm(total=len(groups), desc=f"collocation on {args.gpu}", unit="group")
    with tempfile.TemporaryDirectory() as tmp:
        daemon: Daemon | None = None
        current = None
        try:
            for g in groups:
                if g["daemon"] != current:
                    if daemon is not None:
                        daemon.stop()
                    daemon = Daemon(Path(tmp), gpu, *g["daemon"])
                    current = g["daemon"]
                assert daemon is not None
                bar.set_postfix_str(f"{g['job'].name} {g['mode']} x{g['n']}")
                jobs = run_group(daemon.address, g["job"], g["envs"], args.iterations, args.warmup)
                rows.append(
                    {
                        "job": g["job"].name,
                        "mode": g["mode"],
                        "n": g["n"],
                        "mig": g["daemon"][1],
                        "mps_percentage": g["envs"][0].get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
                        "jobs": jobs,
                    }
                )
                bar.update()
        finally:
            bar.close()
            if daemon is not None:
                daemon.stop()
    return summarise(rows, args.dataset)


def summarise(rows: list[dict[str, Any]], dataset: int) -> list[dict[str, Any]]:
    """Adds, per row, the aggregate throughput over the job alone on the whole GPU (out-of-memory jobs
    count 0), the epoch time of `dataset` images per job, and how many jobs ran out of memory."""
    alone = {r["job"]: r["jobs"][0] for r in rows if r["mode"] == "alone"}
    for r in rows:
        ok = [j for j in r["jobs"] if j["status"] == "ok"]
        base = alone[r["job"]]
        r["oom"] = len(r["jobs"]) - len(ok)
        r["images_s"] = [j["images_s"] for j in ok]
        r["epoch_s"] = [dataset / j["images_s"] for j in ok]
        if base["status"] == "ok":
            r["aggregate"] = sum(r["images_s"]) / base["images_s"]
        else:
            r["aggregate"] = None
    return rows


def label(r: dict[str, Any]) -> str:
    if r["mode"] == "mig":
        return f"MIG {r['n']} x {r['mig'].split(',')[0]}"
    if r["mode"] == "mig-solo":
        return f"MIG {r['mig'].split(',')[0]}, one job"
    if r["mode"] == "mps-capped":
        return f"MPS, {r['mps_percentage']}% threads"
    return {"alone": "alone (whole GPU)", "time-slice": "time slicing", "mps": "MPS"}[r["mode"]]


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown: one line per row."""
    lines = [
        "| job | jobs | sharing | images/s per job | aggregate | epoch (s) | out of memory | peak GiB |",
        "| --- | ---: | --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in rows:
        ok = [j for j in r["jobs"] if j["status"] == "ok"]
        rates = ", ".join(str(v) for v in sorted({round(x) for x in r["images_s"]})) or "-"
        agg = "-" if r["aggregate"] is None else f"{r['aggregate']:.2f}x"
        epoch = f"{statistics.mean(r['epoch_s']):.1f}" if r["epoch_s"] else "-"
        oom = f"{r['oom']} of {r['n']}" if r["oom"] else "no"
        peak = f"{max(j['peak_gib'] for j in ok):.2f}" if ok else "-"
        lines.append(f"| {r['job']} | {r['n']} | {label(r)} | {rates} | {agg} | {epoch} | {oom} | {peak} |")
    return lines


def plot(rows: list[dict[str, Any]], gpu: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = list(dict.fromkeys(r["job"] for r in rows))
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    counts = sorted({r["n"] for r in rows if r["mode"] in modes})
    fig, axes = plt.subplots(1, len(jobs), figsize=(5.5 * len(jobs), 3.8), squeeze=False)
    width = 0.8 / max(1, len(modes))
    for ax, job in zip(axes[0], jobs, strict=True):
        for i, mode in enumerate(modes):
            for k, n in enumerate(counts):
                hit = [r for r in rows if r["job"] == job and r["mode"] == mode and r["n"] == n]
                if not hit:
                    continue
                r = hit[0]
                x = k + (i - (len(modes) - 1) / 2) * width
                value = r["aggregate"] or 0.0
                ax.bar(x, value, width, color=f"C{i}", label=mode if k == 0 else None)
                if r["oom"]:
                    ax.text(x, value + 0.03, f"OOM\n{r['oom']}/{n}", ha="center", fontsize=7, color="C3")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.axhline(3.0, color="grey", linestyle=":", linewidth=0.8)
        right = len(counts) - 0.5
        ax.text(right, 3.0, "published: about 3x (small jobs, MIG, A100) ", ha="right", va="bottom", fontsize=7)
        ax.set_xticks(range(len(counts)), [f"{n} jobs" for n in counts])
        ax.set_xlim(-0.5, right)
        ax.set_ylabel("aggregate throughput / one job alone")
        top = max([3.0] + [r["aggregate"] or 0 for r in rows if r["job"] == job])
        ax.set_ylim(0, top + 1.2)
        ax.set_title(f"{job} on an emulated {gpu}", fontsize=10)
        ax.legend(fontsize=7, loc="upper left", ncols=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", choices=list(GPUS), default="a100", help="the emulated GPU (default a100)")
    p.add_argument(
        "--jobs",
        nargs="+",
        type=Job.parse,
        default=[Job.parse("resnet18:64:32"), Job.parse("resnet50:128:224")],
        help="MODEL:BATCH:IMAGE jobs, each collocated with copies of itself "
        "(default: resnet18:64:32, CIFAR-10-sized; resnet50:128:224, ImageNet-sized)",
    )
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="sharing modes (default: all)")
    p.add_argument("--counts", nargs="+", type=int, default=[2, 4], help="jobs collocated, 1 to 4 (default 2 4)")
    p.add_argument("--iterations", type=int, default=12, help="timed iterations per job (default 12)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations first (default 2)")
    p.add_argument("--dataset", type=int, default=50_000, help="images per epoch (default 50000, CIFAR-10's)")
    p.add_argument("--out", type=Path, default=HERE, help="where the JSON and the PNG go (default: this folder)")
    p.add_argument("--replot", action="store_true", help="only print the table and redraw the PNG from --out's JSON")
    args = p.parse_args()
    name = f"collocation_{args.gpu}"
    if args.replot:
        rows = json.loads((args.out / f"{name}.json").read_text())["rows"]
        print("\n".join(table(rows)))
        plot(rows, args.gpu, args.out / f"{name}.png")
        return
    for n in args.counts:
        if n not in GPUS[args.gpu]["mig"] or n < 1:
            p.error(f"--counts: 1 to {max(GPUS[args.gpu]['mig'])} jobs")
    rows = run(args)
    print("\n".join(table(rows)))
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "args": vars(args) | {"out": str(args.out), "jobs": [j.name for j in args.jobs]},
        "published": PUBLISHED,
        "rows": rows,
    }
    (args.out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    plot(rows, args.gpu, args.out / f"{name}.png")
    print(f"wrote {args.out / (name + '.json')} and {args.out / (name + '.png')}")


if __name__ == "__main__":
    main()
