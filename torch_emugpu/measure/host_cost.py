"""Measures the host's cost per launched op: how long this machine's CPU takes
to launch one op on `device` when the device is far ahead (host-bound), in
five settings a training loop has:

- `python_op_us`: a Python loop of `torch.add(a, b, out=c)` on 16-element
  tensors, per call;
- `view_op_us`: a Python loop of the views a transformer's forward takes
  (`t`, `view`, `transpose`, `select`) of a 16x16 tensor, per view: host
  work without a kernel or an allocation;
- `module_op_us`: the forward of a small `nn.Sequential` (Linear, ReLU,
  LayerNorm, three times) on a batch of 8, grad enabled as in training, per
  aten op it dispatches (`module_ops`: counted once with a TorchDispatchMode,
  which sees the ops below autograd, as a device's backend gets them; views
  such as the Linear's `t` count too: they cost host time, though no kernel);
- `autograd_op_us`: `torch.autograd.grad` through a chain of 200 tiny
  elementwise ops (tanh and a multiply by a scalar, alternately), per aten op
  the backward dispatches (`autograd_ops`, counted the same way): the
  engine's C++ path, no Python;
- `optimizer_param_us`: one `AdamW(foreach=True)` step over 100 tiny
  parameters, per parameter.

Each figure is the robust median (outliers beyond 3 MAD dropped) of
`repeats` timed loops; the device is synchronised before and after each loop
only, so the device runs behind the host, and a loop's time is the host's time
until its last launch returned (the final synchronisation is not counted). A
loop lasts about `seconds_per_probe / repeats`, long enough on a GPU that the
synchronisations do not matter. Should the device fall behind nevertheless
(the launch queue full, so launches wait for kernels), the probe is named in
`device_bound` and a warning says so: its figure is then the device's
throughput, an upper bound of the host's cost. A probe that raises a
RuntimeError on this setup gives null, its error in `failed`, and a warning;
the other figures stand.

The host is recorded beside the figures: `cpu` (the model name in
/proc/cpuinfo), `cores`, `torch` and `python` versions. Runs with plain
PyTorch, without the compiled extension (`benchmarks/measure_on_gpu.sh`):

    python -m torch_emugpu.measure.host_cost --device cuda --out host_cost.json
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torch_emugpu.measure.common import robust_median, write_json_atomic

# Five probes: about 7.5 s, plus start-up. On an H100 host (16-core VM) the command took about 4 s to
# import torch and start CUDA and 12 s to measure at 2 s per probe (8 s on a second call in one process).
DEFAULT_SECONDS_PER_PROBE = 1.5
DEFAULT_REPEATS = 5
FIGURES = ("python_op_us", "view_op_us", "module_op_us", "autograd_op_us", "optimizer_param_us")
PYTHON_OPS_PER_STEP = 100
VIEW_OPS_PER_STEP = 100  # 25 rounds of four views
CHAIN_LENGTH = 200
OPTIMIZER_PARAMS = 100
WARMUP_STEPS = 3
# A launch queue that has filled leaves this much queued work at the end of a
# loop (about a thousand kernels); a host-bound loop leaves about one kernel.
DEVICE_BOUND_TAIL_S = 0.5e-3


class _OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while it is active, less `detach`: with a Python mode active,
    autograd detaches the tensors it saves for backward, which it does not do without one."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if func is not torch.ops.aten.detach.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> int:
    """The aten ops one call of `fn` dispatches (at least one: RuntimeError otherwise)."""
    with _OpCounter() as counter:
        fn()
    if counter.count < 1:
        raise RuntimeError(
            "host cost: expected the probe to dispatch aten ops, counted none; this torch's "
            "TorchDispatchMode does not see them, so no per-op figure can be given"
        )
    return counter.count


@dataclass
class _Probe:
    step: Callable[[], float]  # runs one step; returns the seconds of its timed part
    units: int  # ops (or parameters) one step's timed part launches
    # The untimed part a step runs first (the autograd probe's forward), for tools that count the timed part alone.
    untimed: Callable[[], object] | None = None


def _timed(fn: Callable[[], object]) -> Callable[[], float]:
    def step() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return step


def _python_probe(device: torch.device) -> _Probe:
    a, b, c = (torch.randn(16, device=device) for _ in range(3))

    def launch() -> None:
        for _ in range(PYTHON_OPS_PER_STEP):
            torch.add(a, b, out=c)

    return _Probe(_timed(launch), PYTHON_OPS_PER_STEP)


def _view_probe(device: torch.device) -> _Probe:
    x = torch.randn(16, 16, device=device)

    def launch() -> None:
        for _ in range(VIEW_OPS_PER_STEP // 4):
            x.t()
            x.view(256)
            x.transpose(0, 1)
            x.select(0, 1)

    return _Probe(_timed(launch), VIEW_OPS_PER_STEP)


def _module_probe(device: torch.device) -> _Probe:
    width = 32
    layers: list[torch.nn.Module] = []
    for _ in range(3):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.LayerNorm(width)]
    model = torch.nn.Sequential(*layers).to(device).train()
    x = torch.randn(8, width, device=device)
    return _Probe(_timed(lambda: model(x)), count_ops(lambda: model(x)))


def _autograd_probe(device: torch.device) -> _Probe:
    x = torch.randn(16, device=device, requires_grad=True)
    seed = torch.ones(16, device=device)

    def chain() -> torch.Tensor:
        y = x
        for i in range(CHAIN_LENGTH):
            y = torch.tanh(y) if i % 2 == 0 else y * 0.5
        return y

    def step() -> float:
        y = chain()  # the forward is not timed
        t0 = time.perf_counter()
        torch.autograd.grad(y, x, grad_outputs=seed)
        return time.perf_counter() - t0

    y = chain()
    ops = count_ops(lambda: torch.autograd.grad(y, x, grad_outputs=seed))
    return _Probe(step, ops, untimed=chain)


def _optimizer_probe(device: torch.device) -> _Probe:
    params = [torch.nn.Parameter(torch.randn(16, device=device)) for _ in range(OPTIMIZER_PARAMS)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    return _Probe(_timed(opt.step), OPTIMIZER_PARAMS)


def probes() -> dict[str, Callable[[torch.device], _Probe]]:
    """Each figure's probe maker, in FIGURES' order (looked up at each call, so a test can replace one)."""
    return {
        "python_op_us": _python_probe,
        "view_op_us": _view_probe,
        "module_op_us": _module_probe,
        "autograd_op_us": _autograd_probe,
        "optimizer_param_us": _optimizer_probe,
    }


def _run_probe(probe: _Probe, sync: Callable[[], None], seconds: float, repeats: int) -> tuple[float, float]:
    """Microseconds per unit (robust median over `repeats` loops) and the median seconds the
    device still had queued when a loop's last launch returned."""
    for _ in range(WARMUP_STEPS):
        probe.step()
    sync()
    # Steps per loop, from a tenth of the budget (wall time: a step's untimed part takes time too).
    calibrate_until = time.perf_counter() + 0.1 * seconds
    t0, steps = time.perf_counter(), 0
    while steps == 0 or time.perf_counter() < calibrate_until:
        probe.step()
        steps += 1
    sync()
    per_step = (time.perf_counter() - t0) / steps
    n = max(1, round(0.9 * seconds / repeats / per_step))
    samples, tails = [], []
    for _ in range(repeats):
        sync()
        timed = 0.0
        for _ in range(n):
            timed += probe.step()
        t_launched = time.perf_counter()
        sync()
        tails.append(time.perf_counter() - t_launched)
        samples.append(timed / (n * probe.units) * 1e6)
    return robust_median(samples), robust_median(tails)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else what `platform` knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def measure_host_cost(
    device: torch.device | str,
    *,
    seconds_per_probe: float = DEFAULT_SECONDS_PER_PROBE,
    repeats: int = DEFAULT_REPEATS,
) -> dict[str, Any]:
    """The host's microseconds per launched op in five settings (see the module's docstring) and the host."""
    device = torch.device(device)
    if not seconds_per_probe > 0:
        raise ValueError(f"seconds_per_probe: expected a number of seconds > 0, got {seconds_per_probe!r}")
    if repeats < 1:
        raise ValueError(f"repeats: expected an integer >= 1, got {repeats!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda: no CUDA GPU is available on this machine; use --device cpu")
    cuda = device.type == "cuda"
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    result: dict[str, Any] = {}
    device_bound: list[str] = []
    failed: dict[str, str] = {}
    for key, make in probes().items():
        try:
            probe = make(device)
            us, tail = _run_probe(probe, sync, seconds_per_probe, repeats)
        except RuntimeError as e:  # one probe this setup cannot run must not cost the others (or a profile)
            result[key] = None
            failed[key] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:300]
            continue
        result[key] = round(us, 4)
        if key == "module_op_us":
            result["module_ops"] = probe.units
        elif key == "autograd_op_us":
            result["autograd_ops"] = probe.units
        if cuda and tail > DEVICE_BOUND_TAIL_S:
            device_bound.append(key)
    if failed:
        warnings.warn(
            f"host cost: could not measure {', '.join(failed)} on {device} ({'; '.join(failed.values())}); "
            "written as null, the other figures stand",
            stacklevel=2,
        )
    if device_bound:
        warnings.warn(
            f"host cost: the device fell behind the host in {', '.join(device_bound)} ({device}): expected "
            "tiny kernels to finish faster than the host launches them; those figures are the device's "
            "throughput, an upper bound of the host's cost. Measure on an idle GPU",
            stacklevel=2,
        )
    result.update(
        device_bound=device_bound,
        failed=failed,
        cpu=cpu_model(),
        cores=os.cpu_count(),
        torch=torch.__version__,
        python=platform.python_version(),
        aggregation=f"median of {repeats} loops (outliers beyond 3 MAD dropped), {seconds_per_probe:g} s per "
        f"probe, on {device.type}; host time until the last launch returned",
    )
    return result


