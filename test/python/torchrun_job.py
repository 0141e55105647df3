"""A small job for test_torchrun.py, launched by torchrun (one process per
emulated GPU). Each rank prints one line `RESULT {json}` with what it saw.

It trains a tiny model with DDP for a few steps (real values when
EMUGPU_MODE=compute), checks all_reduce and all_gather values, on several
nodes all-reduces in subgroups within a node and across nodes, and times one
large all_reduce in timing mode (no bytes move) on the collective engine.
`--fail-rank R` makes rank R raise after the first step on torchrun's first
attempt only (TORCHELASTIC_RESTART_COUNT == "0"), for elastic restarts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import torch_emugpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fail-rank", type=int, default=-1, help="this rank raises on the first attempt")
    parser.add_argument("--big-mib", type=int, default=256, help="size of the timed all_reduce")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    device = torch.device("emugpu", local_rank)
    torch.emugpu.set_device(device)
    dist.init_process_group(device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.group.WORLD._get_backend(device)

    torch.manual_seed(0)  # the same model everywhere; DDP's broadcast would fix it anyway
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.steps):
        x, y = torch.randn(4, 8, generator=g).to(device), torch.randn(4, 1, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()  # DDP's all-reduces
        optimizer.step()
        if step == 0 and rank == args.fail_rank and attempt == 0:
            torch.emugpu.synchronize()
            print(f"rank {rank}: injected failure on attempt {attempt}", flush=True)
            raise RuntimeError(f"rank {rank}: injected failure on attempt {attempt}")

    # Replicas must agree: all-gather a checksum of every rank's parameters.
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
    sums = [torch.zeros_like(checksum) for _ in range(world)]
    dist.all_gather(sums, checksum)
    x = torch.full((3,), float(rank + 1)).to(device)
    dist.all_reduce(x)
    ranks = torch.zeros(world, dtype=torch.int64, device=device)
    ranks[rank] = rank
    dist.all_reduce(ranks)

    # Subgroups within one node and across nodes (torchrun numbers ranks node by node).
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    nodes = world // local_world
    subgroups = {}
    if nodes > 1:
        for name, lists in (
            ("within", [[n * local_world + i for i in range(local_world)] for n in range(nodes)]),
            ("across", [[n * local_world + i for n in range(nodes)] for i in range(local_world)]),
        ):
            group, _ = dist.new_subgroups_by_enumeration(lists)
            y = torch.full((1,), float(rank)).to(device)
            dist.all_reduce(y, group=group)
            sub = group._get_backend(device)
            subgroups[name] = {"ranks_per_node": sub.ranks_per_node, "nodes": sub.nodes, "sum": y.item()}

    # One large all_reduce, timed by the emulated collective engine.
    torch.emugpu.synchronize()
    torch_emugpu.configure(mode="timing")
    big = torch.empty(args.big_mib << 18, device=device)  # float32: MiB * 2**20 / 4
    torch.emugpu.reset_engine_stats()
    wall = time.monotonic()
    dist.all_reduce(big)
    torch.emugpu.synchronize()
    wall = time.monotonic() - wall
    stats = torch.emugpu.engine_stats()

    result = {
        "rank": rank,
        "world": world,
        "local_rank": local_rank,
        "attempt": attempt,
        "node": int(os.environ["GROUP_RANK"]),
        "local_world": local_world,
        "device_count": torch.emugpu.device_count(),
        "gpu": torch.emugpu.get_device_name(device),
        "ranks_per_node": backend.ranks_per_node,
        "nodes": backend.nodes,
        "clock_offset_ns": backend.clock_offset_ns,
        "subgroups": subgroups,
        "checksums": [s.item() for s in sums],
        "all_reduce": x.cpu().tolist(),
        "ranks": ranks.cpu().tolist(),
        "big_bytes": big.numel() * big.element_size(),
        "big_busy_ns": int(stats["collective_busy_s"] * 1e9),
        "big_launches": stats["collective_launches"],
        "big_wall_s": wall,
    }
    # One write: the ranks share torchrun's stdout, and print() writes the
    # line and its newline apart when unbuffered.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), ("RESULT " + json.dumps(result) + "\n").encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
