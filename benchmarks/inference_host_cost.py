"""Host cost of inference under autocast with real-valued weights.

A resnet152 whose weights hold real bytes (initialised on the CPU, then moved
to emugpu) runs `no_grad` forwards in eval mode, once in float32 and once
under `torch.autocast("emugpu", dtype=torch.bfloat16)`, in the same process.
Each iteration's host time (wall time less the time the host waited for the
emulated GPU) is printed, then the ratio of the autocast forward's to the
float32 forward's. Target: at most 1.5x, and the same every iteration (the
last iterations' median against the first's).

A second case times `w.to(torch.bfloat16)` of a 2.4 M-element weight holding
real bytes against the same cast of a placeholder weight.

    python benchmarks/inference_host_cost.py [--iters N] [--batch B] [--clock real|virtual]

`--clock virtual` runs on the virtual clock with the measured host: the host
time printed is then what the clock charged as host work (the thread's CPU
time less the emulator's own bookkeeping), not the wall time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torchvision

import torch_emugpu
from torch_emugpu import _C


def wall() -> float:
    """The host's own clock: under the virtual clock, time.perf_counter reads emulated time."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def host_seconds(fn: Callable[[], object]) -> float:
    """Seconds of host work `fn` costs: wall time less waits (real clock), or the host work charged (virtual)."""
    torch.emugpu.synchronize()
    _C._reset_engine_stats(0)
    virtual = torch_emugpu.config().clock == "virtual"
    if virtual:
        _C._clock_reset_stats()
        fn()
        return _C._clock_stats()["host_s"]
    t0 = wall()
    fn()
    return wall() - t0 - _C._engine_stats(0)["host_blocked_ns"] / 1e9


def forward_samples(model: torch.nn.Module, x: torch.Tensor, iters: int) -> tuple[list[float], list[float]]:
    """Host seconds of each float32 and each bf16-autocast forward, alternated so that both see the same load."""

    def forward(autocast: bool) -> None:
        with torch.no_grad(), torch.autocast("emugpu", dtype=torch.bfloat16, enabled=autocast):
            model(x)

    forward(False)  # shapes and costs into the shape cache
    forward(True)
    fp32, bf16 = [], []
    for _ in range(iters):
        fp32.append(host_seconds(lambda: forward(False)))
        bf16.append(host_seconds(lambda: forward(True)))
    return fp32, bf16


def cast_case() -> None:
    real = torch.randn(2_400_000).to("emugpu")
    placeholder = torch.empty(2_400_000, device="emugpu")
    times = {}
    for name, w in (("real", real), ("placeholder", placeholder)):
        w.to(torch.bfloat16)
        times[name] = statistics.median(host_seconds(lambda w=w: w.to(torch.bfloat16)) for _ in range(20))
    print(
        f"w.to(bfloat16), 2.4M elements: real / placeholder = {times['real'] / times['placeholder']:5.2f}x   "
        f"(real {times['real'] * 1e3:7.3f} ms, placeholder {times['placeholder'] * 1e3:7.3f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=10, help="measured forwards per case (default 10)")
    parser.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    parser.add_argument(
        "--clock", choices=("real", "virtual"), default="real", help="the emulated device's clock (default real)"
    )
    args = parser.parse_args()
    torch_emugpu.configure(gpu="h100", clock=args.clock, host="measured")
    print(f"torch {torch.__version__}, emulated {torch.emugpu.get_device_name()}, timing mode, {args.clock} clock")
    torch.manual_seed(0)
    model = torchvision.models.resnet152().eval().to("emugpu")  # real weights: initialised on the CPU
    x = torch.randn(args.batch, 3, 224, 224).to("emugpu")
    fp32, bf16 = forward_samples(model, x, args.iters)
    print("iteration  fp32 ms  bf16-autocast ms")
    for i, (a, b) in enumerate(zip(fp32, bf16, strict=True)):
        print(f"{i:9d}  {a * 1e3:7.2f}  {b * 1e3:16.2f}")
    third = max(1, args.iters // 3)
    ratio = statistics.median(bf16) / statistics.median(fp32)
    growth = statistics.median(bf16[-third:]) / statistics.median(bf16[:third])
    copies = _C._deferred_copy_stats()
    print(
        f"resnet152 batch {args.batch} no_grad forward: bf16-autocast / fp32 host time = {ratio:5.2f}x "
        f"(target <= 1.5x; medians bf16 {statistics.median(bf16) * 1e3:.2f} ms, "
        f"fp32 {statistics.median(fp32) * 1e3:.2f} ms); "
        f"bf16 last / first third of iterations = {growth:5.2f}x; copies of real bytes deferred {copies['recorded']}, "
        f"done {copies['done']}"
    )
    cast_case()


if __name__ == "__main__":
    main()
