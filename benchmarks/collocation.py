#!/usr/bin/env python3
"""How training jobs slow each other down when they share one GPU.

Measures, with plain PyTorch and torchvision (torch_emugpu is never imported),
what the GPU-sharing model must reproduce:

  solo          each job alone: per-iteration times, median and p90, peak memory,
                GPU utilisation (nvidia-smi) during the window;
  time_slicing  selected pairs (or larger groups) of jobs as separate processes,
                started together behind a barrier: the driver's default
                time slicing between contexts;
  mps           the same pairs under NVIDIA MPS (a private nvidia-cuda-mps-control
                daemon, started and always stopped again), plus each job alone
                under MPS; optionally with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE caps.

With --kernels N every member of every run also records its kernels from the
middle of its window, for at least N iterations and a quarter of the window
(torch.profiler, CUDA activity only; all members of a group start and end
recording at common times, so their recordings cover one stretch): name,
start and duration on one clock common to the processes, grid, threads per
block, registers and shared memory.
benchmarks/mps_kernels.py reads them: how each job's kernels stretch, wait
and overlap beside the other's, the evidence for a sharing model's rules.

Every job trains on a fixed synthetic batch already on the GPU (no data
loading). Each measured process synchronises after every iteration; all
members of a group iterate over one common window, and only iterations that
lie entirely inside it count, so every counted iteration ran while all the
other members were busy. Slowdown = paired median / solo median; aggregate
throughput = sum over members of paired throughput / solo throughput
(1.0: no gain over running the jobs one after another).

Everything goes to one JSON file (--out); a compact table is printed at the
end, progress goes to stderr. The default run takes about 4 minutes on an
H100, --quick about 1 minute; --device cpu is a dry run of the whole flow
with tiny inputs (no GPU needed, MPS skipped).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import itertools
import json
import math
import os
import platform
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

SCHEMA = 1
DTYPES = ("fp32", "tf32", "bf16", "fp16")
DEFAULT_JOBS = ("resnet50:64:fp32", "resnet18:128:fp32", "mobilenet_v2:128:bf16", "vgg11:64:fp32", "gpt:8:bf16")
DEFAULT_PAIRS = ("resnet50+resnet50", "resnet18+resnet18", "resnet50+resnet18", "gpt+resnet50", "mobilenet_v2+vgg11")
QUICK_JOBS = ("resnet50:64:fp32", "resnet18:128:fp32")
QUICK_PAIRS = ("resnet50+resnet50", "resnet50+resnet18")
# Environment every worker gets: the script measures plain PyTorch, so the
# torch-emugpu backend entry point (and any other) must not load.
PLAIN_TORCH_ENV = {"EMUGPU_AUTOLOAD": "0", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONUNBUFFERED": "1"}
SMI_FIELDS = ("utilization.gpu", "clocks.sm", "power.draw", "memory.used", "temperature.gpu")
SMI_INFO_FIELDS = (
    "name",
    "driver_version",
    "compute_mode",
    "mig.mode.current",
    "memory.total",
    "clocks.max.sm",
    "clocks.max.mem",
    "power.limit",
    "pci.bus_id",
)
T_START = time.monotonic()
# The profiler categories recorded by --kernels: the GPU's own work on a GPU;
# on the CPU (dry runs of the flow) the operators, so that the flow runs end to end.
GPU_ACTIVITY = ("kernel", "gpu_memcpy", "gpu_memset")
KERNEL_COLUMNS = ("name", "start_ns", "dur_ns", "blocks", "threads", "registers", "shared_bytes", "stream", "category")


class UsageError(Exception):
    """Bad arguments or an unusable environment: reported in one line, exit status 2."""


class WorkerError(Exception):
    """A worker process died, timed out or answered with an error."""


class MpsBroken(Exception):
    """The first run under MPS failed while its workers were starting CUDA: the rest of the MPS phase is skipped."""


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T_START:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- jobs


@dataclass(frozen=True)
class JobSpec:
    model: str  # a torchvision classification model, or "gpt"
    batch: int
    dtype: str  # fp32 | tf32 | bf16 | fp16

    @property
    def id(self) -> str:
        return f"{self.model}:{self.batch}:{self.dtype}"

    @classmethod
    def parse(cls, text: str) -> JobSpec:
        parts = text.strip().split(":")
        if len(parts) != 3 or not all(parts):
            raise UsageError(f"job {text!r}: expected MODEL:BATCH:DTYPE, e.g. resnet50:64:fp32 or gpt:8:bf16")
        model, batch, dtype = parts
        if not batch.isdigit() or int(batch) < 1:
            raise UsageError(f"job {text!r}: the batch size must be a positive integer")
        if dtype not in DTYPES:
            raise UsageError(f"job {text!r}: dtype must be one of {', '.join(DTYPES)}")
        return cls(model, int(batch), dtype)


@dataclass(frozen=True)
class GptConfig:
    """The decoder option: GPT-2-small-sized, pre-norm nn.TransformerEncoderLayer blocks with a causal mask."""

    layers: int = 12
    width: int = 768
    heads: int = 12
    seq: int = 512
    vocab: int = 50257


GPT_CUDA = GptConfig()
GPT_CPU = GptConfig(layers=2, width=64, heads=4, seq=32, vocab=256)  # --device cpu dry run
CPU_IMAGE = 64  # --device cpu dry run: input resolution of the CNNs (inception_v3: 96)
CPU_BATCH = 2


def resolve_groups(job_texts: list[str], pair_texts: list[str]) -> tuple[list[JobSpec], list[tuple[JobSpec, ...]]]:
    """The jobs and the groups to collocate. A group member names a job by its
    full spec, or by its model when exactly one job has that model; a full spec
    not in the job list is added to it (so that it gets a solo run)."""
    jobs: list[JobSpec] = []
    for text in job_texts:
        spec = JobSpec.parse(text)
        if spec not in jobs:
            jobs.append(spec)

    def member(token: str) -> JobSpec:
        token = token.strip()
        if ":" in token:
            spec = JobSpec.parse(token)
            if spec not in jobs:
                jobs.append(spec)
            return spec
        hits = [j for j in jobs if j.model == token]
        if len(hits) == 1:
            return hits[0]
        if not hits:
            raise UsageError(f"pair member {token!r} names no job; jobs: {', '.join(j.id for j in jobs)}")
        raise UsageError(f"pair member {token!r} is ambiguous ({', '.join(j.id for j in hits)}): give the full spec")

    groups: list[tuple[JobSpec, ...]] = []
    if pair_texts == ["all"]:
        groups = list(itertools.combinations_with_replacement(list(jobs), 2))
    elif pair_texts != ["none"]:
        for text in pair_texts:
            names = text.split("+")
            if len(names) < 2:
                raise UsageError(f"pair {text!r}: expected A+B (or A+B+C...), e.g. resnet50+resnet18")
            groups.append(tuple(member(n) for n in names))
    return jobs, groups


# ---------------------------------------------------------------- worker side (runs in the child processes)


def build_gpt(cfg: GptConfig) -> torch.nn.Module:
    import torch
    from torch import nn

    class CausalLM(nn.Module):
        """Token + position embeddings, `layers` pre-norm TransformerEncoderLayers
        (GELU, 4x MLP, no dropout) under a causal mask (SDPA takes the is_causal
        path), final LayerNorm, a head tied to the token embedding."""

        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(cfg.vocab, cfg.width)
            self.pos = nn.Embedding(cfg.seq, cfg.width)
            layer = nn.TransformerEncoderLayer(
                cfg.width, cfg.heads, 4 * cfg.width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
            )
            self.blocks = nn.TransformerEncoder(
                layer, cfg.layers, norm=nn.LayerNorm(cfg.width), enable_nested_tensor=False
            )
            self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
            self.head.weight = self.tok.weight
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(cfg.seq), persistent=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            x = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
            return self.head(x)

    return CausalLM()


class Trainer:
    """One job's model, optimizer and fixed synthetic batch on the worker's device."""

    def __init__(self, spec: JobSpec, device: torch.device) -> None:
        import torch
        import torch.nn.functional as F

        self.torch = torch
        self.spec = spec
        self.device = device
        cpu = device.type == "cpu"
        batch = min(spec.batch, CPU_BATCH) if cpu else spec.batch
        torch.set_float32_matmul_precision("high" if spec.dtype == "tf32" else "highest")
        if device.type == "cuda":
            torch.backends.cudnn.allow_tf32 = True  # PyTorch's default: fp32 convolutions use TF32
        with torch.device(device):
            if spec.model == "gpt":
                cfg = GPT_CPU if cpu else GPT_CUDA
                self.model = build_gpt(cfg)
                idx = torch.randint(0, cfg.vocab, (batch, cfg.seq))
                tgt = torch.randint(0, cfg.vocab, (batch, cfg.seq))

                def loss() -> torch.Tensor:
                    return F.cross_entropy(self.model(idx).flatten(0, 1).float(), tgt.flatten())

                self.opt: torch.optim.Optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.1)
                self.input = f"tokens {batch}x{cfg.seq}, vocab {cfg.vocab}; {asdict(cfg)}"
            else:
                import torchvision

                kwargs: dict[str, Any] = {}
                if spec.model in ("googlenet", "inception_v3"):
                    kwargs = {"aux_logits": False, "init_weights": False}
                self.model = torchvision.models.get_model(spec.model, **kwargs)
                size = 299 if spec.model == "inception_v3" else 224
                if cpu and not spec.model.startswith(("vit_", "maxvit_")):  # those need their training resolution
                    size = 96 if spec.model == "inception_v3" else CPU_IMAGE
                x = torch.randn(batch, 3, size, size)
                y = torch.randint(0, 1000, (batch,))

                def loss() -> torch.Tensor:
                    return F.cross_entropy(self.model(x).float(), y)

                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
                self.input = f"images {batch}x3x{size}x{size}, 1000 classes"
        self.loss = loss
        self.batch = batch
        self.model.train()
        amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec.dtype)
        self.amp_dtype = amp
        self.scaler = torch.amp.GradScaler(device.type) if spec.dtype == "fp16" else None
        self.params = sum(p.numel() for p in self.model.parameters())

    def describe(self) -> dict[str, Any]:
        opt = type(self.opt).__name__
        hp = {k: v for k, v in self.opt.defaults.items() if k in ("lr", "momentum", "weight_decay")}
        return {
            "parameters": self.params,
            "input": self.input,
            "batch_used": self.batch,
            "optimizer": f"{opt}({', '.join(f'{k}={v}' for k, v in hp.items())}), default implementation",
            "precision": {
                "fp32": "float32 (matmul precision 'highest'; cuDNN convolutions TF32, PyTorch's default)",
                "tf32": "float32 with TF32 matmuls and convolutions",
                "bf16": "bfloat16 autocast, float32 weights",
                "fp16": "float16 autocast with GradScaler, float32 weights",
            }[self.spec.dtype],
        }

    def step(self) -> None:
        torch = self.torch
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(
            self.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None
        ):
            loss = self.loss()
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()


def as_int(value: Any) -> int:
    """A trace field as an integer, 0 where it is absent or not a number (a thread named as text)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


