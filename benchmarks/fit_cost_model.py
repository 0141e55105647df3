"""The per-op cost model (no profiles) against GPEmu's published per-iteration
times, and the fit of its per-architecture kernel parameters.

Step 1 traces, once, every op one training iteration of each torchvision
model runs at batch 1, 16, 32, 64, 128 and 256 (forward; then loss,
zero_grad, backward and an SGD step with momentum 0.9 and weight decay 1e-4,
as GPEmu measured): the family, shapes, FLOPs and bytes the cost model sees.
Traces do not depend on the GPU; they are cached (--cache).

Step 2 times each trace with the core's cost model on each reference GPU
(`_C._kernel_times`: the same code the emulator charges with) and prints
median, p95 and median signed error of forward + backward per GPU, for the
architecture table's parameters or, with --fit, for parameters fitted to
that GPU's data by the core's fit (the one calibration files get:
coordinate descent over the names in --params minimising the mean absolute
log error). The fitted rows are what
csrc/core/kernel_params.cpp cites; the data stays in ../shared/reference.

Configurations the reference measured host-bound (forward + backward within
--host-bound of batch 1's) are reported apart: there the time is the
reference machine's Python and launch overhead, which an emulator reproduces
from its own host, not from the cost model.

With --host-pace it also fits, per reference GPU, the host time per op
(EMUGPU_HOST_OP_US) that GPEmu's machine spent on Python, PyTorch and the
driver: the one parameter of the reference *host* that the host-bound
configurations measure (benchmarks/fidelity.py emulates it).

    python benchmarks/fit_cost_model.py [--gpus ...] [--fit] [--params simt_efficiency,...] [--host-pace]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BATCHES = (1, 16, 32, 64, 128, 256)
TRACE_GPU = "NVIDIA H200"  # the largest memory in the catalog: every batch size fits


def trace_model(model: str, batches: tuple[int, ...]) -> dict[str, list[list[dict]]]:
    """{batch: [forward ops, backward + step ops]} of the second training iteration."""
    os.environ["EMUGPU_PROFILE_PATH"] = ""
    os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp()
    import torch

    import torch_emugpu
    from torch_emugpu import _C
    from torch_emugpu.measure.models import image_size, torchvision_model

    torch_emugpu.configure(gpu=TRACE_GPU)
    torch_emugpu.timing.profiles.reload()
    net = torchvision_model(model).to("emugpu")
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    size = image_size(model)
    out: dict[str, list[list[dict]]] = {}
    for bs in batches:
        x = torch.empty(bs, 3, size, size, device="emugpu")
        y = torch.zeros(bs, dtype=torch.long, device="emugpu")
        for i in range(2):
            if i == 1:
                _C._cost_trace_start(0, 1 << 20)
            logits = net(x)
            if i == 1:
                forward = _C._cost_trace(0)
                _C._cost_trace_start(0, 1 << 20)
            loss = torch.nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            del loss, logits
        out[str(bs)] = [forward, _C._cost_trace(0)]
        torch.emugpu.synchronize()
        del x, y
    return out


def _trace_worker(args: tuple[str, tuple[int, ...]]) -> tuple[str, dict]:
    model, batches = args
    return model, trace_model(model, batches)


def read_csv(path: Path) -> dict[int, float]:
    rows = {}
    for line in path.read_text().splitlines()[1:]:
        parts = line.split(",")
        rows[int(float(parts[0]))] = float(parts[1])
    return rows


def reference(ref: Path, gpu: str, model: str) -> dict[int, tuple[float, float]]:
    root = ref / "time" / "compute"
    try:
        f = read_csv(root / "forward" / gpu / model / "time_by_batch_size.csv")
        b = read_csv(root / "backward" / gpu / model / "time_by_batch_size.csv")
    except FileNotFoundError:
        return {}
    return {bs: (f[bs], b[bs]) for bs in f if bs in b}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


class Evaluator:
    """Predicted forward + backward seconds of every (model, batch) on one GPU."""

    def __init__(self, gpu: str, traces: dict, refs: dict, host_bound: float) -> None:
        from torch_emugpu import _C

        self._C = _C
        self.gpu = gpu.replace("_", " ")
        self.cases = []  # (model, bs, [ops], reference seconds, host-bound?, forward op count)
        for model, by_bs in traces.items():
            ref = refs.get(model, {})
            if 1 not in ref:
                continue
            base = sum(ref[1])
            for bs, (fwd, bwd) in by_bs.items():
                if int(bs) not in ref:
                    continue
                seconds = sum(ref[int(bs)])
                self.cases.append((model, int(bs), fwd + bwd, seconds, seconds < base * (1 + host_bound), len(fwd)))
        # One call per evaluation: all ops of all cases, cut back apart after.
        self.ops = [op for c in self.cases for op in c[2]]
        self.bounds = []
        start = 0
        for c in self.cases:
            self.bounds.append((start, start + len(c[2])))
            start += len(c[2])

    def errors(self, params: dict[str, float], host_op_s: float = 0) -> list[tuple[str, int, float, bool]]:
        """Per config: (model, batch, predicted / reference - 1, host-bound?). With `host_op_s`, the
        forward takes at least that much host time per op (EMUGPU_HOST_OP_US paces the ops Python
        launches; autograd's backward keeps the host's own pace)."""
        times = self._C._kernel_times(self.gpu, params, self.ops)
        out = []
        for (model, bs, _ops, seconds, hb, forward_ops), (a, b) in zip(self.cases, self.bounds, strict=True):
            forward = max(sum(times[a : a + forward_ops]) * 1e-9, forward_ops * host_op_s)
            predicted = forward + sum(times[a + forward_ops : b]) * 1e-9
            out.append((model, bs, predicted / seconds - 1, hb))
        return out


def summary(errs: list[tuple[str, int, float, bool]]) -> str:
    def line(rows: list[float]) -> str:
        if not rows:
            return "none"
        mag = [abs(e) for e in rows]
        return (
            f"{len(rows)} configs: median |error| {statistics.median(mag):.1%}, p95 {pct(mag, 0.95):.1%}, "
            f"median signed {statistics.median(rows):+.1%}"
        )

    device = [e for _m, _b, e, hb in errs if not hb]
    host = [e for _m, _b, e, hb in errs if hb]
    return (
        f"device-bound {line(device)}\n      host-bound in the reference {line(host)}\n      all {line(device + host)}"
    )


def fit(ev: Evaluator, start: dict[str, float], names: list[str]) -> dict[str, float]:
    """The core's fit (the one calibration files get) over the device-bound configs."""
    cases = [(ops, seconds) for (_m, _b, ops, seconds, hb, _f) in ev.cases if not hb]
    fitted = ev._C._fit_kernel_params(ev.gpu, start, cases, names)
    fitted.pop("source")
    return fitted


