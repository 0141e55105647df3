"""Fidelity of profile-driven emulation against GPEmu's published measurements.

Imports ../shared/reference/gpemu-profiled-data (or --reference) into a
temporary profile directory, then, for every (GPU, model) pair and batch
sizes 1, 16, 32, 64, 128, 256, trains the torchvision model on emugpu
(forward + loss + backward + SGD step, inputs resident on the device) and
compares the measured wall time per iteration with the profile's
forward + backward. Phases:

  time      profile-driven: median and p95 error (targets 1% and 3%),
            plus interpolated batch sizes against the neighbours' interpolation
  memory    max_memory_allocated in an iteration vs the reference peak, memory
            allocated between iterations vs persistent (one GPU, batch 32 and 128)
  roofline  no profiles: the cost model's iteration time (the compute
            engine's busy time) vs the reference, printed apart for the
            configurations the reference measured host-bound (within 25% of
            batch 1's time: its host's Python and launch overhead, not the
            GPU), and all of them as run here (wall time) with the reference
            host emulated: EMUGPU_HOST_OP_US set to the time per forward op
            of GPEmu's machines (REFERENCE_HOST_OP_US, fitted by
            fit_cost_model.py --host-pace: one number per reference host)
  shapes    loop shapes (issue 6): no per-iteration sync timed with events,
            per-iteration sync, loss.item() only, gradient accumulation,
            evaluation forwards between steps, two models in one loop; per
            shape, median and worst error of each iteration from the second on
            against the profile (targets 0.5% and 1%); iterations the host
            launched too late for (region_report's host_bound) are counted
            apart, since by contract they may take longer

Workers run in parallel processes (emulation mostly sleeps).

    python benchmarks/fidelity.py [--phases time,memory,roofline] [--workers 4] [--gpus ...] [--models ...]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BATCHES = (1, 16, 32, 64, 128, 256)
INTERPOLATED = (24, 48, 96, 192)
HOST_BOUND = 0.25
# GPEmu's machines' host time per op launched from Python (EMUGPU_HOST_OP_US), fitted to
# its published per-batch times by `benchmarks/fit_cost_model.py --host-pace` (forward ops
# paced, autograd's backward at the GPU's time): a property of each reference *host*.
REFERENCE_HOST_OP_US = {"Tesla_K80": 105, "Tesla_M40": 117, "Tesla_P100-PCIE-16GB": 53, "Tesla_V100-PCIE-32GB": 68}


def read_csv(path: Path) -> dict[int, list[float]]:
    rows = {}
    for line in path.read_text().splitlines()[1:]:
        parts = line.split(",")
        rows[int(float(parts[0]))] = [float(x) for x in parts[1:]]
    return rows


def reference_time(ref: Path, gpu: str, model: str, bs: int) -> float | None:
    root = ref / "time" / "compute"
    f = read_csv(root / "forward" / gpu / model / "time_by_batch_size.csv")
    b = read_csv(root / "backward" / gpu / model / "time_by_batch_size.csv")
    return f[bs][0] + b[bs][0] if bs in f and bs in b else None


def worker(task: tuple[str, str, str, list[int], str | None, int, int]) -> list[dict]:
    phase, gpu, model, batches, profile_dir, warmup, iterations, host_op_us = task
    os.environ["EMUGPU_HOST_OP_US"] = str(host_op_us)
    if profile_dir:
        os.environ["EMUGPU_PROFILE_PATH"] = profile_dir
    else:
        os.environ["EMUGPU_PROFILE_PATH"] = ""
        os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp()  # no user profiles either
    import torch

    import torch_emugpu
    from torch_emugpu import _C
    from torch_emugpu.measure.models import image_size, torchvision_model

    torch_emugpu.configure(gpu=gpu.replace("_", " "))
    if not profile_dir:
        torch_emugpu.timing.profiles.reload()
    net = torchvision_model(model).to("emugpu")
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    size = image_size(model)
    out = []
    for bs in sorted(batches):
        times, busy = [], []
        try:
            x = torch.empty(bs, 3, size, size, device="emugpu")
            y = torch.zeros(bs, dtype=torch.long, device="emugpu")
            torch.emugpu.synchronize()
            torch.emugpu.reset_peak_memory_stats()
            for i in range(warmup + iterations):
                torch.emugpu.synchronize()
                _C._reset_engine_stats(0)
                t0 = time.perf_counter()
                loss = torch.nn.functional.cross_entropy(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                del loss
                torch.emugpu.synchronize()
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
                    busy.append(_C._engine_stats(0)["compute"][1] / 1e9)
        except torch.OutOfMemoryError:
            # Larger batches do not fit either.
            out.extend({"gpu": gpu, "model": model, "bs": b, "oom": True} for b in batches if b >= bs)
            break
        row = {
            "gpu": gpu,
            "model": model,
            "bs": bs,
            "wall": statistics.median(times),
            "busy": statistics.median(busy),
            "peak": torch.emugpu.max_memory_allocated(),
            "persistent": torch.emugpu.memory_allocated(),
        }
        if phase != "roofline":
            entry = torch_emugpu.timing.profiles.lookup(model, bs)
            row["profile"] = entry["forward_s"] + entry["backward_s"] if entry else None
            row["kind"] = entry["kind"] if entry else None
        out.append(row)
        del x, y
        opt.zero_grad(set_to_none=True)
    return out


SHAPE_BATCH = 32
SHAPES = ("events", "synchronize", "item", "accumulate3", "eval-between", "two-models")


def shapes_worker(task: tuple[str, str, str, str, int]) -> list[dict]:
    """Per-iteration emulated (events) or wall (sync loops) time of each loop shape."""
    gpu, model, partner, profile_dir, iterations = task
    os.environ["EMUGPU_PROFILE_PATH"] = profile_dir
    import torch

    import torch_emugpu
    from torch_emugpu.measure.models import torchvision_model

    torch_emugpu.configure(gpu=gpu.replace("_", " "))

    def build(name: str):  # noqa: ANN202
        net = torchvision_model(name).to("emugpu")
        torch_emugpu.use_profile(net, name)
        return net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    def profiled(name: str) -> float:
        e = torch_emugpu.timing.profiles.lookup(name, SHAPE_BATCH)
        return e["forward_s"] + e["backward_s"]

    def fwd(name: str) -> float:
        return torch_emugpu.timing.profiles.lookup(name, SHAPE_BATCH)["forward_s"]

    x = torch.empty(SHAPE_BATCH, 3, 224, 224, device="emugpu")
    y = torch.zeros(SHAPE_BATCH, dtype=torch.long, device="emugpu")
    out: list[dict] = []
    try:
        net, opt = build(model)
        other, opt2 = build(partner)
    except torch.OutOfMemoryError:
        return out

    def step(n, o) -> torch.Tensor:  # noqa: ANN001
        loss = torch.nn.functional.cross_entropy(n(x), y)
        o.zero_grad()
        loss.backward()
        o.step()
        return loss

    def evaluate_then_step() -> None:
        with torch.no_grad():
            net(x)
        step(net, opt)

    def accumulate() -> None:
        opt.zero_grad()
        for _ in range(3):
            torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    event_shapes = {
        "events": (lambda: step(net, opt), profiled(model)),
        "accumulate3": (accumulate, 3 * profiled(model)),
        "eval-between": (evaluate_then_step, fwd(model) + profiled(model)),
        "two-models": (lambda: (step(net, opt), step(other, opt2)), profiled(model) + profiled(partner)),
    }

    def host_bound() -> int:
        # Occurrences the host launched too late for (region_report's
        # 'host_bound'): those may take longer than their profile, by contract.
        return sum(r.get("host_bound", 0) for r in torch_emugpu.region_report())

    try:
        for shape, (body, expected) in event_shapes.items():
            events = []
            for _ in range(iterations + 1):  # no sync anywhere: events only
                start, end = torch.emugpu.Event(enable_timing=True), torch.emugpu.Event(enable_timing=True)
                before = host_bound()
                start.record()
                body()
                end.record()
                events.append((start, end, host_bound() > before))
            torch.emugpu.synchronize()
            for start, end, late in events[1:]:
                out.append(
                    {
                        "shape": shape,
                        "gpu": gpu,
                        "model": model,
                        "host_bound": late,
                        "error": start.elapsed_time(end) / 1e3 / expected - 1,
                    }
                )
        for shape, wait in (
            ("synchronize", lambda loss: torch.emugpu.synchronize()),
            ("item", lambda loss: loss.item()),
        ):
            wait(step(net, opt))
            for _ in range(iterations):
                before = host_bound()
                t0 = time.perf_counter()
                wait(step(net, opt))
                elapsed = time.perf_counter() - t0
                out.append(
                    {
                        "shape": shape,
                        "gpu": gpu,
                        "model": model,
                        "host_bound": host_bound() > before,
                        "error": elapsed / profiled(model) - 1,
                    }
                )
    except torch.OutOfMemoryError:
        pass
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", default=str(REPO.parent / "shared" / "reference" / "gpemu-profiled-data"))
    parser.add_argument("--phases", default="time,memory,roofline")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--gpus", default=None, help="comma-separated GPU directory names (default: all)")
    parser.add_argument("--models", default=None, help="comma-separated models (default: all)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument(
        "--host-op-us",
        default=None,
        metavar="GPU=US,...",
        help="the reference hosts' time per op for the roofline phase (default: "
        "REFERENCE_HOST_OP_US; 'none': this host's own pace)",
    )
    args = parser.parse_args()
    ref = Path(args.reference)
    if not (ref / "time" / "compute" / "forward").is_dir():
        raise SystemExit(f"no GPEmu reference data at {ref}")
    from tqdm import tqdm

    from torch_emugpu.measure.importers import import_gpemu

    profile_dir = tempfile.mkdtemp(prefix="emugpu-fidelity-")
    import_gpemu(ref, profile_dir, progress=False)
    gpus = args.gpus.split(",") if args.gpus else sorted(p.name for p in (ref / "time/compute/forward").iterdir())
    models = (
        args.models.split(",")
        if args.models
        else sorted(p.name for p in (ref / "time/compute/forward" / gpus[0]).iterdir())
    )
    phases = args.phases.split(",")
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.workers, maxtasksperchild=1) as pool:
        if "time" in phases:
            tasks = [
                ("time", g, m, [*BATCHES, *INTERPOLATED], profile_dir, args.warmup, args.iterations, 0)
                for g in gpus
                for m in models
            ]
            rows = [r for rs in tqdm(pool.imap_unordered(worker, tasks), total=len(tasks), desc="time") for r in rs]
            exact = [abs(r["wall"] / r["profile"] - 1) for r in rows if not r.get("oom") and r["bs"] in BATCHES]
            inter = [abs(r["wall"] / r["profile"] - 1) for r in rows if not r.get("oom") and r["bs"] in INTERPOLATED]
            ooms = sum(1 for r in rows if r.get("oom"))
            print(
                f"time (profiles): {len(exact)} configs, median error {statistics.median(exact):.3%}, "
                f"p95 {pct(exact, 0.95):.3%}, max {max(exact):.3%}; {ooms} did not fit in memory"
            )
            print(
                f"time (interpolated batch sizes {INTERPOLATED}): {len(inter)} configs, median error "
                f"{statistics.median(inter):.3%}, p95 {pct(inter, 0.95):.3%}"
            )
            worst = sorted((r for r in rows if not r.get("oom")), key=lambda r: -abs(r["wall"] / r["profile"] - 1))[:5]
            for r in worst:
                print(
                    f"   worst: {r['gpu']} {r['model']} bs {r['bs']}: wall {r['wall'] * 1e3:.2f} ms vs "
                    f"profile {r['profile'] * 1e3:.2f} ms (emulated busy {r['busy'] * 1e3:.2f} ms)"
                )
        if "memory" in phases:
            gpu = "Tesla_V100-PCIE-32GB" if "Tesla_V100-PCIE-32GB" in gpus else gpus[0]
            tasks = [("memory", gpu, m, [32, 128], profile_dir, 1, 1, 0) for m in models]
            rows = [
                r
                for rs in tqdm(pool.imap_unordered(worker, tasks), total=len(tasks), desc="memory")
                for r in rs
                if not r.get("oom")
            ]
            peak_err, pers_err = [], []
            for r in rows:
                mem = read_csv(ref / "memory" / gpu / r["model"] / "memory.csv").get(r["bs"])
                if not mem:
                    continue
                peak_err.append(abs(r["peak"] / (mem[0] * 2**20) - 1))
                pers_err.append(abs(r["persistent"] / (mem[1] * 2**20) - 1))
            print(
                f"memory on {gpu} (batch 32, 128): {len(peak_err)} configs; peak: median error "
                f"{statistics.median(peak_err):.2%}, p95 {pct(peak_err, 0.95):.2%}; persistent: median "
                f"{statistics.median(pers_err):.2%}, p95 {pct(pers_err, 0.95):.2%}"
            )
        if "shapes" in phases:
            shape_gpus = [g for g in ("Tesla_V100-PCIE-32GB", "Tesla_P100-PCIE-16GB") if g in gpus] or gpus[:1]
            shape_models = [
                m for m in ("mobilenet_v2", "resnet50", "densenet121", "vgg16", "squeezenet1_1") if m in models
            ] or models[:4]
            tasks = [
                (g, m, shape_models[(i + 1) % len(shape_models)], profile_dir, args.iterations + 2)
                for g in shape_gpus
                for i, m in enumerate(shape_models)
            ]
            rows = [
                r for rs in tqdm(pool.imap_unordered(shapes_worker, tasks), total=len(tasks), desc="shapes") for r in rs
            ]
            print(
                f"loop shapes at batch {SHAPE_BATCH} on {', '.join(shape_gpus)} ({', '.join(shape_models)}), "
                "each iteration from the second on:"
            )
            for shape in SHAPES:
                every = [r for r in rows if r["shape"] == shape]
                mine = [r for r in every if not r["host_bound"]]
                late = len(every) - len(mine)
                if mine:
                    errs = [abs(r["error"]) for r in mine]
                    worst = max(mine, key=lambda r: abs(r["error"]))
                    print(
                        f"   {shape:13s} {len(errs):3d} iterations: median error {statistics.median(errs):.3%}, "
                        f"worst {max(errs):.3%} ({worst['gpu']} {worst['model']}); {late} host-bound "
                        f"(reported, excluded; all: worst {max(abs(r['error']) for r in every):.3%})"
                    )
        if "roofline" in phases:
            if args.host_op_us == "none":
                host_op_us = {}
            elif args.host_op_us:
                host_op_us = {k: float(v) for k, _, v in (item.partition("=") for item in args.host_op_us.split(","))}
            else:
                host_op_us = REFERENCE_HOST_OP_US
            tasks = [("roofline", g, m, list(BATCHES), None, 1, 1, host_op_us.get(g, 0)) for g in gpus for m in models]
            rows = [
                r
                for rs in tqdm(pool.imap_unordered(worker, tasks), total=len(tasks), desc="roofline")
                for r in rs
                if not r.get("oom")
            ]
            for g in gpus:
                device, host, wall, host_wall = [], [], [], []
                for r in rows:
                    if r["gpu"] != g:
                        continue
                    t = reference_time(ref, g, r["model"], r["bs"])
                    t1 = reference_time(ref, g, r["model"], 1)
                    if t and t1:
                        # Within HOST_BOUND of batch 1's time: the reference measured its host's
                        # Python and launch overhead there, which an emulator takes from its own host.
                        host_bound = t < t1 * (1 + HOST_BOUND)
                        (host if host_bound else device).append(r["busy"] / t - 1)
                        wall.append(r["wall"] / t - 1)
                        if host_bound:
                            host_wall.append(r["wall"] / t - 1)
                pace = f"EMUGPU_HOST_OP_US={host_op_us.get(g, 0):g}"
                for label, errs in (
                    ("device-bound", device),
                    ("host-bound in the reference", host),
                    ("all", device + host),
                    (f"host-bound in the reference, as run here with {pace} (wall time)", host_wall),
                    (f"all, as run here with {pace} (wall time)", wall),
                ):
                    if errs:
                        mag = [abs(e) for e in errs]
                        print(
                            f"cost model only, {g}, {label}: {len(errs)} configs, median |error| "
                            f"{statistics.median(mag):.1%}, p95 {pct(mag, 0.95):.1%}, median signed "
                            f"{statistics.median(errs):+.1%}"
                        )


if __name__ == "__main__":
    main()
