"""DDP scaling on emulated GPUs, against the collective cost model's prediction.

Runs one DistributedDataParallel job (a torchvision model, a synthetic batch
copied from pinned host memory every iteration, SGD with momentum: the loop
of examples/ddp_resnet.py) in timing mode over backend `emu`, on

  - one emulated node of 1, 2, 4, 8 GPUs: one
    `python -m torch.distributed.run --standalone --nproc-per-node N` each;
  - 1, 2, 4 emulated nodes of G GPUs (--gpus-per-node, default 2): one
    torchrun per node, all started together, meeting at a c10d rendezvous
    on a free loopback port (--nnodes K --node-rank i --rdzv-backend c10d).

Each rank (this script with --worker) times its iterations on the emulated
clock (emugpu Events; the median after warm-up) and writes a JSON file. The
driver prints a markdown table: iteration time, throughput, scaling
efficiency against 1 GPU, the prediction and its error, the host-bound
verdict, peak emulated memory, host memory per rank; and plots throughput
and efficiency against ranks, emulated and predicted.

Prediction: from the 1-rank run and the cost model alone. Its DDP comm hook
records each bucket's bytes and when the bucket's gradients were ready on
the device. For G x K ranks the all-reduces run in order on one stream,
end_k = max(ready_k, end_k-1) + all_reduce(bytes_k, G, K); DDP's finalize
copies each bucket back into the gradients once its all-reduce ended; the
optimizer follows; the broadcast of buffers before each forward adds its
modelled time. benchmarks/README.md has the details.

Host-bound: a rank's device sat idle waiting for late launches more than 10%
of the timed iterations, or torch_emugpu.host_bound_report() judged a window
host-bound during them. Such rows measure this machine's cores, not the
GPU: marked HOST-BOUND, left out of the accuracy summary.

    python benchmarks/ddp_scaling.py                 # resnet50, 1-8 GPUs, 1-4 nodes of 2 (a few minutes)
    python benchmarks/ddp_scaling.py --quick         # smoke test: resnet18, 1-2 ranks
    python benchmarks/ddp_scaling.py --gpus 1 --nodes 2,4 --net-gbps 1.25   # a 10 Gb/s network
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Defaults chosen so that as many configurations as possible are device-bound
# on a small host (2 cores for 8 ranks): a slow GPU and a large batch make the
# device's iteration long, while timing mode's host cost barely grows with
# the batch (only the input copy does). See benchmarks/README.md.
DEFAULT_GPU = "Tesla V100-PCIE-32GB"
DEFAULT_MODEL = "resnet50"
DEFAULT_BATCH = 128
# As torch_emugpu's host-bound monitor: a device idle more than this share of the time measures the host.
IDLE_FRACTION = 0.10
RESULTS = Path(__file__).resolve().parent / "results"


# ---------------------------------------------------------------------------
# worker: one rank under torchrun
# ---------------------------------------------------------------------------


def _vm_kib(name: str, path: str = "/proc/self/status") -> int:
    """A line of /proc/self/status (VmRSS, VmHWM) or smaps_rollup (Pss) in KiB (0 where there is none)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _time_copies(device: Any, sizes: list[int], dtype: Any) -> float:
    """Device milliseconds of copying views of one flat buffer (`sizes` elements each) into separate tensors,
    launched behind enough queued work that the host's launch latency is hidden (checked: the device must not
    have sat idle for a late launch meanwhile; else retried behind more work)."""
    import torch

    import torch_emugpu

    flat = torch.empty(sum(sizes), dtype=dtype, device=device)
    views, grads = flat.split(sizes), [torch.empty(n, dtype=dtype, device=device) for n in sizes]
    a = torch.empty(4096, 4096, device=device)
    for attempt in range(4):
        torch.mm(a, a)  # the device idled since the last synchronize: counted before `idle` is read
        idle = torch_emugpu.host_bound_report(device.index)["idle_ns"]
        for _ in range(8 << attempt):  # tens of milliseconds of matmuls even on the fastest GPUs of the catalog
            torch.mm(a, a)
        start, end = torch.emugpu.Event(enable_timing=True), torch.emugpu.Event(enable_timing=True)
        start.record()
        for grad, view in zip(grads, views, strict=True):
            grad.copy_(view)
        end.record()
        end.synchronize()
        if torch_emugpu.host_bound_report(device.index)["idle_ns"] == idle:
            break
    return start.elapsed_time(end)


