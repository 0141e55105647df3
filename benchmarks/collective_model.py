"""Collective cost model vs published nccl-tests results.

For every row of the data files in benchmarks/data/ (nccl-tests figures, with
their source URL and command line in each file's header), prints the published
value, the model's prediction (core/collective_cost.*) and the error, then a
summary per file: median and worst |error| of the bus bandwidths above 1 MiB.
Bus bandwidth follows nccl-tests: busbw = size / time x factor (2(n-1)/n for
all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all). Rows
published as a time (small messages) are compared as times.

    python benchmarks/collective_model.py [--data-dir DIR] [--net-latency-us US] [--min-bytes N]

The network of each row (GB/s per node) comes from its data file; its latency
from --net-latency-us, else EMUGPU_NET_LATENCY_US, else the default (3 us).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch_emugpu  # noqa: F401  (loads the compiled core)
from torch_emugpu import _C

MIB = 1 << 20


@dataclass
class Row:
    collective: str
    size: int
    ranks_per_node: int
    nodes: int
    net_gbps: float
    metric: str  # "busbw_GBps" or "time_us"
    value: float


def load(path: Path) -> tuple[str, list[Row]]:
    gpu = ""
    rows: list[Row] = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("# gpu="):
            gpu = line.removeprefix("# gpu=").strip()
        if not line or line.startswith("#"):
            continue
        kind, size, rpn, nodes, net, metric, value = line.split()
        if metric not in ("busbw_GBps", "time_us"):
            raise ValueError(f"{path}: expected busbw_GBps or time_us, got {metric!r}")
        rows.append(Row(kind, int(size), int(rpn), int(nodes), float(net), metric, float(value)))
    if not gpu:
        raise ValueError(f"{path}: expected a '# gpu=NAME' header line")
    return gpu, rows


def predict(gpu: str, row: Row, net_latency_us: float | None) -> tuple[float, str]:
    r = _C._collective_time(row.collective, float(row.size), gpu, row.ranks_per_node, row.nodes,
                            row.net_gbps, net_latency_us)
    how = f"{r['algorithm']}/{r['protocol']}"
    if row.metric == "time_us":
        return r["seconds"] * 1e6, how
    return row.size / r["seconds"] * r["bus_factor"] / 1e9, how


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).parent / "data",
                        help="directory of published results (default: benchmarks/data)")
    parser.add_argument("--net-latency-us", type=float, default=None,
                        help="network hop latency in microseconds (default: the configuration's, 3 us)")
    parser.add_argument("--min-bytes", type=int, default=1024, help="skip smaller messages (default 1024)")
    args = parser.parse_args()
    for path in sorted(args.data_dir.glob("*.txt")):
        gpu, rows = load(path)
        print(f"\n== {path.name} ({gpu})")
        print(f"{'collective':<12} {'size':>10} {'ranks':>7} {'metric':>8} {'published':>10} {'predicted':>10} "
              f"{'error %':>8}  algorithm")
        big: list[float] = []
        for row in rows:
            if row.size < args.min_bytes:
                continue
            predicted, how = predict(gpu, row, args.net_latency_us)
            error = (predicted - row.value) / row.value * 100 if row.value else float("nan")
            metric = "busbw" if row.metric == "busbw_GBps" else "time us"
            print(f"{row.collective:<12} {size_text(row.size):>10} {row.nodes:>2}x{row.ranks_per_node:<4} "
                  f"{metric:>8} {row.value:>10.2f} {predicted:>10.2f} {error:>+8.1f}  {how}")
            if row.metric == "busbw_GBps" and row.size > MIB:
                big.append(abs(error))
        if big:
            print(f"-- busbw above 1 MiB: median |error| {statistics.median(big):.1f}%, worst {max(big):.1f}% "
                  f"({len(big)} rows; target 15%)")


if __name__ == "__main__":
    main()
