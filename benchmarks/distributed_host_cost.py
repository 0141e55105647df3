"""Host cost of backend `emu` per collective: the wall-clock time a rank's
host spends in one all_reduce (its launch: the group's runner exchanges the
start times, and the real bytes where the data rule moves them, behind the
host), over `--world` spawned ranks on loopback, and the payload bytes each
call moved.

    python benchmarks/distributed_host_cost.py [--world 8] [--iters N] [--transport tcp]

Prints, per (mode, size): wall microseconds per call (median over ranks of
each rank's mean), its ratio to an all-gather of the six exchange words
alone (the baseline, measured in the same processes), the same until every
call is placed on the timeline (the loop and its closing synchronize, which
also waits for the emulated GPU to finish them: the work the runner does
behind the host), the rank's own CPU time per call until then (all its
threads), and payload bytes moved per call and rank. Timing mode moves the
bytes of tensors up to 64 KiB only. `--transport tcp` measures the TCP
exchange instead of shared memory.
"""

from __future__ import annotations

import argparse
import datetime
import os
import queue
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
    dist.init_process_group("emu", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("emugpu", rank))

    # Baseline: the exchange's all-gather of six int64 words, with nothing else.
    for _ in range(10):
        backend.gather_words(6)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(iters):
        backend.gather_words(6)
    baseline_us = (time.perf_counter() - start) / iters * 1e6
    results.put(("baseline", 48, baseline_us, (time.process_time() - cpu) / iters * 1e6, 0, baseline_us))

    for mode, nbytes in CASES:
        torch_emugpu.configure(mode=mode)
        x = torch.ones(nbytes // 4).to(torch.device("emugpu", rank))
        for _ in range(10):
            dist.all_reduce(x)
        dist.barrier()
        moved = backend.payload_bytes_moved
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(iters):
            dist.all_reduce(x)
        seconds = time.perf_counter() - start
        torch.emugpu.synchronize()  # the runner has exchanged and placed every deferred call by then
        placed, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
        results.put(
            (
                mode,
                nbytes,
                seconds / iters * 1e6,
                cpu_seconds / iters * 1e6,
                (backend.payload_bytes_moved - moved) / iters,
                placed / iters * 1e6,
            )
        )
        dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=8, help="ranks, one emulated GPU each (default: 8)")
    parser.add_argument("--iters", type=int, default=100, help="timed calls per case (default: 100)")
    parser.add_argument(
        "--transport",
        choices=["auto", "tcp", "shm"],
        default="auto",
        help="the exchange's transport (EMUGPU_EXCHANGE; default: auto, shared memory here)",
    )
    args = parser.parse_args()
    world = args.world
    transport = args.transport
    os.environ["EMUGPU_DEVICE_COUNT"] = str(world)
    os.environ["EMUGPU_EXCHANGE"] = transport
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, world, store.port, args.iters, results)) for r in range(world)]
    for p in procs:
        p.start()
    rows: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
    for _ in tqdm(range(world * (len(CASES) + 1)), desc="rank results", unit="result"):
        while True:
            try:
                mode, nbytes, us, cpu_us, moved, placed_us = results.get(timeout=5)
                break
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    raise SystemExit(f"rank(s) {dead} failed (their traceback is above)") from None
        rows.setdefault((mode, nbytes), []).append((us, cpu_us, moved, placed_us))
    for p in procs:
        p.join(60)
    base = rows.pop(("baseline", 48))
    baseline = statistics.median(v[0] for v in base)
    print(
        f"{world} ranks on loopback, transport {transport}; baseline (exchange all-gather of 6 words): "
        f"{baseline:.1f} us wall, {statistics.median(v[1] for v in base):.1f} us CPU"
    )
    print(
        f"{'mode':8} {'bytes':>10} {'us/all_reduce':>14} {'x baseline':>11} {'until placed':>13} "
        f"{'CPU us/call':>12} {'payload bytes moved/call':>25}"
    )
    for (mode, nbytes), values in rows.items():
        us = statistics.median(v[0] for v in values)
        cpu_us = statistics.median(v[1] for v in values)
        moved = statistics.median(v[2] for v in values)
        placed = statistics.median(v[3] for v in values)
        print(
            f"{mode:8} {nbytes:>10} {us:>14.1f} {us / baseline:>11.2f} {placed:>13.1f} {cpu_us:>12.1f} {moved:>25.0f}"
        )


if __name__ == "__main__":
    main()
