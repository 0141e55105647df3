"""Host memory of a process that holds about 20 GB of emulated activations.

resnet50's forward pass at a large batch keeps its activations on an emulated
80 GB GPU for backward; the process' resident set size (VmRSS, and its peak
VmHWM) should stay under 1 GB, against the same process before the model ran.

    python benchmarks/host_memory.py [--batch-size N]
"""

from __future__ import annotations

import argparse

import torch
import torchvision

import torch_emugpu


def vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=240, help="default 240 (about 20 GB of activations)")
    args = parser.parse_args()
    torch_emugpu.configure(gpu="a100-80gb")
    model = torchvision.models.resnet50().to("emugpu")
    x = torch.empty(args.batch_size, 3, 224, 224, device="emugpu")
    before_rss = vm("VmRSS")
    weights = torch.emugpu.memory_allocated()
    loss = model(x).sum()  # the autograd graph holds every activation
    torch.emugpu.synchronize()
    held = torch.emugpu.memory_allocated() - weights
    rss, hwm = vm("VmRSS"), vm("VmHWM")
    print(f"emulated activations held: {held / 1e9:6.2f} GB (batch {args.batch_size})")
    print(
        f"host RSS growth / activations = {(rss - before_rss) / held:.5f}   "
        f"(RSS {rss / 1e9:.3f} GB, of which {(rss - before_rss) / 1e6:.1f} MB since the model ran; "
        f"peak VmHWM {hwm / 1e9:.3f} GB; target RSS < 1 GB)"
    )
    loss.backward()


if __name__ == "__main__":
    main()