def worker(args: argparse.Namespace) -> None:
    """One rank: trains, times on the emulated clock, writes rank<R>.json to --out."""
    import datetime

    import torch
    import torch.distributed as dist
    import torchvision
    from torch.autograd import Variable

    import torch_emugpu

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("emugpu", local_rank)
    torch.emugpu.set_device(device)
    dist.init_process_group(device_id=device, timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))

    # Built on the device, as with `torch.device("cuda")`: in timing mode its parameters are then
    # placeholders that cost no host memory (moved from the CPU they would be real bytes twice over).
    with torch.device(device):
        model = torchvision.models.get_model(args.model, num_classes=1000)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])

    def event() -> torch.Event:
        return torch.emugpu.Event(enable_timing=True)

    side = torch.emugpu.Stream(device=device)  # only waits and records: costs the device nothing
    buckets: list[tuple[int, int, torch.Event, torch.Event]] = []
    gradients: dict[int, list[int]] = {}  # bucket index -> each gradient's element count (the last iteration's)
    last = args.warmup + args.iterations - 1
    iteration = 0

    def hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP's allreduce_hook, plus two events: when the bucket's all-reduce
        may start (its gradients are ready on the current stream) and when it
        ended (a side stream that waits for it)."""
        tensor = bucket.buffer()
        tensor.div_(world)
        ready = event()
        ready.record(torch.emugpu.current_stream(device))
        work = dist.all_reduce(tensor, async_op=True)
        done = event()
        with torch.emugpu.stream(side):
            work.wait()
            done.record(side)
        if not buckets:
            # After DDP's finalize, still inside autograd (an event the loop recorded after backward()
            # would end a profiled backward + update region before the optimizer step: README,
            # "Profiles"). DDP queues its finalize after the last bucket's hook; a callback queued by a
            # callback runs after it.
            engine = Variable._execution_engine
            engine.queue_callback(lambda: engine.queue_callback(lambda: backward_end.record()))
        buckets.append((bucket.index(), tensor.numel() * tensor.element_size(), ready, done))
        if iteration == last:
            gradients[bucket.index()] = [g.numel() for g in bucket.gradients()]
        return work.get_future().then(lambda fut: fut.value()[0])

    # DDP compares the annotations with the classes themselves (this module's are strings).
    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    ddp.register_comm_hook(None, hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    images = torch.randn(args.batch_size, 3, 224, 224).pin_memory()
    labels = torch.randint(0, 1000, (args.batch_size,)).pin_memory()

    records: list[tuple[torch.Event, torch.Event, torch.Event, list]] = []
    previous_end: torch.Event | None = None
    warm_report: dict[str, float | int] = {}
    wall_start = time.perf_counter()
    for i in range(args.warmup + args.iterations):
        iteration = i
        if i == args.warmup:
            warm_report = torch_emugpu.host_bound_report()
            wall_start = time.perf_counter()
        buckets = []
        start, backward_end, end = event(), event(), event()
        start.record()
        x, y = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        end.record()
        records.append((start, backward_end, end, buckets))
        # As `for x, y in loader: x = x.to(device)` does: the batch is let go before the next one is copied in.
        del x, y, loss
        # One iteration in flight, as a loop that logs the previous step's
        # loss: the host waits here (closing host-bound windows) without
        # leaving the device idle while it is ahead.
        if previous_end is not None:
            previous_end.synchronize()
        previous_end = end
    torch.emugpu.synchronize()
    wall = (time.perf_counter() - wall_start) / args.iterations
    report = torch_emugpu.host_bound_report()

    # What DDP's Reducer does per bucket once its all-reduce has ended (finalize_backward): copy the
    # bucket's views back into each parameter's .grad. Timed on the emulated device for the prediction.
    copy_ms = {index: _time_copies(device, sizes, torch.float32) for index, sizes in gradients.items()}

    iterations = []
    for i in range(args.warmup, len(records)):
        start, backward_end, end, its_buckets = records[i]
        iterations.append(
            {
                # From this iteration's start to the next one's (to its own end for the last): idle gaps the
                # host leaves between iterations count, as they cost throughput.
                "iteration_ms": start.elapsed_time(records[i + 1][0] if i + 1 < len(records) else end),
                "end_ms": start.elapsed_time(end),
                "backward_end_ms": start.elapsed_time(backward_end),
                "buckets": [
                    {
                        "index": index,
                        "bytes": nbytes,
                        "ready_ms": start.elapsed_time(ready),
                        "done_ms": start.elapsed_time(done),
                        "copy_back_ms": copy_ms.get(index, 0.0),
                    }
                    for index, nbytes, ready, done in its_buckets
                ],
            }
        )
    buffers: dict[str, int] = {}
    for b in model.buffers():
        buffers[str(b.dtype)] = buffers.get(str(b.dtype), 0) + b.numel() * b.element_size()
    result = {
        "rank": rank,
        "world": world,
        "ranks_per_node": per_node,
        "node": int(os.environ.get("GROUP_RANK", "0")),
        "gpu": torch.emugpu.get_device_name(device),
        "model": args.model,
        "batch_size": args.batch_size,
        "iterations": iterations,
        "buffers": buffers,
        "wall_ms": wall * 1e3,
        "host_bound": report,
        "host_bound_windows_timed": report["host_bound_windows"] - warm_report.get("host_bound_windows", 0),
        "windows_timed": report["windows"] - warm_report.get("windows", 0),
        # The device's idle time before late launches over the timed iterations (the report's windows need
        # half a second each; short runs close none).
        "idle_fraction_timed": (report["idle_ns"] - warm_report.get("idle_ns", 0))
        / 1e6
        / max(1e-9, records[args.warmup][0].elapsed_time(records[-1][2])),
        "peak_memory_bytes": torch.emugpu.max_memory_allocated(device),
        "vm_hwm_kib": max(_vm_kib("VmHWM"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss),
        "vm_rss_kib": _vm_kib("VmRSS"),
        # The rank's share of the machine: shared pages (libraries, mostly) divided among the processes mapping them.
        "pss_kib": _vm_kib("Pss", "/proc/self/smaps_rollup"),
    }
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------
# driver: launches the configurations, predicts, aggregates
# ---------------------------------------------------------------------------


@dataclass
class Config:
    ranks_per_node: int
    nodes: int
    multi_node: bool  # launched as one torchrun per node (c10d rendezvous), else --standalone

    @property
    def ranks(self) -> int:
        return self.ranks_per_node * self.nodes

    @property
    def label(self) -> str:
        how = "rdzv" if self.multi_node else "standalone"
        return f"{self.nodes}x{self.ranks_per_node} {how}"


@dataclass
class Row:
    config: Config
    ok: bool = False
    error: str = ""
    ranks: list[dict[str, Any]] = field(default_factory=list)
    iteration_ms: float = math.nan
    predicted_ms: float = math.nan
    host_bound: bool = False
    idle: float = math.nan  # the largest share of the timed iterations a rank's device sat idle for a late launch

    def samples_per_s(self, batch: int, ms: float) -> float:
        return self.config.ranks * batch / (ms / 1e3)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_args(args: argparse.Namespace, out: Path) -> list[str]:
    return [
        str(Path(__file__).resolve()),
        "--worker",
        "--out",
        str(out),
        "--model",
        args.model,
        "--batch-size",
        str(args.batch_size),
        "--iterations",
        str(args.iterations),
        "--warmup",
        str(args.warmup),
        "--pg-timeout",
        str(args.pg_timeout),
    ]


def _commands(cfg: Config, args: argparse.Namespace, out: Path) -> list[list[str]]:
    run = [sys.executable, "-m", "torch.distributed.run"]
    if not cfg.multi_node:
        return [run + ["--standalone", "--nproc-per-node", str(cfg.ranks_per_node)] + _worker_args(args, out)]
    endpoint = f"127.0.0.1:{free_port()}"
    return [
        run
        + [
            "--nnodes",
            str(cfg.nodes),
            "--node-rank",
            str(i),
            "--nproc-per-node",
            str(cfg.ranks_per_node),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-conf",
            f"is_host={int(i == 0)}",
        ]
        + _worker_args(args, out)
        for i in range(cfg.nodes)
    ]


def _child_env(args: argparse.Namespace) -> dict[str, str]:
    # The rest of EMUGPU_* (network, catalog, profile path) passes through: this process reads the same for
    # the prediction. The device count comes from torchrun's LOCAL_WORLD_SIZE.
    env = {k: v for k, v in os.environ.items() if k != "EMUGPU_DEVICE_COUNT"}
    env.update(EMUGPU_GPU=args.gpu, EMUGPU_MODE="timing", OMP_NUM_THREADS="1")
    if args.net_gbps is not None:
        env["EMUGPU_NET_GBPS"] = str(args.net_gbps)
    if args.net_latency_us is not None:
        env["EMUGPU_NET_LATENCY_US"] = str(args.net_latency_us)
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    return env


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def stop(procs: list[subprocess.Popen]) -> None:
    """Ends torchruns that ran past the timeout, and their ranks (which torchrun may have put in sessions of
    their own): SIGTERM to each torchrun (it stops its ranks), then SIGKILL to whatever is left, by pid."""
    tree = {pid: _cmdline(pid) for p in procs for pid in _descendants(p.pid)}
    for p in procs:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for pid, cmdline in tree.items():
        if cmdline and _cmdline(pid) == cmdline:  # still the same process
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def run_config(cfg: Config, args: argparse.Namespace, workdir: Path) -> Row:
    """Launches one configuration's torchrun(s), bounded by --timeout; reads the ranks' JSON."""
    out = workdir / cfg.label.replace(" ", "_")
    out.mkdir(parents=True, exist_ok=True)
    row = Row(cfg)
    procs: list[subprocess.Popen] = []
    logs = []
    env = _child_env(args)
    for i, cmd in enumerate(_commands(cfg, args, out)):
        log = open(out / f"node{i}.log", "w")  # noqa: SIM115  (closed below)
        logs.append(log)
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + args.timeout
    timed_out = False
    try:
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    except KeyboardInterrupt:  # the torchruns lead sessions of their own: Ctrl-C did not reach them
        stop([p for p in procs if p.poll() is None])
        raise
    if timed_out:
        stop([p for p in procs if p.poll() is None])
    for log in logs:
        log.close()
    files = sorted(out.glob("rank*.json"))
    row.ranks = [json.loads(f.read_text()) for f in files]
    codes = [p.returncode for p in procs]
    if timed_out or any(codes) or len(row.ranks) != cfg.ranks:
        tail = "\n".join((out / f"node{i}.log").read_text()[-2000:] for i in range(len(procs)))
        why = f"timed out after {args.timeout} s" if timed_out else f"exit codes {codes}"
        row.error = f"{cfg.label}: {why}, {len(row.ranks)}/{cfg.ranks} ranks reported; log tail:\n{tail}"
        return row
    row.ok = True
    row.iteration_ms = max(statistics.median(it["iteration_ms"] for it in r["iterations"]) for r in row.ranks)
    row.idle = max(r["idle_fraction_timed"] for r in row.ranks)
    row.host_bound = row.idle > IDLE_FRACTION or any(r["host_bound_windows_timed"] > 0 for r in row.ranks)
    return row


def collective_seconds(
    kind: str, nbytes: float, gpu: str, ranks_per_node: int, nodes: int, args: argparse.Namespace
) -> float:
    """The cost model's duration (0 for one rank, as backend `emu` charges none)."""
    if ranks_per_node * nodes == 1:
        return 0.0
    from torch_emugpu import _C

    return _C._collective_time(kind, float(nbytes), gpu, ranks_per_node, nodes, args.net_gbps, args.net_latency_us)[
        "seconds"
    ]


