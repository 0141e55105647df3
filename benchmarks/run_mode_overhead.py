"""Host time per op of a script in run mode (`torch-emugpu run`, where "cuda"
names the emulated GPU) against the same script on native emugpu, in one
process: a resnet50 (SGD) and a GPT-2-shaped decoder (AdamW; its forward makes
its position ids with torch.arange(device=...) every step) training step,
built and fed through "cuda" device arguments in run mode and "emugpu" ones
natively, alternately (each round in the other order), R rounds. Host time is the process's CPU time (all
threads: autograd runs backward ops on a thread of its own), which other
processes on a busy machine disturb less than wall time. Run mode translates
device arguments only where they occur, so the ratio should be 1. Target: at
most 1.05x.

A busy host moves single rounds by more than that, so the script also prints
a bound that does not depend on the host's load: the calls into run mode's
wrappers per step (counted with sys.setprofile) times a wrapper's own cost (a
wrapped against an unwrapped `Tensor.to` that returns its input, timed in a
tight loop), over the step's ops times the native cost per op.

    python benchmarks/run_mode_overhead.py [--steps N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from types import FrameType

import torch
from overhead import make_step, resnet50  # benchmarks/ is the script's directory

import torch_emugpu
from torch_emugpu import _C
from torch_emugpu.device import as_cuda
from torch_emugpu.measure.models import GPT, GPTConfig

Build = Callable[[str], tuple[torch.nn.Module, torch.Tensor, torch.Tensor]]


def gpt(device: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    # GPT-2 small's layers and width with a smaller vocabulary and 6 layers: the same ops per
    # layer at a quarter of the host memory (timing mode's cost per op does not depend on sizes).
    model = GPT(GPTConfig(vocab_size=8192, layers=6)).to(device)
    idx = torch.zeros(8, 1024, dtype=torch.long, device=device)
    return model, idx, idx


def wall_ns() -> int:
    """The host's own clock: under the virtual clock, time.perf_counter reads emulated time."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def cpu_s() -> float:
    return time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)


def per_op_us(build: Build, device: str, optimizer: str, steps: int) -> float:
    """Median CPU microseconds per launched op over `steps` training steps, after 3 warm-up steps."""
    model, x, y = build(device)
    step = make_step(model, x, y, optimizer)
    for _ in range(3):
        step()
    samples = []
    for _ in range(steps):
        torch.emugpu.synchronize()
        _C._reset_engine_stats(0)
        t0 = cpu_s()
        step()
        torch.emugpu.synchronize()
        samples.append((cpu_s() - t0) / _C._engine_stats(0)["compute"][0])
    del model, x, y, step
    torch.emugpu.synchronize()
    return statistics.median(samples) * 1e6


def wrapper_calls_per_step(build: Build, optimizer: str) -> tuple[int, int]:
    """(calls of functions in as_cuda.py, ops) in one warm run-mode step: an upper bound on wrapper entries."""
    as_cuda.install()
    try:
        model, x, y = build("cuda")
        step = make_step(model, x, y, optimizer)
        step()
        calls = 0

        def count(frame: FrameType, event: str, _: object) -> None:
            nonlocal calls
            if event == "call" and frame.f_code.co_filename == as_cuda.__file__:
                calls += 1

        torch.emugpu.synchronize()
        _C._reset_engine_stats(0)
        sys.setprofile(count)
        try:
            step()
        finally:
            sys.setprofile(None)
        torch.emugpu.synchronize()
        ops = int(_C._engine_stats(0)["compute"][0])
        del model, x, y, step
        return calls, ops
    finally:
        as_cuda.uninstall()


def wrapper_cost_us(n: int = 200_000) -> float:
    """Microseconds a wrapper adds to a call: a wrapped `Tensor.to(dtype)` that returns its input against the
    unwrapped one, best of 5."""
    x = torch.empty(4, device="emugpu")
    original = torch._C.TensorBase.to
    wrapped = as_cuda._tensor_to(original)
    plain, through_wrapper = float("inf"), float("inf")
    for _ in range(5):
        t0 = wall_ns()
        for _ in range(n):
            original(x, torch.float32)
        t1 = wall_ns()
        for _ in range(n):
            wrapped(x, torch.float32)
        t2 = wall_ns()
        plain, through_wrapper = min(plain, t1 - t0), min(through_wrapper, t2 - t1)
    return max(through_wrapper - plain, 0) / n / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="measured steps per round and setting (default 10)")
    parser.add_argument("--rounds", type=int, default=5, help="alternations of the two settings (default 5)")
    args = parser.parse_args()
    torch_emugpu.configure(gpu="h100", clock="virtual", host="modelled")  # nothing sleeps: wall time is host time
    print(f"torch {torch.__version__}, emulated {torch.emugpu.get_device_name()}, timing mode, virtual clock")
    cost_us = wrapper_cost_us()
    print(f"a wrapper adds {cost_us:.3f} us to a call")
    cases: list[tuple[str, Build, str]] = [("resnet50", resnet50, "sgd"), ("gpt2-like", gpt, "adamw")]
    for name, build, optimizer in cases:
        native, run_mode = [], []
        for r in range(args.rounds):
            for setting in ("native", "run mode") if r % 2 == 0 else ("run mode", "native"):  # no order bias
                if setting == "native":
                    native.append(per_op_us(build, "emugpu", optimizer, args.steps))
                    continue
                as_cuda.install()
                try:
                    run_mode.append(per_op_us(build, "cuda", optimizer, args.steps))
                finally:
                    as_cuda.uninstall()
            print(f"{name} round {r + 1}: native {native[-1]:.2f} us/op, run mode {run_mode[-1]:.2f} us/op")
        a, b = statistics.median(native), statistics.median(run_mode)
        print(
            f"{name:10s} run mode/native = {b / a:.3f}x "
            f"(median CPU time per op: run mode {b:.2f} us, native {a:.2f} us)"
        )
        calls, ops = wrapper_calls_per_step(build, optimizer)
        print(
            f"{name:10s} bound: {calls} run-mode calls per step x {cost_us:.3f} us over {ops} ops x {a:.2f} us "
            f"= {1 + calls * cost_us / (ops * a):.4f}x"
        )


if __name__ == "__main__":
    main()