def fit_host_pace(ev: Evaluator, params: dict[str, float]) -> float:
    """The reference host's seconds per op (EMUGPU_HOST_OP_US) minimising the mean |log error| over all
    configs: a golden-section search over 1 us .. 1 ms on a log scale."""

    def loss(log_s: float) -> float:
        errs = ev.errors(params, math.exp(log_s))
        return statistics.fmean(abs(math.log1p(e)) for _m, _b, e, _hb in errs)

    a, b = math.log(1e-6), math.log(1e-3)
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(40):
        c, d = b - golden * (b - a), a + golden * (b - a)
        if loss(c) < loss(d):
            b = d
        else:
            a = c
    return math.exp((a + b) / 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", default=str(REPO.parent / "shared" / "reference" / "gpemu-profiled-data"))
    parser.add_argument(
        "--cache",
        default=str(Path(tempfile.gettempdir()) / "emugpu-cost-traces.json"),
        help="traces of the models' iterations (GPU-independent), made once",
    )
    parser.add_argument("--gpus", default=None, help="comma-separated GPU directory names (default: all)")
    parser.add_argument("--models", default=None, help="comma-separated models (default: all)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--host-bound",
        type=float,
        default=0.25,
        help="a config within this fraction of batch 1's time counts as host-bound",
    )
    parser.add_argument("--fit", action="store_true", help="fit the parameters per GPU")
    parser.add_argument(
        "--params",
        default="simt_efficiency,memory_efficiency,batch_norm_efficiency,"
        "batch_norm_channels_per_sm,winograd_gain,launch_ns,depthwise_efficiency,gemm_k_half",
        help="the parameters to fit (the others keep the table's values)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="evaluate with this value instead of the table's (repeatable)",
    )
    parser.add_argument(
        "--row-from",
        default=None,
        metavar="GPU",
        help="evaluate with this catalog GPU's table row (how a row carries to another GPU)",
    )
    parser.add_argument(
        "--host-pace",
        action="store_true",
        help="also fit the reference host's time per op (EMUGPU_HOST_OP_US) over all configs",
    )
    parser.add_argument("--worst", type=int, default=8, help="print the worst configs")
    args = parser.parse_args()
    ref = Path(args.reference)
    if not (ref / "time" / "compute" / "forward").is_dir():
        raise SystemExit(f"no GPEmu reference data at {ref}")
    gpus = args.gpus.split(",") if args.gpus else sorted(p.name for p in (ref / "time/compute/forward").iterdir())
    models = (
        args.models.split(",")
        if args.models
        else sorted(p.name for p in (ref / "time/compute/forward" / gpus[0]).iterdir())
    )
    cache = Path(args.cache)
    traces: dict = json.loads(cache.read_text()) if cache.exists() else {}
    missing = [m for m in models if m not in traces]
    if missing:
        import multiprocessing as mp

        from tqdm import tqdm

        with mp.get_context("spawn").Pool(args.workers, maxtasksperchild=1) as pool:
            for model, t in tqdm(
                pool.imap_unordered(_trace_worker, [(m, BATCHES) for m in missing]),
                total=len(missing),
                desc="tracing",
                file=sys.stderr,
            ):
                traces[model] = t
                cache.write_text(json.dumps(traces))
    traces = {m: traces[m] for m in models}
    from torch_emugpu import _C

    overrides = {k: float(v) for k, _, v in (item.partition("=") for item in args.set)}
    for gpu in gpus:
        refs = {m: reference(ref, gpu, m) for m in models}
        ev = Evaluator(gpu, traces, refs, args.host_bound)
        row_gpu = args.row_from or gpu.replace("_", " ")
        table = {k: v for k, v in _C._kernel_params(row_gpu).items() if k != "source"}
        table.update(overrides)
        errs = ev.errors(table)
        print(f"{gpu} ({_C._kernel_params(row_gpu)['source']}):\n      {summary(errs)}")
        if args.fit:
            fitted = fit(ev, table, args.params.split(","))
            errs = ev.errors(fitted)
            print("   fitted: " + ", ".join(f"{k}={v:.4g}" for k, v in fitted.items()))
            print(f"      {summary(errs)}")
        if args.host_pace:
            params = fitted if args.fit else table
            pace = fit_host_pace(ev, params)
            errs = ev.errors(params, pace)
            print(f"   with the reference host's pace, EMUGPU_HOST_OP_US={pace * 1e6:.0f}:\n      {summary(errs)}")
        for model, bs, e, hb in sorted(errs, key=lambda r: -abs(r[2]))[: args.worst]:
            print(f"   worst: {model} bs {bs}: {e:+.1%}{' (host-bound)' if hb else ''}")


if __name__ == "__main__":
    main()