def predict_ms(baseline: dict[str, Any], ranks_per_node: int, nodes: int, args: argparse.Namespace) -> float:
    """Predicted iteration time for G x K ranks from the 1-rank run's records: the median over its
    iterations of predict_iteration()."""
    return statistics.median(
        predict_iteration(baseline, it, ranks_per_node, nodes, args)[0] for it in baseline["iterations"]
    )


def predict_iteration(
    baseline: dict[str, Any], it: dict[str, Any], ranks_per_node: int, nodes: int, args: argparse.Namespace
) -> tuple[float, list[float]]:
    """One recorded 1-rank iteration replayed for G x K ranks; returns the iteration time and each bucket's
    predicted all-reduce end (ms from the iteration's start).

    - DDP broadcasts the module's buffers (one broadcast per dtype) before the forward: everything after
      starts that much later.
    - Bucket all-reduces run in hook order on one stream: end_k = max(ready_k, end_k-1) + t(bytes_k).
    - The backward ends with DDP's finalize: per bucket, wait for its all-reduce, then copy it back into the
      gradients (copy_back_k, timed by the 1-rank worker). In the 1-rank run these copies are the last
      sum(copy_back) ms of the backward, so compute ends at backward_end - sum(copy_back); for N ranks
      t = compute end, then t = max(t, end_k) + copy_back_k.
    - The optimizer (iteration end - backward end) follows unchanged; the next iteration starts at its end
      (the 1-rank run must not be host-bound)."""
    gpu = baseline["gpu"]
    broadcast = sum(
        collective_seconds("broadcast", n, gpu, ranks_per_node, nodes, args) * 1e3 for n in baseline["buffers"].values()
    )
    ends: list[float] = []
    end = -math.inf
    for b in it["buckets"]:
        end = (
            max(b["ready_ms"] + broadcast, end)
            + collective_seconds("all_reduce", b["bytes"], gpu, ranks_per_node, nodes, args) * 1e3
        )
        ends.append(end)
    t = it["backward_end_ms"] + broadcast - sum(b["copy_back_ms"] for b in it["buckets"])
    for b, e in zip(it["buckets"], ends, strict=True):
        t = max(t, e) + b["copy_back_ms"]
    return t + it["end_ms"] - it["backward_end_ms"], ends