class WorkerState:
    def __init__(self, device_kind: str) -> None:
        import torch

        self.torch = torch
        self.device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
        self.trainer: Trainer | None = None
        if device_kind == "cpu":
            torch.set_num_threads(1)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def memory(self) -> dict[str, int | None]:
        if self.device.type != "cuda":
            return {"peak_allocated": None, "peak_reserved": None}
        cuda = self.torch.cuda
        return {"peak_allocated": cuda.max_memory_allocated(), "peak_reserved": cuda.max_memory_reserved()}

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        cmd = msg["cmd"]
        if cmd == "info":
            return self.info()
        if cmd == "prepare":
            self.release()
            torch = self.torch
            torch.backends.cudnn.benchmark = bool(msg.get("cudnn_benchmark", False))
            t = time.monotonic()
            self.trainer = Trainer(JobSpec(**msg["job"]), self.device)
            self.sync()
            built = time.monotonic() - t
            for _ in range(msg["warmup"]):
                self.trainer.step()
            self.sync()
            warm = time.monotonic() - t - built
            if msg.get("kernels"):
                # The profiler's first start loads CUPTI (a second or more): done here, so
                # that starting it inside the measured window takes milliseconds.
                self.record_kernels(1)
            return {"ok": True, "build_s": built, "warmup_s": warm, **self.trainer.describe()}
        if cmd == "run":
            return self.run(
                msg["t0"],
                msg["until"],
                msg["min_iters"],
                msg.get("kernels", 0),
                msg.get("kernels_at"),
                msg.get("kernels_until", 0.0),
            )
        if cmd == "release":
            self.release()
            return {"ok": True}
        raise ValueError(f"unknown command {cmd!r}")

    def info(self) -> dict[str, Any]:
        torch = self.torch
        import torchvision

        doc: dict[str, Any] = {
            "ok": True,
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "torch_cuda": torch.version.cuda,
            "python": platform.python_version(),
            "torch_emugpu_imported": "torch_emugpu" in sys.modules,
            "models": sorted(torchvision.models.list_models(module=torchvision.models)),
            "cuda_available": torch.cuda.is_available(),
        }
        if self.device.type == "cuda" and doc["cuda_available"]:
            p = torch.cuda.get_device_properties(0)
            doc["device"] = {
                "name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "sm_count": p.multi_processor_count,
                "total_memory": p.total_memory,
                "count": torch.cuda.device_count(),
            }
            doc["cudnn"] = torch.backends.cudnn.version()
        return doc

    def record_kernels(self, iterations: int, until: float = 0.0) -> tuple[Any, int]:
        """Runs at least `iterations` iterations under torch.profiler, and until the
        monotonic time `until`; returns the profiler (stopped) and the iterations run."""
        from torch.profiler import ProfilerActivity, profile

        trainer = self.trainer
        assert trainer is not None
        activity = ProfilerActivity.CUDA if self.device.type == "cuda" else ProfilerActivity.CPU
        prof = profile(activities=[activity])
        prof.start()
        done = 0
        try:
            while done < iterations or time.monotonic() < until:
                trainer.step()
                self.sync()
                done += 1
        finally:
            prof.stop()
        return prof, done

    def kernel_rows(self, prof: Any, iterations: int) -> dict[str, Any]:
        """The recorded GPU activity (operators on the CPU) as compact rows, KERNEL_COLUMNS.

        Start times are nanoseconds on the profiler's clock (its base, Unix time, plus
        the event's offset), which every process on the host shares."""
        with tempfile.TemporaryDirectory(prefix="collocation-kernels-") as d:
            path = Path(d) / "trace.json"
            prof.export_chrome_trace(str(path))
            trace = json.loads(path.read_text())
        base_ns = int(trace.get("baseTimeNanoseconds", 0))
        wanted = GPU_ACTIVITY if self.device.type == "cuda" else ("cpu_op",)
        names: dict[str, int] = {}
        rows: list[list[Any]] = []
        for e in trace.get("traceEvents", []):
            cat = e.get("cat")
            if e.get("ph") != "X" or cat not in wanted:
                continue
            a = e.get("args", {})
            grid, block = a.get("grid", [0, 0, 0]), a.get("block", [0, 0, 0])
            name = names.setdefault(e["name"], len(names))
            rows.append(
                [
                    name,
                    base_ns + round(float(e["ts"]) * 1e3),
                    round(float(e.get("dur", 0)) * 1e3),
                    math.prod(grid) if grid else 0,
                    math.prod(block) if block else 0,
                    as_int(a.get("registers per thread")),
                    as_int(a.get("shared memory")),
                    as_int(a.get("stream", e.get("tid"))),
                    wanted.index(cat),
                ]
            )
        rows.sort(key=lambda r: r[1])
        t0 = rows[0][1] if rows else 0
        for r in rows:
            r[1] -= t0
        return {
            "iterations": iterations,
            "columns": list(KERNEL_COLUMNS),
            "categories": list(wanted),
            "names": list(names),
            "t0_ns": t0,
            "rows": rows,
            "device_properties": trace.get("deviceProperties", []),
        }

    def run(
        self,
        t0: float,
        until: float,
        min_iters: int,
        kernels: int = 0,
        kernels_at: float | None = None,
        kernels_until: float = 0.0,
    ) -> dict[str, Any]:
        trainer = self.trainer
        if trainer is None:
            raise RuntimeError("run before prepare")
        if self.device.type == "cuda":
            self.torch.cuda.reset_peak_memory_stats()  # the peak of the measured run only
        while (left := t0 - time.monotonic()) > 0.002:
            time.sleep(left - 0.002)
        while time.monotonic() < t0:
            pass
        self.sync()
        start = time.monotonic()
        ends: list[float] = []
        prof = None
        recorded: dict[str, Any] | None = None
        span: int | None = None
        done = 0
        while True:
            if kernels and span is None and time.monotonic() >= (kernels_at or 0.0):
                span = len(ends)  # the recorded iterations end as one long one, which window_stats leaves out
                try:
                    prof, done = self.record_kernels(kernels, kernels_until)
                except Exception as e:  # the timing run stands without them
                    recorded = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
            else:
                trainer.step()
                self.sync()
            now = time.monotonic()
            ends.append(now)
            if now >= until and len(ends) >= min_iters:
                break
        reply: dict[str, Any] = {"ok": True, "start": start, "ends": ends, **self.memory()}
        if prof is not None:
            try:
                recorded = self.kernel_rows(prof, done)
            except Exception as e:
                recorded = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
        if span is not None:
            reply["recorded_span"] = span
            reply["kernels"] = recorded
        return reply

    def release(self) -> None:
        if self.trainer is None:
            return
        self.trainer = None
        gc.collect()
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()


