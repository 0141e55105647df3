"""The DataStall pattern (Mohan et al., "Analyzing and Mitigating Data
Stalls in DNN Training", VLDB 2021) on emulated GPUs.

DS-Analyzer's what-if analysis, with the GPU side emulated and the CPU side
measured on this host:

1. the GPU's demand: images/s each model trains at on each emulated GPU,
   the batch already on the device (the emulated timeline, no data path);
2. the CPU's supply: images/s one DataLoader worker decodes and augments on
   this host (RandomResizedCrop, flip, normalize: the ImageNet recipe), the
   files in the page cache;
3. from both: the cores per GPU a model needs before it stops stalling on
   preprocessing, and the share of the epoch lost to it with
   --cores-per-gpu cores (DS-Analyzer's server: 24 cores for 8 V100s, 3);
4. the fetch stall (with enough cores that preprocessing keeps up, and in
   the JSON also at --cores-per-gpu) of a server of --gpus-per-server GPUs whose page cache
   holds a fraction of the dataset and reads the rest from storage at
   --storage-mbps. Every epoch reads a random permutation, so a cache of
   fraction f serves at best f of the reads (CoorDL's MinIO: what is cached
   stays); an LRU cache like Linux's page cache thrashes and serves fewer,
   simulated here (DS-Analyzer measured 15% hits with 35% cached);
5. a check: one emulated epoch through `torch-emugpu train --data`'s job
   with one worker (a core left for the training loop), its measured
   preprocessing stall against what (1)-(3) predict for it.

GPUs without a measured profile for a model are timed by the cost model (a
warning says so once per model); the demand is the compute engine's busy
time, so it is the GPU's even where this host cannot keep up.

    python examples/datastall.py --out /tmp/datastall          # makes a small dataset itself
    python examples/datastall.py --data DIR --gpus v100,a100 --models resnet18,resnet50

Writes datastall.json, datastall.md (the table) and datastall.png.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import tempfile
import time
import warnings
from pathlib import Path

import torch

import torch_emugpu
from torch_emugpu.data import data_train, datasets

MODELS = ["alexnet", "resnet18", "shufflenet_v2_x1_0", "mobilenet_v2", "resnet50", "vgg11"]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def gpu_demand(model: str, batch_size: int, iterations: int, amp: bool) -> float:
    """Images/s the emulated GPU trains `model` at, the batch on the device:
    from its compute engine's busy time, so a slow host does not count."""
    import torchvision

    device = torch.device("emugpu", 0)
    net = torchvision.models.get_model(model, num_classes=1000).to(device).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(batch_size, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch_size,), device=device)

    def step() -> None:
        with torch.autocast("emugpu", dtype=torch.float16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    torch.emugpu.synchronize()
    torch.emugpu.reset_engine_stats()
    for _ in range(iterations):
        step()
    torch.emugpu.synchronize()
    return batch_size * iterations / torch.emugpu.engine_stats()["compute_busy_s"]


def worker_supply(data: Path, batches: int, batch_size: int = 32) -> tuple[float, float]:
    """(images/s of one DataLoader worker, mean file size in bytes), files cached."""
    from torchvision.transforms import v2 as T

    found = datasets.scan(data)
    paths = [p for p, _ in found.files]
    datasets.set_page_cache(paths, 1.0)
    tf = T.Compose(
        [
            T.RandomResizedCrop(224, antialias=True),
            T.RandomHorizontalFlip(),
            T.PILToTensor(),
            T.ToDtype(torch.float32, scale=True),
            T.Normalize(MEAN, STD),
        ]
    )
    loader = torch.utils.data.DataLoader(
        datasets.ImageFiles(found, transform=tf),
        batch_size=batch_size,
        shuffle=True,
        num_workers=1,
        prefetch_factor=2,
        drop_last=True,
    )
    it = iter(loader)
    next(it)  # the worker's start-up is not its rate
    n, t0 = 0, time.perf_counter()
    for _ in range(min(batches, len(loader) - 1)):
        n += len(next(it)[0])
    rate = n / (time.perf_counter() - t0)
    del it
    mean_bytes = sum(os.path.getsize(p) for p in paths) / len(paths)
    return rate, mean_bytes


def prep_stall(demand: float, cores: float, per_core: float) -> float:
    """Share of the epoch the GPU waits for preprocessing with `cores` workers."""
    return max(0.0, 1.0 - cores * per_core / demand)


def lru_hit_rate(cache_fraction: float, items: int = 20000, epochs: int = 4, seed: int = 0) -> float:
    """Hits of an LRU cache holding `cache_fraction` of `items` when every
    epoch reads them all in a new random order (the epochs after the first)."""
    import random
    from collections import OrderedDict

    rng = random.Random(seed)
    capacity = int(cache_fraction * items)
    cache: OrderedDict[int, None] = OrderedDict()
    hits = reads = 0
    order = list(range(items))
    for epoch in range(epochs):
        rng.shuffle(order)
        for i in order:
            if i in cache:
                cache.move_to_end(i)
                hits += epoch > 0
            else:
                cache[i] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
            reads += epoch > 0
    return hits / reads if reads else 0.0


def fetch_stall(server_rate: float, hit_rate: float, mean_bytes: float, storage_bps: float) -> float:
    """Share of the epoch spent waiting for storage when the cache serves `hit_rate` of the reads."""
    misses = 1.0 - hit_rate
    if misses <= 0:
        return 0.0
    fetch_rate = storage_bps / (misses * mean_bytes)  # images/s the storage sustains
    return max(0.0, 1.0 - fetch_rate / server_rate)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = list(result["gpus"])
    models = result["models"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(gpus)
    for i, gpu in enumerate(gpus):
        needed = [result["gpus"][gpu][m]["cores_needed"] for m in models]
        ax1.bar([x + i * width for x in range(len(models))], needed, width, label=gpu)
    ax1.axhline(result["cores_per_gpu"], color="k", ls="--", lw=1, label=f"{result['cores_per_gpu']:g} cores/GPU")
    ax1.set_xticks([x + width * (len(gpus) - 1) / 2 for x in range(len(models))])
    ax1.set_xticklabels(models, rotation=30, ha="right")
    ax1.set_ylabel("CPU cores per GPU to stop prep stalls")
    ax1.legend()
    for gpu in gpus:
        for m in models:
            fs = result["gpus"][gpu][m]["fetch_stall_lru"]
            ax2.plot([float(f) for f in fs], [100 * v for v in fs.values()], marker="o", label=f"{gpu} {m}")
    ax2.set_xlabel("fraction of the dataset in the page cache")
    ax2.set_ylabel(f"fetch stall, % of epoch (LRU, {result['gpus_per_server']} GPUs/server, enough cores)")
    ax2.legend(fontsize=6, ncol=2)
    fig.suptitle(f"DataStall pattern on emulated GPUs; CPU: {result['per_core_images_s']:.0f} images/s per core here")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(result: dict) -> str:
    fractions = list(next(iter(next(iter(result["gpus"].values())).values()))["fetch_stall"])
    head = (
        "| GPU | model | GPU demand, images/s | cores/GPU needed | prep stall at "
        f"{result['cores_per_gpu']:g} cores/GPU | " + " | ".join(f"fetch stall, {f} cached" for f in fractions) + " |"
    )
    lines = [head, "|" + " --- |" * (5 + len(fractions))]
    for gpu, per_model in result["gpus"].items():
        for m, r in per_model.items():
            fetch = " | ".join(
                f"{100 * v:.0f}% ({100 * w:.0f}%)"
                for v, w in zip(r["fetch_stall"].values(), r["fetch_stall_lru"].values(), strict=True)
            )
            lines.append(
                f"| {gpu} | {m} | {r['demand_images_s']:.0f} | {r['cores_needed']} | "
                f"{100 * r['prep_stall']:.0f}% | {fetch} |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, help="an image folder (default: make --images imagenet-like JPEGs)")
    p.add_argument("--images", type=int, default=512, help="images to make when --data is not given (default 512)")
    p.add_argument(
        "--gpus",
        default="v100-32gb,a100",
        help="emulated GPUs, comma-separated (default v100-32gb,a100: DS-Analyzer's V100s had 32 GB)",
    )
    p.add_argument("--models", default=",".join(MODELS), help="torchvision models, comma-separated")
    p.add_argument("--batch-size", type=int, default=512, help="per-GPU batch (default 512, as DS-Analyzer's V100s)")
    p.add_argument(
        "--amp",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fp16 autocast, as DS-Analyzer's Apex mixed precision (default on)",
    )
    p.add_argument("--iterations", type=int, default=4, help="timed GPU iterations per model (default 4)")
    p.add_argument("--cores-per-gpu", type=float, default=3, help="CPU cores per GPU (default 3: 24 for 8 GPUs)")
    p.add_argument("--gpus-per-server", type=int, default=8, help="GPUs sharing one server's storage (default 8)")
    p.add_argument("--storage-mbps", type=float, default=530, help="storage read rate, MB/s (default 530: a SATA SSD)")
    p.add_argument(
        "--cache-fractions",
        default="0.25,0.35,0.5,0.75",
        help="page-cache fractions of the dataset for the fetch stall (default 0.25,0.35,0.5,0.75)",
    )
    p.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run one emulated epoch to check the prediction (default on)",
    )
    p.add_argument("--out", type=Path, default=Path("datastall"), help="output folder (default ./datastall)")
    args = p.parse_args()
    if args.batch_size < 1 or args.iterations < 1 or args.cores_per_gpu <= 0 or args.gpus_per_server < 1:
        p.error("--batch-size, --iterations and --gpus-per-server must be at least 1, --cores-per-gpu above 0")
    if args.storage_mbps <= 0:
        p.error(f"--storage-mbps must be above 0, got {args.storage_mbps}")
    fractions = [float(f) for f in args.cache_fractions.split(",")]
    if any(not 0 <= f <= 1 for f in fractions):
        p.error(f"--cache-fractions must lie in 0..1, got {args.cache_fractions}")
    models = [m for m in args.models.split(",") if m]
    args.out.mkdir(parents=True, exist_ok=True)
    # Expected here: demand comes from the engine's busy time, whatever the host does.
    warnings.filterwarnings("ignore", message=".*is host-bound.*")

    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "images"
            print(f"making {args.images} imagenet-like JPEGs in {data}")
            datasets.make("imagenet-like", data, args.images, progress=False)
        per_core, mean_bytes = worker_supply(data, batches=8)
        print(f"one DataLoader worker here: {per_core:.1f} images/s; mean file {mean_bytes / 1e3:.0f} kB")
        result: dict = {
            "per_core_images_s": per_core,
            "mean_file_bytes": mean_bytes,
            "cores_per_gpu": args.cores_per_gpu,
            "gpus_per_server": args.gpus_per_server,
            "storage_mbps": args.storage_mbps,
            "batch_size": args.batch_size,
            "amp": args.amp,
            "models": models,
            "gpus": {},
        }
        lru = {f: lru_hit_rate(f) for f in fractions}
        result["lru_hit_rate"] = {str(f): h for f, h in lru.items()}
        print(
            "LRU page cache, random order each epoch: "
            + ", ".join(f"{f:g} cached -> {100 * h:.0f}% hits" for f, h in lru.items())
        )
        for gpu in args.gpus.split(","):
            torch_emugpu.configure(gpu=gpu)
            name = torch.emugpu.get_device_name()
            per_model = {}
            for m in models:
                demand = gpu_demand(m, args.batch_size, args.iterations, args.amp)
                gc.collect()  # the model's device memory, before the next one
                torch.emugpu.empty_cache()
                supplied = min(demand, args.cores_per_gpu * per_core)
                server, storage = args.gpus_per_server, args.storage_mbps * 1e6
                per_model[m] = {
                    "demand_images_s": demand,
                    "cores_needed": math.ceil(demand / per_core),
                    "prep_stall": prep_stall(demand, args.cores_per_gpu, per_core),
                    # With enough cores (prep keeps up), where models differ; and at --cores-per-gpu.
                    "fetch_stall": {str(f): fetch_stall(server * demand, f, mean_bytes, storage) for f in fractions},
                    "fetch_stall_lru": {
                        str(f): fetch_stall(server * demand, lru[f], mean_bytes, storage) for f in fractions
                    },
                    "fetch_stall_lru_at_cores": {
                        str(f): fetch_stall(server * supplied, lru[f], mean_bytes, storage) for f in fractions
                    },
                }
                print(
                    f"{name:<24} {m:<20} demand {demand:8.0f} images/s, needs "
                    f"{per_model[m]['cores_needed']:3d} cores/GPU, prep stall at {args.cores_per_gpu:g}: "
                    f"{100 * per_model[m]['prep_stall']:3.0f}%"
                )
            result["gpus"][name] = per_model
        if args.check:
            workers = 1
            model = models[0]
            gpu = args.gpus.split(",")[0]
            batch = 32
            torch_emugpu.configure(gpu=gpu)
            r = data_train.run(data, model=model, gpu=gpu, batch_size=batch, workers=workers, progress=False)
            epoch = r.epochs[-1]
            measured = epoch.prep_stall_s / epoch.epoch_s
            demand = batch / r.gpu_iteration_s
            predicted = prep_stall(demand, workers, per_core)
            result["check"] = {
                "model": model,
                "gpu": r.gpu,
                "workers": workers,
                "batch_size": batch,
                "measured_prep_stall": measured,
                "predicted_prep_stall": predicted,
            }
            print(
                f"check: {model} on {r.gpu}, {workers} workers, batch {batch}: prep stall measured "
                f"{100 * measured:.0f}% of the epoch, predicted {100 * predicted:.0f}%"
            )
    (args.out / "datastall.json").write_text(json.dumps(result, indent=1))
    (args.out / "datastall.md").write_text(table(result) + "\n")
    plot(result, args.out / "datastall.png")
    print(table(result))
    print(f"wrote {args.out}/datastall.json, datastall.md and datastall.png")


if __name__ == "__main__":
    main()