def network(args: argparse.Namespace) -> str:
    gbps = args.net_gbps if args.net_gbps is not None else os.environ.get("EMUGPU_NET_GBPS", 100)
    latency = args.net_latency_us if args.net_latency_us is not None else os.environ.get("EMUGPU_NET_LATENCY_US", 3)
    return f"{gbps} GB/s, {latency} us"


def fmt(value: float, spec: str) -> str:
    return "n/a" if value is None or math.isnan(value) else format(value, spec)


def table(rows: list[Row], baseline: Row | None, args: argparse.Namespace) -> str:
    head = (
        "| configuration | ranks | nodes | iteration (ms) | samples/s | efficiency | predicted (ms) | "
        "predicted eff. | error | host-bound (device idle) | peak memory (GiB) | RSS/rank (MiB) | PSS/rank (MiB) |"
    )
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    base = baseline.iteration_ms if baseline is not None and baseline.ok else math.nan
    for row in rows:
        cfg = row.config
        if not row.ok:
            lines.append(f"| {cfg.label} | {cfg.ranks} | {cfg.nodes} | FAILED |" + " |" * 9 + " |")
            continue
        error = (row.iteration_ms - row.predicted_ms) / row.predicted_ms * 100
        peak = max(r["peak_memory_bytes"] for r in row.ranks) / 2**30
        rss = max(r["vm_hwm_kib"] for r in row.ranks) / 1024
        pss = max(r["pss_kib"] for r in row.ranks) / 1024
        verdict = f"{'HOST-BOUND' if row.host_bound else 'no'} ({row.idle * 100:.1f}%)"
        lines.append(
            f"| {cfg.label} | {cfg.ranks} | {cfg.nodes} | {row.iteration_ms:.2f} | "
            f"{row.samples_per_s(args.batch_size, row.iteration_ms):.1f} | {fmt(base / row.iteration_ms * 100, '.1f')}%"
            f" | {fmt(row.predicted_ms, '.2f')} | {fmt(base / row.predicted_ms * 100, '.1f')}% | "
            f"{fmt(error, '+.3f')}% | {verdict} | {peak:.2f} | {rss:.0f} | {pss:.0f} |"
        )
    return "\n".join(lines)


