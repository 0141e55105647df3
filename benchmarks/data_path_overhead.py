"""The emulator's own overhead on the data path.

A DataLoader-fed training loop whose input keeps up (the dataset decoded and
cached in memory, as uint8 images; workers only batch and pin them) should
take the time the emulated GPU alone implies: its compute engine's busy time
plus the host-to-device copies the loop waits for (it copies on its compute
stream). What the epoch takes beyond that is the emulator's overhead on the
data path: the host work of dispatching ops to the emulated device, of
pinned copies, and of the loader, that a real GPU would have hidden.

For each configuration it runs one warm-up epoch, then `--epochs` timed
ones, and prints the ratio epoch wall time / implied GPU time (target: at
most 1.02), with the absolute figures beside it. Each epoch is timed from
its first batch's arrival: the loader's start-up is a wait every GPU pays
alike, not the emulator's.

    python benchmarks/data_path_overhead.py [--configs v100:resnet50:64,...] [--images N] [--workers W]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch

import torch_emugpu

DEFAULT_CONFIGS = "v100:resnet50:64,a100:resnet50:128,v100:vgg11:64,a100:resnet18:128"


class CachedImages(torch.utils.data.Dataset):
    """Decoded 224x224 uint8 images held in memory: a fully cached dataset whose workers only batch."""

    def __init__(self, count: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (count, 3, 224, 224), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 1000, (count,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]


def run_config(gpu: str, model: str, batch: int, data: CachedImages, workers: int, epochs: int) -> dict:
    import torchvision

    torch_emugpu.configure(gpu=gpu)
    device = torch.device("emugpu", 0)
    net = torchvision.models.get_model(model, num_classes=1000).to(device).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        pin_memory=True,
        drop_last=True,
        persistent_workers=workers > 0,
    )

    def epoch() -> tuple[float, float, float, int]:
        it = iter(loader)
        first = next(it)  # the loader's start: every GPU waits for it alike
        torch.emugpu.synchronize()
        torch.emugpu.reset_engine_stats()
        t0 = time.perf_counter()
        n = 0
        for x, y in itertools.chain([first], it):
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            x = (x.float() - mean) / std  # normalize on the device, as DALI and FFCV do
            loss = torch.nn.functional.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            n += 1
        torch.emugpu.synchronize()
        wall = time.perf_counter() - t0
        s = torch.emugpu.engine_stats()
        return wall, s["compute_busy_s"], s["h2d_busy_s"], n

    epoch()  # warm-up: workers start, shapes are learnt
    ratios, walls, implied_s = [], [], []
    iterations = 0
    for _ in range(epochs):
        wall, compute, h2d, iterations = epoch()
        implied = compute + h2d
        ratios.append(wall / implied)
        walls.append(wall)
        implied_s.append(implied)
    name = torch.emugpu.get_device_name()
    return {
        "gpu": name,
        "model": model,
        "batch": batch,
        "iterations": iterations,
        "ratio": statistics.median(ratios),
        "wall_s": statistics.median(walls),
        "implied_s": statistics.median(implied_s),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--configs", default=DEFAULT_CONFIGS, help=f"gpu:model:batch, comma-separated (default {DEFAULT_CONFIGS})"
    )
    p.add_argument("--images", type=int, default=1024, help="images in the cached dataset (default 1024)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per configuration (default 3)")
    args = p.parse_args()
    if args.images < 1 or args.workers < 0 or args.epochs < 1:
        p.error("--images and --epochs must be at least 1, --workers at least 0")
    import warnings

    warnings.filterwarnings("ignore", message=".*no profile matched.*")
    data = CachedImages(args.images)
    print(f"{'GPU':<24} {'model':<10} {'batch':>5} {'iters':>5} {'epoch s':>8} {'implied s':>9} {'ratio':>7}")
    worst = 0.0
    for spec in args.configs.split(","):
        gpu, model, batch = spec.split(":")
        r = run_config(gpu, model, int(batch), data, args.workers, args.epochs)
        worst = max(worst, r["ratio"])
        print(
            f"{r['gpu']:<24} {r['model']:<10} {r['batch']:>5} {r['iterations']:>5} {r['wall_s']:>8.2f} "
            f"{r['implied_s']:>9.2f} {r['ratio']:>7.3f}"
        )
    print(f"worst ratio {worst:.3f} (target <= 1.02: epoch wall time over the emulated GPU's compute + copies)")


if __name__ == "__main__":
    main()
