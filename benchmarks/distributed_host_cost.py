"""Host cost of backend `emu` per collective: the wall-clock time a rank's
host spends in one all_reduce (start-time exchange over the internal gloo
group, plus the real bytes where the data rule moves them), over `--world`
spawned ranks on loopback, and the payload bytes each call moved. Emulated
device time is not measured here.

    python benchmarks/distributed_host_cost.py [--world 8] [--iters N]

Prints, per (mode, size): microseconds per call (median over ranks of each
rank's mean), its ratio to a gloo all-gather of the six exchange words alone
(the baseline, measured in the same processes), and payload bytes moved per
call and rank. Timing mode moves the bytes of tensors up to 64 KiB only.
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
from tqdm import tqdm

CASES = [("timing", 1 << 10), ("timing", 100 << 20), ("compute", 1 << 10), ("compute", 4 << 20)]


def rank_main(rank: int, world: int, port: int, iters: int, results: mp.Queue) -> None:
    import torch_emugpu

    torch.emugpu.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    dist.init_process_group("emu", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("emugpu", rank))
    exchange = backend._exchange

    # Baseline: the exchange's all-gather of six int64 words, with nothing else.
    for _ in range(10):
        exchange.gather_words([0] * 6, "baseline")
    start = time.perf_counter()
    for _ in range(iters):
        exchange.gather_words([0] * 6, "baseline")
    results.put(("baseline", 48, (time.perf_counter() - start) / iters * 1e6, 0))

    for mode, nbytes in CASES:
        torch_emugpu.configure(mode=mode)
        x = torch.ones(nbytes // 4).to(torch.device("emugpu", rank))
        for _ in range(10):
            dist.all_reduce(x)
        dist.barrier()
        moved = backend.payload_bytes_moved
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        seconds = time.perf_counter() - start
        results.put((mode, nbytes, seconds / iters * 1e6, (backend.payload_bytes_moved - moved) / iters))
        torch.emugpu.synchronize()
        dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=8, help="ranks, one emulated GPU each (default: 8)")
    parser.add_argument("--iters", type=int, default=100, help="timed calls per case (default: 100)")
    args = parser.parse_args()
    world = args.world
    os.environ["EMUGPU_DEVICE_COUNT"] = str(world)
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, world, store.port, args.iters, results)) for r in range(world)]
    for p in procs:
        p.start()
    rows: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in tqdm(range(world * (len(CASES) + 1)), desc="rank results", unit="result"):
        mode, nbytes, us, moved = results.get(timeout=1200)
        rows.setdefault((mode, nbytes), []).append((us, moved))
    for p in procs:
        p.join(60)
    baseline = statistics.median(us for us, _ in rows.pop(("baseline", 48)))
    print(f"{world} ranks on loopback; baseline (exchange all-gather of 6 words): {baseline:.1f} us")
    print(f"{'mode':8} {'bytes':>10} {'us/all_reduce':>14} {'x baseline':>11} {'payload bytes moved/call':>25}")
    for (mode, nbytes), values in rows.items():
        us = statistics.median(v[0] for v in values)
        moved = statistics.median(v[1] for v in values)
        print(f"{mode:8} {nbytes:>10} {us:>14.1f} {us / baseline:>11.2f} {moved:>25.0f}")


if __name__ == "__main__":
    main()
