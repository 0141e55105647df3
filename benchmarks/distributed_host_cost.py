"""Host cost of backend `emu` per collective: the wall-clock time a rank's
host spends in one all_reduce (start-time exchange over the internal gloo
group, plus the real bytes where the data rule moves them), over 2 spawned
ranks on loopback. Emulated device time is not measured here.

    python benchmarks/distributed_host_cost.py [--iters N]

Prints, per (mode, size): microseconds per call, median over ranks' means.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CASES = [("timing", 1 << 10), ("timing", 64 << 20), ("compute", 1 << 10), ("compute", 4 << 20)]


def rank_main(rank: int, world: int, port: int, iters: int, results: mp.Queue) -> None:
    import torch_emugpu

    torch.emugpu.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    dist.init_process_group("emu", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    for mode, nbytes in CASES:
        torch_emugpu.configure(mode=mode)
        x = torch.ones(nbytes // 4).to(torch.device("emugpu", rank))
        for _ in range(10):
            dist.all_reduce(x)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        results.put((mode, nbytes, (time.perf_counter() - start) / iters * 1e6))
        torch.emugpu.synchronize()
        dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    world = 2
    os.environ["EMUGPU_DEVICE_COUNT"] = str(world)
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, world, store.port, args.iters, results)) for r in range(world)]
    for p in procs:
        p.start()
    rows: dict[tuple[str, int], list[float]] = {}
    for _ in range(world * len(CASES)):
        mode, nbytes, us = results.get(timeout=600)
        rows.setdefault((mode, nbytes), []).append(us)
    for p in procs:
        p.join(60)
    print(f"{'mode':8} {'bytes':>10} {'us/all_reduce':>14}")
    for (mode, nbytes), values in rows.items():
        print(f"{mode:8} {nbytes:>10} {statistics.median(values):>14.1f}")


if __name__ == "__main__":
    main()