def accuracy_summary(rows: list[Row]) -> list[str]:
    judged = [r for r in rows if r.ok and r.config.ranks > 1 and not r.host_bound and not math.isnan(r.predicted_ms)]
    excluded = [r.config.label for r in rows if r.ok and r.config.ranks > 1 and r.host_bound]
    lines = []
    if judged:
        errors = [abs(r.iteration_ms - r.predicted_ms) / r.predicted_ms * 100 for r in judged]
        lines.append(
            f"prediction error over {len(judged)} multi-rank configurations that were not host-bound: "
            f"median {statistics.median(errors):.3f}%, worst {max(errors):.3f}% (target: within 2%)"
        )
    else:
        lines.append(
            "prediction error: no multi-rank configuration that was not host-bound (and predicted: the "
            "prediction needs the 1-rank run)"
        )
    if excluded:
        lines.append(
            "left out of that summary as HOST-BOUND (their times measure this host, not the GPU): "
            + ", ".join(excluded)
        )
    done = [r for r in rows if r.ok]
    if done:
        big = max(done, key=lambda r: (r.config.ranks, not r.config.multi_node))
        rss = max(r["vm_hwm_kib"] for r in big.ranks) / 1024
        pss = sum(r["pss_kib"] for r in big.ranks) / 2**20
        lines.append(
            f"host memory, {big.config.label} ({big.config.ranks} ranks): peak RSS {rss:.0f} MiB per rank "
            f"(target: under 1 GB), the ranks together {pss:.2f} GiB (sum of PSS at the end)"
        )
    failed = [r.config.label for r in rows if not r.ok]
    if failed:
        lines.append("FAILED: " + ", ".join(failed))
    return lines