def worker_main(device_kind: str) -> int:
    """A measuring process: JSON commands on stdin, one JSON reply per line on
    the original stdout (library prints are sent to stderr)."""
    os.environ.update({k: v for k, v in PLAIN_TORCH_ENV.items() if k != "PYTHONUNBUFFERED"})
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(doc: dict[str, Any]) -> None:
        proto.write(json.dumps(doc) + "\n")
        proto.flush()

    try:
        state = WorkerState(device_kind)
    except Exception as e:  # torch missing or broken
        send({"ok": False, "fatal": True, "error": f"{type(e).__name__}: {e}"})
        return 2
    send({"ok": True, "hello": True, "pid": os.getpid()})
    try:
        for line in sys.stdin:
            msg = json.loads(line)
            if msg["cmd"] == "quit":
                state.release()
                send({"ok": True})
                return 0
            try:
                reply = state.handle(msg)
            except Exception as e:
                oom = type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e)
                state.release()
                reply = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:2000]}", "oom": oom}
            send(reply)
    except KeyboardInterrupt:
        return 130
    return 0


# ---------------------------------------------------------------- orchestrator side


class Worker:
    """A child process of this script in worker mode."""

    def __init__(self, name: str, device: str, env: dict[str, str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", device],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.hello: dict[str, Any] | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.replies.put(json.loads(line))
            except json.JSONDecodeError:
                print(line, end="", file=sys.stderr)
        self.replies.put(None)

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerError(f"{self.name} (pid {self.proc.pid}) is gone: {e}") from e

    def receive(self, timeout: float) -> dict[str, Any]:
        try:
            reply = self.replies.get(timeout=timeout)
        except queue.Empty:
            raise WorkerError(f"{self.name} (pid {self.proc.pid}) did not answer within {timeout:.0f} s") from None
        if reply is None:
            rc = self.proc.wait()
            raise WorkerError(f"{self.name} (pid {self.proc.pid}) exited with status {rc}")
        if not reply.get("ok"):
            raise WorkerError(reply.get("error", "unknown error"))
        return reply

    def start(self, timeout: float) -> None:
        if self.hello is None:
            self.hello = self.receive(timeout)

    def request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.send(msg)
        return self.receive(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"cmd": "quit"})
                self.proc.wait(timeout=15)
            except (WorkerError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass


class Pool:
    """Worker processes sharing one environment, started on first use; a worker
    that fails is killed and replaced by a fresh one the next time."""

    def __init__(self, label: str, device: str, env: dict[str, str], start_timeout: float) -> None:
        self.label, self.device, self.env, self.start_timeout = label, device, env, start_timeout
        self.workers: list[Worker | None] = []

    def spawn(self, n: int) -> None:
        """Starts workers 0..n-1 (imports only; CUDA is initialised on their first job)."""
        while len(self.workers) < n:
            self.workers.append(None)
        for i in range(n):
            if self.workers[i] is None:
                self.workers[i] = Worker(f"{self.label} worker {i}", self.device, self.env)

    def get(self, n: int) -> list[Worker]:
        self.spawn(n)
        out = [w for w in self.workers[:n] if w is not None]
        for w in out:
            w.start(self.start_timeout)
        return out

    def discard(self, worker: Worker) -> None:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()
        worker.close()
        self.workers = [None if w is worker else w for w in self.workers]

    def close(self) -> None:
        for w in self.workers:
            if w is not None:
                w.close()
        self.workers = []


class SmiSampler:
    """nvidia-smi polled every 200 ms during a run: NVML utilisation (the fraction
    of the last sample period in which some kernel ran), SM clock, power, memory."""

    def __init__(self, index: str) -> None:
        self.samples: list[tuple[float, list[float | None]]] = []
        self.proc = subprocess.Popen(
            [
                "nvidia-smi",
                "-i",
                index,
                f"--query-gpu={','.join(SMI_FIELDS)}",
                "--format=csv,noheader,nounits",
                "-lms",
                "200",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            values: list[float | None] = []
            for v in line.split(","):
                try:
                    values.append(float(v))
                except ValueError:
                    values.append(None)
            if len(values) == len(SMI_FIELDS):
                self.samples.append((time.monotonic(), values))

    def stop(self, lo: float, hi: float) -> dict[str, Any] | None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.thread.join(timeout=2)
        inside = [v for t, v in self.samples if lo + 0.2 <= t <= hi]
        if not inside:
            return None

        def col(i: int, how: str) -> float | None:
            xs = [v[i] for v in inside if v[i] is not None]
            if not xs:
                return None
            return round(max(xs) if how == "max" else statistics.fmean(xs), 1)

        return {
            "samples": len(inside),
            "util_mean_pct": col(0, "mean"),
            "sm_clock_mean_mhz": col(1, "mean"),
            "power_mean_w": col(2, "mean"),
            "memory_used_max_mib": col(3, "max"),
            "temp_max_c": col(4, "max"),
        }


class Mps:
    """A private MPS control daemon: pipe and log directories in temporary
    folders, exported to the workers through CUDA_MPS_PIPE_DIRECTORY and
    CUDA_MPS_LOG_DIRECTORY."""

    def __init__(self, control: str) -> None:
        self.control = control
        self.root = Path(tempfile.mkdtemp(prefix="collocation-mps-"))
        self.env = {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.root / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(self.root / "log"),
        }
        for d in self.env.values():
            Path(d).mkdir()
        self.started = False
        self.record: dict[str, Any] = {"control": control, **self.env}

    def command(self, text: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.control],
            input=text + "\n",
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self) -> None:
        r = subprocess.run(
            [self.control, "-d"], env={**os.environ, **self.env}, capture_output=True, text=True, timeout=30
        )
        if r.returncode != 0:
            why = (r.stderr or r.stdout).strip()
            raise WorkerError(f"'{self.control} -d' exited with status {r.returncode}: {why}")
        self.started = True
        deadline = time.monotonic() + 10
        while True:
            q = self.command("get_server_list", timeout=10)
            if q.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise WorkerError(f"the MPS control daemon does not answer: {(q.stderr or q.stdout).strip()}")
            time.sleep(0.2)
        self.record["started"] = True

    def servers(self) -> list[str]:
        try:
            q = self.command("get_server_list", timeout=10)
        except subprocess.TimeoutExpired:
            return []
        return q.stdout.split() if q.returncode == 0 else []

    def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        try:
            q = self.command("quit", timeout=30)
            self.record["quit"] = {"status": q.returncode, "output": (q.stdout + q.stderr).strip()[-500:]}
        except subprocess.TimeoutExpired:
            self.record["quit"] = {"status": None, "output": "quit timed out after 30 s"}
        deadline = time.monotonic() + 15
        gone = False
        while time.monotonic() < deadline:  # the daemon is gone once it no longer answers
            try:
                if self.command("get_server_list", timeout=5).returncode != 0:
                    gone = True
                    break
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.5)
        self.record["stopped"] = gone
        logs = {}
        for name in ("control.log", "server.log"):
            p = Path(self.env["CUDA_MPS_LOG_DIRECTORY"]) / name
            if p.exists():
                logs[name] = p.read_text(errors="replace").splitlines()[-40:]
        self.record["logs"] = logs
        if not gone:
            log(
                f"warning: the MPS control daemon did not confirm its exit; stop it with "
                f"'echo quit | CUDA_MPS_PIPE_DIRECTORY={self.env['CUDA_MPS_PIPE_DIRECTORY']} {self.control}'"
            )
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def window_stats(reply: dict[str, Any], t0: float, lo: float, hi: float, batch: int) -> dict[str, Any]:
    """Statistics of the iterations lying entirely inside [lo, hi], less the stretch
    recorded by --kernels (several iterations under the profiler). Times in ms."""
    ends: list[float] = reply["ends"]
    starts = [reply["start"], *ends[:-1]]
    recorded = reply.get("recorded_span")
    spans = [(s, e) for i, (s, e) in enumerate(zip(starts, ends, strict=True)) if i != recorded]
    inside = [(s, e) for s, e in spans if s >= lo and e <= hi]
    fallback = not inside  # dry runs: iterations longer than the window
    if fallback:
        inside = spans[1:] or spans or list(zip(starts, ends, strict=True))
    ms = [(e - s) * 1e3 for s, e in inside]
    mean = statistics.fmean(ms)
    doc: dict[str, Any] = {
        "iterations": len(ms),
        "median_ms": round(statistics.median(ms), 4),
        "p10_ms": round(quantile(ms, 0.1), 4),
        "p90_ms": round(quantile(ms, 0.9), 4),
        "mean_ms": round(mean, 4),
        "min_ms": round(min(ms), 4),
        "max_ms": round(max(ms), 4),
        "iter_per_s": round(1e3 / mean, 4),
        "samples_per_s": round(batch * 1e3 / mean, 2),
        "peak_allocated": reply.get("peak_allocated"),
        "peak_reserved": reply.get("peak_reserved"),
        "iter_ms": [round(x, 3) for x in ms],
        "ends_s": [round(e - t0, 6) for e in ends],
        "start_s": round(reply["start"] - t0, 6),
    }
    if fallback:
        doc["outside_window"] = True
    if recorded is not None:
        doc["kernels"] = reply.get("kernels")
    return doc


@dataclass
class Settings:
    device: str
    window: float
    settle: float
    warmup: int
    min_iters: int
    cudnn_benchmark: bool
    smi_index: str | None
    lead: float = 0.5
    kernels: int = 0  # iterations whose kernels each member records (--kernels)
    prepare_timeout: float = 150  # build + warm-up, CUDA and cuDNN start-up included
    start_timeout: float = 180  # a worker's imports
    notes: list[str] = field(default_factory=list)


class Runner:
    def __init__(
        self, args: argparse.Namespace, jobs: list[JobSpec], groups: list[tuple[JobSpec, ...]], settings: Settings
    ) -> None:
        self.args = args
        self.jobs = jobs
        self.groups = groups
        self.s = settings
        self.out = Path(args.out)
        self.pools: list[Pool] = []
        self.mps: Mps | None = None
        self.failures = 0
        self.doc: dict[str, Any] = {}
        self.job_info: dict[str, dict[str, Any]] = {}  # what the workers report when they build each job
        self.mps_unproven = False  # under MPS and no run has succeeded yet

    # ---- helpers

    def save(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1) + "\n")
        tmp.replace(self.out)

    def pool(self, label: str, extra_env: dict[str, str]) -> Pool:
        env = {**os.environ, **PLAIN_TORCH_ENV, **extra_env}
        p = Pool(label, self.s.device, env, self.s.start_timeout)
        self.pools.append(p)
        return p

    def close_pool(self, pool: Pool) -> None:
        pool.close()
        if pool in self.pools:
            self.pools.remove(pool)

    def run_group(self, pool: Pool, members: tuple[JobSpec, ...]) -> dict[str, Any]:
        """Builds and warms up every member in its own worker, then runs them over one common window."""
        s = self.s
        workers = pool.get(len(members))
        phase = "prepare"
        try:
            for w, job in zip(workers, members, strict=True):
                w.send(
                    {
                        "cmd": "prepare",
                        "job": asdict(job),
                        "warmup": s.warmup,
                        "cudnn_benchmark": s.cudnn_benchmark,
                        "kernels": s.kernels,
                    }
                )
            prepared = [w.receive(s.prepare_timeout) for w in workers]
            phase = "run"
            t0 = time.monotonic() + s.lead
            lo = t0 + s.settle
            hi = lo + s.window
            sampler = SmiSampler(s.smi_index) if s.smi_index is not None else None
            # every member records from one common time, the middle of the window, to another
            for w in workers:
                w.send(
                    {
                        "cmd": "run",
                        "t0": t0,
                        "until": hi,
                        "min_iters": s.min_iters,
                        "kernels": s.kernels,
                        "kernels_at": lo + s.window / 2,
                        "kernels_until": lo + s.window * 3 / 4,
                    }
                )
            try:
                runs = [w.receive(hi - time.monotonic() + 180) for w in workers]
            finally:
                gpu = sampler.stop(lo, hi) if sampler is not None else None
            for w in workers:
                w.request({"cmd": "release"}, 60)
        except WorkerError as e:
            for w in workers:  # a failed member may leave the others mid-command: start them afresh
                pool.discard(w)
            oom = "out of memory" in str(e).lower()
            solo_ok = all(self.doc["solo"].get(j.id, {}).get("status") == "ok" for j in members)
            if self.mps_unproven and phase == "prepare" and not oom and solo_ok:
                raise MpsBroken(f"the first run under MPS failed while starting: {e}") from e
            self.failures += 1
            return {"status": "oom" if oom else "error", "phase": phase, "error": str(e)}
        self.mps_unproven = False
        result: dict[str, Any] = {
            "status": "ok",
            "window_s": [round(lo - t0, 3), round(hi - t0, 3)],
            "members": [],
            "gpu": gpu,
        }
        for job, prep, run in zip(members, prepared, runs, strict=True):
            self.job_info.setdefault(
                job.id, {k: prep[k] for k in ("parameters", "input", "batch_used", "optimizer", "precision")}
            )
            stats = window_stats(run, t0, lo, hi, prep["batch_used"])
            stats = {
                "job": job.id,
                "build_s": round(prep["build_s"], 3),
                "warmup_s": round(prep["warmup_s"], 3),
                **stats,
            }
            result["members"].append(stats)
        return result

    def describe_job(self, job: JobSpec, prep_info: dict[str, Any] | None) -> dict[str, Any]:
        return {"id": job.id, "model": job.model, "batch": job.batch, "dtype": job.dtype, **(prep_info or {})}

    # ---- phases

    def solo_phase(self, pool: Pool, key: str) -> None:
        self.doc[key] = {}
        for job in self.jobs:
            r = self.run_group(pool, (job,))
            if r["status"] == "ok":
                m = r["members"][0]
                entry = {"status": "ok", **{k: v for k, v in m.items() if k != "job"}, "gpu": r["gpu"]}
                util = r["gpu"]["util_mean_pct"] if r["gpu"] else None
                log(
                    f"{key} {job.id}: median {m['median_ms']:.2f} ms, p90 {m['p90_ms']:.2f} ms, "
                    f"{m['iterations']} iterations"
                    + (f", peak {m['peak_allocated'] / 2**30:.2f} GiB" if m["peak_allocated"] else "")
                    + (f", GPU util {util:.0f}%" if util is not None else "")
                )
            else:
                entry = r
                log(f"{key} {job.id}: {r['status']}: {r['error']}")
            self.doc[key][job.id] = entry
            self.save()

    def pairs_phase(self, pool: Pool, mode: str) -> None:
        entries: list[dict[str, Any]] = []
        self.doc["modes"][mode]["pairs"] = entries
        for group in self.groups:
            name = " + ".join(j.id for j in group)
            r = self.run_group(pool, group)
            entry: dict[str, Any] = {"jobs": [j.id for j in group], **r}
            if r["status"] == "ok":
                agg = 0.0
                for m in r["members"]:
                    solo = self.doc["solo"].get(m["job"], {})
                    if solo.get("status") == "ok":
                        m["slowdown_median"] = round(m["median_ms"] / solo["median_ms"], 4)
                        m["slowdown_mean"] = round(m["mean_ms"] / solo["mean_ms"], 4)
                        m["normalized_throughput"] = round(solo["mean_ms"] / m["mean_ms"], 4)
                        agg += solo["mean_ms"] / m["mean_ms"]
                    else:
                        agg = math.nan
                entry["aggregate_throughput"] = None if math.isnan(agg) else round(agg, 4)
                slow = ", ".join(f"{m.get('slowdown_median', float('nan')):.2f}x" for m in r["members"])
                log(f"{mode} {name}: slowdown {slow}, aggregate {entry['aggregate_throughput']}")
            else:
                log(f"{mode} {name}: {r['status']}: {r['error']}")
            entries.append(entry)
            self.save()

    def mps_phase(self) -> None:
        args = self.args
        modes = self.doc["modes"]
        control = shutil.which("nvidia-cuda-mps-control")
        reason = None
        if args.mps == "off":
            reason = "--mps off"
        elif not self.groups:
            reason = "no pairs to run"
        elif self.s.device == "cpu" and args.mps != "on":
            reason = "--device cpu: MPS needs a GPU (--mps on runs the flow anyway, for testing)"
        elif control is None:
            reason = "nvidia-cuda-mps-control is not on PATH"
        elif args.mps == "auto" and os.geteuid() != 0:
            reason = "not running as root (--mps on tries anyway)"
        caps = [None, *args.mps_caps]
        names = ["mps" if c is None else f"mps_cap{c}" for c in caps]
        if reason is not None:
            for n in names:
                modes[n] = {"status": "skipped", "reason": reason}
            log(f"MPS skipped: {reason}")
            self.save()
            return
        assert control is not None
        self.mps = Mps(control)
        try:
            try:
                self.mps.start()
            except (WorkerError, OSError, subprocess.TimeoutExpired) as e:
                for n in names:
                    modes[n] = {"status": "failed", "reason": f"MPS did not start: {e}"}
                log(f"MPS did not start: {e}")
                return
            log(f"MPS control daemon started (pipe {self.mps.env['CUDA_MPS_PIPE_DIRECTORY']})")
            for cap, name in zip(caps, names, strict=True):
                env = dict(self.mps.env)
                if cap is not None:
                    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cap)
                modes[name] = {"status": "running", "env": env}
                pool = self.pool(name, env)
                self.mps_unproven = True
                try:
                    try:
                        if cap is None and args.mps_solo:
                            self.solo_phase(pool, "solo_mps")
                        self.pairs_phase(pool, name)
                    except MpsBroken as e:
                        log(f"{name}: {e}; skipping the MPS phase")
                        modes[name].update(status="failed", reason=str(e))
                        for n in names[names.index(name) + 1 :]:
                            modes[n] = {"status": "skipped", "reason": f"{name} failed"}
                        break
                    modes[name]["mps_servers"] = self.mps.servers()  # workers still attached: a server must exist
                    modes[name]["status"] = "ok"
                    if not modes[name]["mps_servers"] and self.s.device == "cuda":
                        modes[name]["warning"] = "no MPS server listed while the clients were attached"
                        log(f"warning: {name}: get_server_list shows no MPS server; the clients may not have used MPS")
                finally:
                    self.close_pool(pool)
                self.save()
        finally:
            self.mps_unproven = False
            for pool in list(self.pools):
                self.close_pool(pool)
            self.mps.stop()
            self.doc["mps_daemon"] = self.mps.record
            log("MPS control daemon stopped" if self.mps.record.get("stopped") else "MPS stop not confirmed")
            self.save()

    def run(self) -> int:
        s = self.s
        # CUDA clients of the time-slicing phases point at an empty MPS pipe directory, so that
        # they never join an MPS daemon that may already run at the default /tmp/nvidia-mps.
        no_mps_dir = tempfile.mkdtemp(prefix="collocation-nomps-")
        try:
            ts_env = {"CUDA_MPS_PIPE_DIRECTORY": no_mps_dir} if s.device == "cuda" else {}
            pool = self.pool("time_slicing", ts_env)
            pool.spawn(max([1, *(len(g) for g in self.groups)]))  # imports overlap; CUDA starts on first job
            info = pool.get(1)[0].request({"cmd": "info"}, 120)
            if info.get("torch_emugpu_imported"):
                raise UsageError("torch_emugpu was imported into a worker; this script must measure plain PyTorch")
            if s.device == "cuda" and not info.get("cuda_available"):
                raise UsageError(
                    f"CUDA is not available to PyTorch {info['torch']} (CUDA build {info['torch_cuda']}); "
                    "this script measures a real GPU. Use --device cpu for a dry run of the flow."
                )
            unknown = sorted({j.model for j in self.jobs if j.model != "gpt" and j.model not in info["models"]})
            if unknown:
                raise UsageError(
                    f"unknown model(s) {', '.join(unknown)}: use gpt or a torchvision classification "
                    f"model ({', '.join(info['models'])})"
                )
            self.doc = {
                "schema": SCHEMA,
                "tool": "benchmarks/collocation.py",
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "host": socket.gethostname(),
                "argv": sys.argv[1:],
                "device": s.device,
                "gpu": {**info.get("device", {}), "nvidia_smi": nvidia_smi_info(s.smi_index)},
                "software": {k: info.get(k) for k in ("torch", "torchvision", "torch_cuda", "cudnn", "python")},
                "cpu_count": os.cpu_count(),
                "root": os.geteuid() == 0,
                "method": method(s),
                "jobs": [],
                "groups": [[j.id for j in g] for g in self.groups],
                "solo": {},
                "modes": {"time_slicing": {"status": "running"}},
            }
            if s.device == "cuda":
                dev = info["device"]
                log(
                    f"GPU {dev['name']} ({dev['sm_count']} SMs, {dev['total_memory'] / 2**30:.0f} GiB), "
                    f"torch {info['torch']}, driver {self.doc['gpu']['nvidia_smi'].get('driver_version', '?')}"
                )
            self.save()

            self.solo_phase(pool, "solo")
            if self.groups:
                self.pairs_phase(pool, "time_slicing")
                self.doc["modes"]["time_slicing"]["status"] = "ok"
            else:
                self.doc["modes"]["time_slicing"] = {"status": "skipped", "reason": "no pairs"}
            self.close_pool(pool)  # no CUDA context of ours is left when MPS starts
            self.save()
            self.mps_phase()
        finally:
            for p in list(self.pools):
                self.close_pool(p)
            shutil.rmtree(no_mps_dir, ignore_errors=True)
        self.doc["jobs"] = [self.describe_job(j, self.job_info.get(j.id)) for j in self.jobs]
        self.doc["elapsed_s"] = round(time.monotonic() - T_START, 1)
        self.save()
        print_table(self.doc)
        log(f"wrote {self.out} ({self.doc['elapsed_s']:.0f} s)")
        return 1 if self.failures else 0


