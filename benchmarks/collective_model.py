"""Collective cost model vs published nccl-tests results.

Two kinds of data, both under benchmarks/data/:
- `*.txt`: figures transcribed one per line (collective, size, ranks per
  node, nodes, network GB/s, metric, value), with a '# gpu=NAME' header;
- `nccl_tests_published/`: nccl-tests' own all_reduce_perf tables as
  published, described by its `runs.json` (machine, network, NCCL_ALGO,
  and whether the run is a validation target or context only).

For every row it prints the published value, the model's prediction
(csrc/core/collective_cost.*) and the error; then, per run, the median and
worst |error| of the bus bandwidths above 1 MiB, and a summary over the
validation runs. Bus bandwidth follows nccl-tests: busbw = size / time x
factor (2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and
all_to_all). Rows published as a time (small messages) are compared as
times. Tables are read out-of-place (in-place where a source gives only that).

    python benchmarks/collective_model.py [--data-dir DIR] [--net-latency-us US] [--min-bytes N] [--summary]

The network of each run (GB/s per node) comes from its data; its latency
from --net-latency-us, else EMUGPU_NET_LATENCY_US, else the default.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch_emugpu  # noqa: F401  (loads the compiled core)
from torch_emugpu import _C

MIB = 1 << 20
TARGET_PCT = 15.0


@dataclass
class Row:
    collective: str
    size: int
    ranks_per_node: int
    nodes: int
    net_gbps: float
    metric: str  # "busbw_GBps" or "time_us"
    value: float


@dataclass
class Run:
    name: str
    gpu: str
    rows: list[Row]
    algorithms: str = "default"
    role: str = "validation"
    reason: str = ""
    errors: list[float] = field(default_factory=list)  # signed %, busbw rows above 1 MiB


def load_transcribed(path: Path) -> Run:
    gpu = ""
    rows: list[Row] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if line.startswith("# gpu="):
            gpu = line.removeprefix("# gpu=").strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 7:
            raise ValueError(
                f"{path}:{number}: expected 7 fields "
                f"(collective size ranks_per_node nodes net_gbps metric value), got {len(fields)}"
            )
        kind, size, rpn, nodes, net, metric, value = fields
        if metric not in ("busbw_GBps", "time_us"):
            raise ValueError(f"{path}:{number}: expected busbw_GBps or time_us, got {metric!r}")
        rows.append(Row(kind, int(size), int(rpn), int(nodes), float(net), metric, float(value)))
    if not gpu:
        raise ValueError(f"{path}: expected a '# gpu=NAME' header line")
    return Run(path.name, gpu, rows)


def table_busbw(fields: list[str]) -> tuple[int, float] | None:
    """(size, out-of-place busbw) of one nccl-tests row, None for other lines.

    Rows are `size count type redop [root] time algbw busbw #wrong` twice
    over (out-of-place, in-place: 13 fields; nccl-tests before 2.10 had no
    root column: 12); summaries are `label size busbw`."""
    if len(fields) == 3 and fields[1].isdigit():
        return int(fields[1]), float(fields[2])
    if len(fields) < 8 or not fields[0].isdigit() or not fields[1].isdigit():
        return None
    busbw_at = 7 if len(fields) >= 13 else 6
    return int(fields[0]), float(fields[busbw_at])


def load_published(directory: Path, spec: dict) -> Run:
    path = directory / spec["file"]
    section = spec.get("section")
    inside = section is None
    rows: list[Row] = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("# ==="):
            inside = section is not None and f"=== {section}:" in stripped
            continue
        if not inside or not stripped or stripped.startswith("#"):
            continue
        parsed = table_busbw(stripped.split())
        if parsed is None:
            raise ValueError(f"{path}: expected an nccl-tests row or a 'label size busbw' line, got {stripped!r}")
        size, busbw = parsed
        rows.append(
            Row("all_reduce", size, spec["ranks_per_node"], spec["nodes"], spec["net_gbps"], "busbw_GBps", busbw)
        )
    if not rows:
        raise ValueError(f"{path}: expected rows{f' in section {section}' if section else ''}, found none")
    name = spec["file"] + (f" [{section}]" if section else "")
    return Run(
        f"{name}: {spec['label']}",
        spec["gpu"],
        rows,
        spec.get("algorithms", "default"),
        spec["role"],
        spec.get("reason", ""),
    )


def load_all(data_dir: Path) -> list[Run]:
    runs = [load_transcribed(p) for p in sorted(data_dir.glob("*.txt"))]
    published = data_dir / "nccl_tests_published"
    manifest = published / "runs.json"
    if manifest.is_file():
        for spec in json.loads(manifest.read_text())["runs"]:
            runs.append(load_published(published, spec))
    return runs


def predict(gpu: str, row: Row, algorithms: str, net_latency_us: float | None) -> tuple[float, str]:
    r = _C._collective_time(
        row.collective, float(row.size), gpu, row.ranks_per_node, row.nodes, row.net_gbps, net_latency_us, algorithms
    )
    how = f"{r['algorithm']}/{r['protocol']}"
    if row.metric == "time_us":
        return r["seconds"] * 1e6, how
    return row.size / r["seconds"] * r["bus_factor"] / 1e9, how


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def report(run: Run, args: argparse.Namespace) -> None:
    if not args.summary:
        role = "validation" if run.role == "validation" else f"context: {run.reason}"
        print(f"\n== {run.name} ({run.gpu}; NCCL_ALGO {run.algorithms}; {role})")
        print(
            f"{'collective':<12} {'size':>10} {'ranks':>7} {'metric':>8} {'published':>10} {'predicted':>10} "
            f"{'error %':>8}  algorithm"
        )
    for row in run.rows:
        if row.size < args.min_bytes:
            continue
        predicted, how = predict(run.gpu, row, run.algorithms, args.net_latency_us)
        error = (predicted - row.value) / row.value * 100 if row.value else float("nan")
        if not args.summary:
            metric = "busbw" if row.metric == "busbw_GBps" else "time us"
            print(
                f"{row.collective:<12} {size_text(row.size):>10} {row.nodes:>2}x{row.ranks_per_node:<4} "
                f"{metric:>8} {row.value:>10.2f} {predicted:>10.2f} {error:>+8.1f}  {how}"
            )
        if row.metric == "busbw_GBps" and row.size > MIB and row.value > 0:
            run.errors.append(error)


def summary_line(errors: list[float]) -> str:
    magnitudes = [abs(e) for e in errors]
    within = sum(m <= TARGET_PCT for m in magnitudes)
    return (
        f"median |error| {statistics.median(magnitudes):5.1f}%, signed {statistics.median(errors):+6.1f}%, "
        f"worst {max(magnitudes):5.1f}%, {within}/{len(errors)} within {TARGET_PCT:g}%"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(__file__).parent / "data",
        help="directory of published results (default: benchmarks/data)",
    )
    parser.add_argument(
        "--net-latency-us",
        type=float,
        default=None,
        help="network hop latency in microseconds (default: the configuration's)",
    )
    parser.add_argument("--min-bytes", type=int, default=1024, help="skip smaller messages (default 1024)")
    parser.add_argument("--summary", action="store_true", help="print only the per-run summaries")
    args = parser.parse_args()
    runs = load_all(args.data_dir)
    for run in runs:
        report(run, args)
    print(f"\n== busbw above 1 MiB, per run (target: within {TARGET_PCT:g}%)")
    for run in runs:
        if run.errors:
            tag = "V" if run.role == "validation" else "c"
            print(f"{tag} {summary_line(run.errors)}  {run.name}")
    validation = [e for run in runs if run.role == "validation" for e in run.errors]
    if validation:
        print(f"\nall validation rows: {summary_line(validation)}")
    print("(V: validation run; c: context only, see runs.json for why)")


if __name__ == "__main__":
    main()
