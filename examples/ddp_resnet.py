"""DistributedDataParallel training of a torchvision ResNet on emulated GPUs.

One process per emulated GPU, launched by torchrun; the emulated device count
defaults to torchrun's local world size:

    EMUGPU_GPU=a100-sxm4-80gb torchrun --standalone --nproc-per-node 8 examples/ddp_resnet.py

Several emulated nodes: one torchrun per node (examples/README.md), e.g.

    torchrun --nnodes 2 --node-rank N --nproc-per-node 4 --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:29400 examples/ddp_resnet.py

Written as for CUDA, with "emugpu" as the device: synthetic batches are copied
from the host each iteration, gradients are all-reduced by DDP over the `emu`
backend, and rank 0 prints the iteration time, throughput and every rank's
peak memory, as the emulated GPUs would show them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torchvision

import torch_emugpu  # registers the emugpu device and the emu backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50", help="a torchvision classifier (default: resnet50)")
    parser.add_argument("--batch-size", type=int, default=64, help="per GPU (default: 64)")
    parser.add_argument("--iterations", type=int, default=10, help="timed iterations after one warm-up")
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("emugpu", local_rank)
    torch.emugpu.set_device(device)
    dist.init_process_group(device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()

    model = torchvision.models.get_model(args.model, num_classes=1000).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    images = torch.randn(args.batch_size, 3, 224, 224).pin_memory()
    labels = torch.randint(0, 1000, (args.batch_size,)).pin_memory()

    times = []
    for i in range(args.iterations + 1):
        start = time.perf_counter()
        x, y = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        torch.emugpu.synchronize()
        if i > 0:  # the first iteration builds DDP's buckets and the shape caches
            times.append(time.perf_counter() - start)

    # Per rank: peak memory, and whether the host kept the emulated GPU waiting (times then measure this host).
    host = torch_emugpu.host_bound_report(local_rank)
    mine = torch.tensor(
        [torch.emugpu.max_memory_allocated(device), host["host_bound_windows"], host["worst_idle_fraction"]],
        dtype=torch.float64,
        device=device,
    )
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    if rank == 0:
        it = statistics.median(times)
        print(f"{args.model} DDP on {world} x {torch.emugpu.get_device_name(device)}, batch {args.batch_size} per GPU")
        print(f"iteration time   {it * 1e3:.2f} ms (median of {len(times)})")
        print(f"throughput       {world * args.batch_size / it:.1f} samples/s")
        print("peak memory      " + ", ".join(f"rank {r}: {e[0].item() / 2**30:.2f} GiB" for r, e in enumerate(every)))
        late = [r for r, e in enumerate(every) if e[1].item() > 0]
        worst = max(e[2].item() for e in every)
        print(
            f"host-bound       {'ranks ' + str(late) if late else 'no'} (the emulated GPUs sat idle up to "
            f"{worst:.0%} of a window waiting for their hosts{'; these times measure this host' if late else ''})"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