def nvidia_smi_info(index: str | None) -> dict[str, Any]:
    if index is None or shutil.which("nvidia-smi") is None:
        return {}
    out: dict[str, Any] = {}

    def query(fields: tuple[str, ...]) -> list[str] | None:
        try:
            r = subprocess.run(
                ["nvidia-smi", "-i", index, f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if r.returncode != 0:
            return None
        values = [v.strip() for v in r.stdout.strip().split(",")]
        return values if len(values) == len(fields) else None

    values = query(SMI_INFO_FIELDS)
    if values is not None:
        return dict(zip(SMI_INFO_FIELDS, values, strict=True))
    for f in SMI_INFO_FIELDS:  # an unknown field fails the whole query: ask one by one
        v = query((f,))
        if v is not None:
            out[f] = v[0]
    return out


def method(s: Settings) -> dict[str, Any]:
    return {
        "iteration": "zero_grad(set_to_none), forward (under autocast for bf16/fp16) and loss, backward, optimizer "
        "step (GradScaler for fp16), then torch.cuda.synchronize(); one fixed synthetic batch resident "
        "on the device, no data loading",
        "timing": "host time.monotonic() (CLOCK_MONOTONIC, common to all processes) after each synchronize; an "
        "iteration's time is the difference of consecutive stamps, so it includes launch overhead and the "
        "short idle gap each synchronize leaves",
        "window": f"every member of a run is built and warmed up ({s.warmup} iterations + synchronize) in its own "
        f"process, then all start at one common time t0 (barrier), iterate until the first iteration "
        f"ending after t0+{s.settle}+{s.window} s, and only iterations lying entirely inside "
        f"[t0+{s.settle}, t0+{s.settle}+{s.window}] s count: every counted iteration ran while all the "
        f"other members were busy",
        "solo": "each job alone in one worker process (jobs one after another: built, warmed up, measured, freed "
        "with empty_cache); solo_mps is the same under the MPS daemon",
        "slowdown_median": "paired median / solo median (solo measured without MPS); slowdown_mean likewise with means",
        "normalized_throughput": "solo mean / paired mean: the member's throughput as a fraction of its solo "
        "throughput",
        "aggregate_throughput": "sum of the members' normalized throughputs: 1.0 means no gain over running the jobs "
        "one after another, N means each ran as fast as alone",
        "processes": "one Python process per member (this script in --worker mode), commands over pipes; the "
        "time-slicing workers have CUDA_MPS_PIPE_DIRECTORY set to an empty directory so that they never "
        "join an MPS daemon; MPS workers are new processes started after the private daemon",
        "mps": "nvidia-cuda-mps-control -d with CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY in a temporary "
        "folder, exported to the workers; stopped with 'quit' in a finally block; mps_capN sets "
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=N for every client",
        "gpu": "nvidia-smi polled every 200 ms during the window (mean utilization.gpu: NVML's share of each sample "
        "period in which some kernel ran, coarse; mean SM clock and power; max memory used)",
        "memory": "peak_allocated / peak_reserved: torch.cuda.max_memory_allocated / max_memory_reserved over the "
        "measured run (statistics reset after warm-up; the cache then holds the warm-up's blocks)",
        "cudnn_benchmark": s.cudnn_benchmark,
        "kernels": (
            f"each member recorded its kernels under torch.profiler (CUDA activity only) for at least "
            f"{s.kernels} consecutive iterations from the middle of the window and until three quarters of "
            "it, all members starting and ending at common times; those iterations count as one span that "
            "the statistics leave out; rows as KERNEL_COLUMNS, start times in ns on the profiler's clock "
            "common to the processes"
            if s.kernels
            else None
        ),
        "seconds": s.window,
        "settle_s": s.settle,
        "warmup_iterations": s.warmup,
        "min_iterations": s.min_iters,
        "gpt": asdict(GPT_CUDA if s.device == "cuda" else GPT_CPU),
        "dry_run": s.device == "cpu",
        "notes": s.notes,
    }


def print_table(doc: dict[str, Any]) -> None:
    print(f"\nsolo ({doc['method']['seconds']} s windows; ms per iteration)")
    print(f"{'job':26} {'mode':5} {'median':>8} {'p90':>8} {'samples/s':>10} {'peak GiB':>8} {'GPU util':>8}")
    for key, label in (("solo", "plain"), ("solo_mps", "mps")):
        for job, e in doc.get(key, {}).items():
            if e.get("status") != "ok":
                print(f"{job:26} {label:5} {e.get('status')}: {str(e.get('error'))[:60]}")
                continue
            peak = f"{e['peak_allocated'] / 2**30:.2f}" if e.get("peak_allocated") else "-"
            util = (
                f"{e['gpu']['util_mean_pct']:.0f}%" if e.get("gpu") and e["gpu"]["util_mean_pct"] is not None else "-"
            )
            print(
                f"{job:26} {label:5} {e['median_ms']:8.2f} {e['p90_ms']:8.2f} {e['samples_per_s']:10.1f} "
                f"{peak:>8} {util:>8}"
            )
    rows = [(mode, p) for mode, m in doc["modes"].items() for p in m.get("pairs", [])]
    if rows:
        print("\ncollocated (slowdown = paired median / solo median; aggregate = sum of throughput / solo throughput)")
        print(f"{'mode':13} {'jobs':48} {'slowdowns':>16} {'aggregate':>9} {'GPU util':>8}")
        for mode, p in rows:
            jobs = " + ".join(p["jobs"])
            if p.get("status") != "ok":
                print(f"{mode:13} {jobs:48} {p.get('status')}: {str(p.get('error'))[:50]}")
                continue
            slow = "/".join(f"{m['slowdown_median']:.2f}" if "slowdown_median" in m else "?" for m in p["members"])
            agg = f"{p['aggregate_throughput']:.2f}" if p.get("aggregate_throughput") is not None else "-"
            util = (
                f"{p['gpu']['util_mean_pct']:.0f}%" if p.get("gpu") and p["gpu"]["util_mean_pct"] is not None else "-"
            )
            print(f"{mode:13} {jobs:48} {slow:>16} {agg:>9} {util:>8}")
    for mode, m in doc["modes"].items():
        if m.get("status") not in ("ok", None):
            print(f"{mode}: {m.get('status')}: {m.get('reason', '')}")


def estimate_s(n_jobs: int, n_groups: int, s: Settings, mps: bool, mps_solo: bool, caps: int) -> float:
    per_run = s.lead + s.settle + s.window + (0.5 if s.device == "cpu" else 2.5)  # + build, warm-up, last iteration
    runs = n_jobs + n_groups
    if mps:
        runs += n_groups * (1 + caps) + (n_jobs if mps_solo else 0)
    return 12 + runs * per_run + (15 * (1 + caps) if mps else 0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="collocation.py",
        description="Measure how training jobs slow each other down when they share one GPU: each job alone, then "
        "pairs of jobs as separate processes under the driver's default time slicing, then the same "
        "pairs under MPS. Plain PyTorch + torchvision; writes one JSON file and prints a table.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="""\
jobs:
  MODEL:BATCH:DTYPE, MODEL a torchvision classification model (resnet50, resnet18,
  mobilenet_v2, vgg11, ...) trained with SGD on 224x224 images, or gpt: a
  12-layer 768-wide causal decoder (nn.TransformerEncoderLayer blocks, sequence
  512, GPT-2 vocabulary) trained with AdamW. DTYPE: fp32 (PyTorch defaults),
  tf32, bf16 (autocast), fp16 (autocast + GradScaler). Synthetic data on the GPU.

pairs:
  A+B, each member a job's full spec or its model name when that is unique;
  A+B+C runs three processes. 'all' = every pair of jobs, 'none' = solo only.

examples:
  python benchmarks/collocation.py --out $OUT/collocation.json     # ~4 min on an H100
  python benchmarks/collocation.py --quick                         # ~1 min
  python benchmarks/collocation.py --jobs resnet18:32:fp32 --pairs resnet18+resnet18+resnet18 --mps-caps 33
  python benchmarks/collocation.py --device cpu --quick            # dry run of the flow, no GPU

MPS runs when the script is root and nvidia-cuda-mps-control is on PATH (--mps
auto); the daemon is private to the run and is always stopped at the end.
Exit status: 0 all runs measured, 1 some run failed (recorded in the JSON),
2 bad arguments or no usable CUDA device.""",
    )
    p.add_argument(
        "--jobs",
        default=None,
        metavar="SPEC[,SPEC...]",
        help=f"jobs to measure (default: {', '.join(DEFAULT_JOBS)}; --quick: {', '.join(QUICK_JOBS)})",
    )
    p.add_argument(
        "--pairs",
        default=None,
        metavar="A+B[,A+B...]",
        help=f"groups to collocate (default: {', '.join(DEFAULT_PAIRS)}; --quick: {', '.join(QUICK_PAIRS)})",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=None,
        metavar="S",
        help="measured window of every run in seconds (default 8; --quick 2; --device cpu 0.5)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        metavar="N",
        help="warm-up iterations before each run (default 5; --quick 3; --device cpu 1)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="about one minute: two jobs, two pairs, 2 s windows, no solo runs under MPS",
    )
    p.add_argument(
        "--mps",
        choices=("auto", "on", "off"),
        default="auto",
        help="auto: run the MPS phase when root and nvidia-cuda-mps-control exists; on: try it even when "
        "not root (and with --device cpu, to test the flow); off: skip it (default auto)",
    )
    p.add_argument(
        "--mps-caps",
        default="",
        metavar="PCT[,PCT...]",
        help="also run the pairs under MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=PCT for every client, "
        "once per value (default: none)",
    )
    p.add_argument(
        "--no-mps-solo",
        dest="mps_solo",
        action="store_false",
        default=None,
        help="skip the solo runs under MPS (default: run them, except with --quick)",
    )
    p.add_argument(
        "--kernels",
        type=int,
        default=0,
        metavar="N",
        help="also record every member's kernels from the middle of each window, for at least N iterations "
        "and a quarter of the window (torch.profiler; read them with benchmarks/mps_kernels.py; default 0: none)",
    )
    p.add_argument("--cudnn-benchmark", action="store_true", help="set torch.backends.cudnn.benchmark (default off)")
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda (default) or cpu: a dry run of the whole flow with tiny inputs and ~2 iterations",
    )
    p.add_argument(
        "--out",
        default="collocation.json",
        metavar="PATH",
        help="JSON output, rewritten after every run (default collocation.json)",
    )
    p.add_argument("--worker", choices=("cuda", "cpu"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.mps_caps = [int(x) for x in args.mps_caps.split(",") if x.strip()]
    except ValueError:
        p.error("--mps-caps: expected integers, e.g. 50 or 25,50")
    if any(not 1 <= c <= 100 for c in args.mps_caps):
        p.error("--mps-caps: percentages must lie in 1..100")
    if args.seconds is not None and args.seconds <= 0:
        p.error("--seconds must be positive")
    if args.warmup is not None and args.warmup < 0:
        p.error("--warmup must be at least 0")
    if args.kernels < 0:
        p.error("--kernels must be at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker)

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    cpu = args.device == "cpu"
    try:
        job_texts = args.jobs.split(",") if args.jobs else list(QUICK_JOBS if args.quick else DEFAULT_JOBS)
        pair_texts = args.pairs.split(",") if args.pairs else list(QUICK_PAIRS if args.quick else DEFAULT_PAIRS)
        jobs, groups = resolve_groups([t for t in job_texts if t.strip()], [t for t in pair_texts if t.strip()])
        if not jobs:
            raise UsageError("no jobs given")
    except UsageError as e:
        print(f"collocation.py: error: {e}", file=sys.stderr)
        return 2
    window = args.seconds if args.seconds is not None else (0.5 if cpu else 2.0 if args.quick else 8.0)
    warmup = args.warmup if args.warmup is not None else (1 if cpu else 3 if args.quick else 5)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    smi = None if cpu or shutil.which("nvidia-smi") is None else (visible if visible.isdigit() else "0")
    settings = Settings(
        device=args.device,
        window=window,
        settle=0.0 if cpu else min(0.5, window / 4),
        warmup=warmup,
        min_iters=2 if cpu else 1,
        cudnn_benchmark=args.cudnn_benchmark,
        smi_index=smi,
        kernels=args.kernels,
    )
    if not cpu and smi is None:
        settings.notes.append("nvidia-smi not found: no GPU utilisation, clock or driver figures")
    if args.mps_solo is None:
        args.mps_solo = not args.quick
    will_mps = args.mps == "on" or (
        args.mps == "auto" and not cpu and os.geteuid() == 0 and shutil.which("nvidia-cuda-mps-control") is not None
    )
    est = estimate_s(len(jobs), len(groups), settings, will_mps and bool(groups), args.mps_solo, len(args.mps_caps))
    log(
        f"{len(jobs)} jobs, {len(groups)} groups, {window:g} s windows on {args.device}"
        f"{', MPS phase' if will_mps and groups else ''}: about {est / 60:.1f} min"
    )
    runner = Runner(args, jobs, groups, settings)
    try:
        return runner.run()
    except UsageError as e:
        print(f"collocation.py: error: {e}", file=sys.stderr)
        return 2
    except WorkerError as e:
        print(f"collocation.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("collocation.py: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