def plot(rows: list[Row], baseline: Row | None, args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = baseline.iteration_ms if baseline is not None and baseline.ok else math.nan
    fig, (ax_tp, ax_eff) = plt.subplots(1, 2, figsize=(10, 4))
    series = [("one node", False, "C0"), (f"nodes of {args.gpus_per_node} GPUs", True, "C1")]
    for name, multi, color in series:
        rs = sorted((r for r in rows if r.ok and r.config.multi_node == multi), key=lambda r: r.config.ranks)
        if not rs:
            continue
        x = [r.config.ranks for r in rs]
        for ax, f in (
            (ax_tp, lambda r, ms: r.samples_per_s(args.batch_size, ms)),
            (ax_eff, lambda r, ms: base / ms * 100),
        ):
            ax.plot(x, [f(r, r.iteration_ms) for r in rs], "o-", color=color, label=f"{name}: emulated")
            ax.plot(
                x,
                [f(r, r.predicted_ms) for r in rs],
                "s--",
                color=color,
                alpha=0.6,
                mfc="none",
                label=f"{name}: predicted",
            )
            bound = [r for r in rs if r.host_bound]
            if bound:
                ax.plot(
                    [r.config.ranks for r in bound],
                    [f(r, r.iteration_ms) for r in bound],
                    "x",
                    color="red",
                    ms=12,
                    label=f"{name}: HOST-BOUND",
                )
    ranks = sorted({r.config.ranks for r in rows})
    if not math.isnan(base):
        ax_tp.plot(
            ranks, [n * args.batch_size / (base / 1e3) for n in ranks], ":", color="grey", label="linear from 1 GPU"
        )
        effs = [base / ms * 100 for r in rows if r.ok for ms in (r.iteration_ms, r.predicted_ms) if not math.isnan(ms)]
        ax_eff.set_ylim(min([90.0] + [e - 5 for e in effs]), 102)
    ax_tp.set_yscale("log")  # log-log: linear scaling is a straight line
    for ax, title, unit in ((ax_tp, "throughput", "samples/s"), (ax_eff, "scaling efficiency vs 1 GPU", "%")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks, [str(r) for r in ranks])
        ax.set_xlabel("ranks (emulated GPUs)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    gpu = baseline.ranks[0]["gpu"] if baseline is not None and baseline.ok else args.gpu
    fig.suptitle(
        f"DDP {args.model}, batch {args.batch_size} per GPU, {gpu} (emugpu); network {network(args)}", fontsize=10
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _optional_path(text: str) -> Path | None:
    return Path(text) if text else None


def _int_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; '' -> [] (none of that kind)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = [0]
    if values and min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas (or ''), got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ddp_scaling.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    job = parser.add_argument_group("the job (the same on every configuration)")
    job.add_argument(
        "--model", metavar="NAME", help=f"torchvision classifier (default: {DEFAULT_MODEL}; --quick: resnet18)"
    )
    job.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help=f"samples per GPU per iteration (default: {DEFAULT_BATCH}; --quick: 16)",
    )
    job.add_argument(
        "--gpu",
        metavar="NAME",
        default=os.environ.get("EMUGPU_GPU", DEFAULT_GPU),
        help=f"emulated GPU, given to the ranks as EMUGPU_GPU (default: $EMUGPU_GPU, else {DEFAULT_GPU})",
    )
    job.add_argument("--iterations", type=int, metavar="N", help="timed iterations per rank (default: 10; --quick: 3)")
    job.add_argument(
        "--warmup",
        type=int,
        metavar="N",
        help="untimed iterations first, at least 2: DDP rebuilds its buckets after the first (default: 3; --quick: 2)",
    )
    where = parser.add_argument_group("configurations")
    where.add_argument(
        "--gpus",
        type=_int_list,
        metavar="LIST",
        help="GPU counts of one node (default: 1,2,4,8; --quick: 1,2); 1 always runs, as the baseline",
    )
    where.add_argument(
        "--nodes", type=_int_list, metavar="LIST", help="node counts (default: 1,2,4; --quick: 1,2); '' for none"
    )
    where.add_argument(
        "--gpus-per-node", type=int, metavar="G", help="GPUs per node of the multi-node runs (default: 2; --quick: 1)"
    )
    where.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: resnet18, batch 16, 1 and 2 GPUs, 1 and 2 nodes of 1, 2+3 iterations "
        "(options given explicitly still win)",
    )
    net = parser.add_argument_group(
        "network between nodes (default: $EMUGPU_NET_GBPS and $EMUGPU_NET_LATENCY_US, else 100 GB/s and 3 us)"
    )
    net.add_argument("--net-gbps", type=float, metavar="GBPS", help="GB/s per direction per node")
    net.add_argument("--net-latency-us", type=float, metavar="US", help="one network hop, microseconds")
    out = parser.add_argument_group("output and limits")
    out.add_argument(
        "--plot",
        type=_optional_path,
        metavar="PNG",
        default=RESULTS / "ddp_scaling.png",
        help="throughput and efficiency vs ranks (default: benchmarks/results/ddp_scaling.png; '' for none)",
    )
    out.add_argument("--json", type=Path, metavar="PATH", help="also write every rank's raw results here")
    out.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        default=900,
        help="seconds per configuration before its processes are killed (default: 900)",
    )
    out.add_argument(
        "--pg-timeout",
        type=float,
        metavar="S",
        default=300,
        help="the ranks' process-group timeout, seconds (default: 300)",
    )
    out.add_argument(
        "--verbose",
        action="store_true",
        help="also print, per configuration, each bucket's all-reduce: emulated vs predicted",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one rank, under torchrun
    parser.add_argument("--out", help=argparse.SUPPRESS)  # the worker's results directory
    args = parser.parse_args(argv)
    quick = {
        "model": "resnet18",
        "batch_size": 16,
        "iterations": 3,
        "warmup": 2,
        "gpus": [1, 2],
        "nodes": [1, 2],
        "gpus_per_node": 1,
    }
    full = {
        "model": DEFAULT_MODEL,
        "batch_size": DEFAULT_BATCH,
        "iterations": 10,
        "warmup": 3,
        "gpus": [1, 2, 4, 8],
        "nodes": [1, 2, 4],
        "gpus_per_node": 2,
    }
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("batch_size", "iterations", "gpus_per_node"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} expected an integer >= 1, got {getattr(args, name)}")
    if args.warmup < 2:
        parser.error(f"--warmup expected an integer >= 2 (DDP rebuilds its buckets after the first), got {args.warmup}")
    return args


def _bucket_detail(row: Row, baseline: Row, args: argparse.Namespace) -> list[str]:
    """Per bucket of rank 0's median iteration: emulated vs predicted (from the 1-rank median iteration)."""

    def median_iteration(rank: dict[str, Any]) -> dict[str, Any]:
        its = sorted(rank["iterations"], key=lambda it: it["iteration_ms"])
        return its[len(its) // 2]

    it = median_iteration(next(r for r in row.ranks if r["rank"] == 0))
    base = median_iteration(baseline.ranks[0])
    cfg = row.config
    predicted, ends = predict_iteration(baseline.ranks[0], base, cfg.ranks_per_node, cfg.nodes, args)
    lines = [
        f"  {cfg.label}: iteration {it['iteration_ms']:.3f} ms (predicted {predicted:.3f}), backward end "
        f"{it['backward_end_ms']:.3f} (1 rank: {base['backward_end_ms']:.3f})"
    ]
    for b, b1, e in zip(it["buckets"], base["buckets"], ends, strict=False):
        lines.append(
            f"    bucket {b['index']}: {b['bytes'] / 2**20:7.2f} MiB, ready {b['ready_ms']:9.3f} "
            f"(1 rank {b1['ready_ms']:9.3f}), all-reduce ends {b['done_ms']:9.3f} (predicted {e:9.3f}), "
            f"copy back {b1['copy_back_ms']:.3f}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    from tqdm import tqdm

    configs = [Config(n, 1, False) for n in args.gpus]
    if 1 not in args.gpus:
        configs.insert(0, Config(1, 1, False))  # the baseline: efficiency and the prediction come from it
    configs.sort(key=lambda c: c.ranks)
    configs += [Config(args.gpus_per_node, k, True) for k in args.nodes]
    load_before = os.getloadavg()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="ddp_scaling_") as tmp:
        bar = tqdm(configs, desc="configurations", unit="config", file=sys.stderr)
        for cfg in bar:
            bar.set_postfix_str(f"{cfg.label}: {cfg.ranks} rank(s)")
            row = run_config(cfg, args, Path(tmp))
            rows.append(row)
            if row.ok:
                bar.write(
                    f"{cfg.label}: {row.iteration_ms:.2f} ms per iteration"
                    + (" (HOST-BOUND)" if row.host_bound else ""),
                    file=sys.stderr,
                )
            else:
                bar.write(f"FAILED {row.error}", file=sys.stderr)
        bar.close()
    load_after = os.getloadavg()
    baseline = rows[0] if rows and rows[0].config.ranks == 1 else None
    if baseline is not None and baseline.ok:
        for row in rows:
            if row.ok:
                row.predicted_ms = predict_ms(baseline.ranks[0], row.config.ranks_per_node, row.config.nodes, args)
    gpu = baseline.ranks[0]["gpu"] if baseline is not None and baseline.ok else args.gpu
    print(
        f"\nDDP {args.model}, batch {args.batch_size} per GPU, {gpu}, timing mode; {args.iterations} timed "
        f"iterations after {args.warmup}; network {network(args)}; host: {os.cpu_count()} cores, "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after\n"
    )
    print(table(rows, baseline, args))
    print()
    for line in accuracy_summary(rows):
        print(line)
    if baseline is not None and baseline.ok and baseline.host_bound:
        print(
            "WARNING: the 1-rank baseline itself was host-bound: its bucket times, and so every prediction, "
            "measure this host"
        )
    if args.verbose and baseline is not None and baseline.ok:
        print("\nbuckets (rank 0, median iteration; ms from the iteration's start):")
        for row in rows:
            if row.ok:
                print("\n".join(_bucket_detail(row, baseline, args)))
    for row in rows:
        if not row.ok:
            print(f"\n{row.error}", file=sys.stderr)
    if args.plot is not None:
        plot(rows, baseline, args, args.plot)
        print(f"plot: {args.plot}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                [
                    {
                        "configuration": r.config.label,
                        "ranks_per_node": r.config.ranks_per_node,
                        "nodes": r.config.nodes,
                        "ok": r.ok,
                        "iteration_ms": r.iteration_ms,
                        "predicted_ms": r.predicted_ms,
                        "host_bound": r.host_bound,
                        "per_rank": r.ranks,
                    }
                    for r in rows
                ],
                indent=1,
            )
        )
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