def summary(host: dict[str, Any]) -> str:
    lines = [f"host: {host['cpu']}, {host['cores']} cores, torch {host['torch']}, Python {host['python']}"]
    ops = {"module_op_us": "module_ops", "autograd_op_us": "autograd_ops"}
    for key in FIGURES:
        if host[key] is None:
            lines.append(f"{key:20} {'-':>10}    ({host['failed'][key]})")
            continue
        count = f"  ({host[ops[key]]} ops)" if key in ops else ""
        lines.append(f"{key:20} {host[key]:10.3f} us{count}")
    if host["device_bound"]:
        lines.append(f"device-bound (upper bounds): {', '.join(host['device_bound'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m torch_emugpu.measure.host_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", default="auto", help="cuda, cuda:N or cpu (default: cuda if available, else cpu)")
    p.add_argument("--out", default=None, help="also write the figures to this JSON file")
    p.add_argument(
        "--seconds-per-probe",
        type=float,
        default=DEFAULT_SECONDS_PER_PROBE,
        help=f"time each of the five probes takes (default: {DEFAULT_SECONDS_PER_PROBE:g})",
    )
    args = p.parse_args(argv)
    spec = args.device
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    host = measure_host_cost(spec, seconds_per_probe=args.seconds_per_probe)
    print(summary(host))
    if args.out:
        write_json_atomic(Path(args.out), host)
        print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
