"""Host overhead per op in timing mode against PyTorch's meta device.

One training step (forward, loss, backward, optimizer step) of resnet50 and of
a GPT-2-size decoder runs on emugpu and on `meta` in the same process; after
warm-up, the host time per step (minus time spent waiting for the emulated
GPU) is divided by the meta step's. Target: at most 1.0x.

`--clock virtual` runs the emulated device on the virtual clock (modelled
host), where nothing sleeps: the wall time of a step is then all the host's,
the emulator's included, and is what a virtual-clock run costs.

Under the virtual clock the GPT-2 case also runs a floor, alternated step by
step with the emugpu step: the same model with every dimension shrunk (width
24, 64 words, 8 tokens) on PyTorch's own CPU backend, so that it runs the same
ops through the same Python (modules, autograd, AdamW's foreach steps) while
its kernels do next to nothing. emugpu/floor compares the emulator with what
PyTorch's most direct backend costs this host for the same step; below 1.0x
the emulator costs less per op than PyTorch's CPU dispatch and kernel set-up.

    python benchmarks/overhead.py [--steps N] [--clock real|virtual]
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
from torch_emugpu.measure.models import GPT, GPTConfig


def make_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, opt_name: str) -> Callable[[], None]:
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if opt_name == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=1e-4)
    )

    def step() -> None:
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def wall() -> float:
    """The host's own clock: under the virtual clock, time.perf_counter reads emulated time."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def measure(step: Callable[[], None], steps: int, emu: bool) -> tuple[float, int]:
    """Median host seconds per step (not counting waits for the emulated GPU), ops per step."""
    for _ in range(3):
        step()
    samples, ops = [], 0
    virtual = torch_emugpu.config().clock == "virtual"
    for _ in range(steps):
        if emu:
            torch.emugpu.synchronize()
            _C._reset_engine_stats(0)
        t0 = wall()
        step()
        host = wall() - t0
        if emu:
            stats = _C._engine_stats(0)
            if not virtual:  # waits sleep only on the real clock
                host -= stats["host_blocked_ns"] / 1e9
            ops = stats["compute"][0]
        samples.append(host)
    return statistics.median(samples), ops


Builder = Callable[[str], tuple[torch.nn.Module, torch.Tensor, torch.Tensor]]


def case(name: str, build: Builder, opt: str, steps: int, floor: Builder | None = None) -> None:
    results = {}
    for device in ("meta", "emugpu"):
        model, x, y = build(device)
        results[device] = measure(make_step(model, x, y, opt), steps, device == "emugpu")
        del model, x, y
    (meta_s, _), (emu_s, ops) = results["meta"], results["emugpu"]
    print(
        f"{name:10s} overhead ratio emugpu/meta = {emu_s / meta_s:5.3f}x   "
        f"(emugpu {emu_s * 1e3:7.2f} ms/step = {emu_s / ops * 1e6:5.2f} us/op over {ops} ops; "
        f"meta {meta_s * 1e3:7.2f} ms/step)"
    )
    if floor is not None:
        emu_step, floor_step = make_step(*build("emugpu"), opt), make_step(*floor("cpu"), opt)
        emu_s, floor_s = alternate(emu_step, floor_step, steps)
        print(
            f"{name:10s} floor ratio emugpu/floor = {emu_s / floor_s:5.3f}x   "
            f"(emugpu {emu_s * 1e3:7.2f} ms/step = {emu_s / ops * 1e6:5.2f} us/op; "
            f"floor {floor_s * 1e3:7.2f} ms/step = {floor_s / ops * 1e6:5.2f} us/op, alternated step by step)"
        )


def alternate(emu_step: Callable[[], None], floor_step: Callable[[], None], steps: int) -> tuple[float, float]:
    """Median host seconds per step of each, run in turn so that both see the same host."""
    for _ in range(3):
        emu_step()
        floor_step()
    emu, floor = [], []
    for _ in range(steps):
        torch.emugpu.synchronize()
        t0 = wall()
        emu_step()
        t1 = wall()
        floor_step()
        t2 = wall()
        emu.append(t1 - t0)
        floor.append(t2 - t1)
    return statistics.median(emu), statistics.median(floor)


def resnet50(device: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    model = torchvision.models.resnet50().to(device)
    return model, torch.empty(64, 3, 224, 224, device=device), torch.zeros(64, dtype=torch.long, device=device)


def gpt2(device: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    model = GPT().to(device)
    idx = torch.zeros(8, 1024, dtype=torch.long, device=device)
    return model, idx, idx


def gpt2_floor(device: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """GPT-2 124M's graph, ops and Python with every dimension shrunk."""
    model = GPT(GPTConfig(vocab_size=64, context=8, width=24)).to(device)
    idx = torch.zeros(1, 8, dtype=torch.long, device=device)
    return model, idx, idx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="measured steps per case (default 10)")
    parser.add_argument(
        "--clock", choices=("real", "virtual"), default="real", help="the emulated device's clock (default real)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # the floor's CPU kernels: one host thread, as a GPU host's launches
    torch_emugpu.configure(gpu="h100", clock=args.clock, host="modelled" if args.clock == "virtual" else "measured")
    print(f"torch {torch.__version__}, emulated {torch.emugpu.get_device_name()}, timing mode, {args.clock} clock")
    case("resnet50", resnet50, "sgd", args.steps)
    if args.clock == "real":
        case("gpt2-124M", gpt2, "adamw", args.steps)
    else:  # the floor's steps are wall time; only the virtual clock's are too
        case("gpt2-124M", gpt2, "adamw", args.steps, floor=gpt2_floor)


if __name__ == "__main__":
    main()
