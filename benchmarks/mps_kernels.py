#!/usr/bin/env python3
"""What real kernels do beside another job's: the evidence for emugpud's MPS rules.

Reads a result of `benchmarks/collocation.py --kernels N` (measured on a GPU:
every member of every run recorded the kernels of N iterations, all members of
a group from one common time) and prints

  per job alone   its kernels by the daemon's SM-demand bins, from each kernel's
                  grid, threads per block, registers and shared memory against
                  the GPU's per-SM limits: share of kernel time, mean fill of
                  the SMs' block slots (the cost model's `demand`), block hold
                  time, waves, and the share of an SM's threads and shared
                  memory its resident blocks take (what decides whose blocks
                  fit beside whose);
  per pair member (over the stretch both members' recordings cover)
                  its kernel time per iteration alone and beside the other job
                  (stretch), the idle time between its kernels (wait), and
                  its kernels by what they met: no kernel of the other, a
                  kernel of the other that started first (this one behind) or
                  after (this one ahead), with their mean stretch; and where a
                  kernel became ready (its predecessor ended) while one of the
                  other's ran, how long it waited to start, against what that
                  other kernel had left to run (1: it started behind the whole
                  kernel, first come first served; 0: it started at once on the
                  SMs left).

Even turns (emugpud's rule) predict the same stretch ahead and behind and a
wait near 0; first-come-first-served dispatch predicts ahead kernels near 1x
and behind ones that wait out most of the other kernel.

    python benchmarks/mps_kernels.py collocation.json [--mode mps] [--json out.json]
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SM_BINS = 4  # as emugpud's DemandHistogram
MEETINGS = ("alone", "behind", "ahead")  # what a kernel met of the other job's: nothing, one started before, after
# Per-SM limits where the trace carries no deviceProperties: an H100 SXM.
H100_PROPERTIES = {
    "numSms": 132,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerMultiprocessor": 65536,
    "sharedMemPerMultiprocessor": 233472,
    "computeMajor": 9,
    "computeMinor": 0,
}


@dataclass
class Kernel:
    name: str
    start_ns: int
    dur_ns: int
    blocks: int
    threads: int
    registers: int
    shared_bytes: int

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


@dataclass
class Recording:
    """One member's recorded kernels, split into its iterations where they repeat."""

    kernels: list[Kernel]
    iterations: int
    per_iteration: int | None  # kernels per iteration where every iteration launched the same sequence

    def chunks(self) -> list[list[Kernel]]:
        if self.per_iteration is None:
            return [self.kernels]
        n = self.per_iteration
        return [self.kernels[i : i + n] for i in range(0, len(self.kernels), n)]


def recording(entry: dict[str, Any]) -> Recording | None:
    """The recorded kernels of a solo entry or pair member (None where it recorded none,
    or its recording failed: the entry then says why)."""
    k = entry.get("kernels")
    if not k or "rows" not in k:
        return None
    col = {c: i for i, c in enumerate(k["columns"])}
    names = k["names"]
    kernels = [
        Kernel(
            names[r[col["name"]]],
            k["t0_ns"] + r[col["start_ns"]],
            r[col["dur_ns"]],
            r[col["blocks"]],
            r[col["threads"]],
            r[col["registers"]],
            r[col["shared_bytes"]],
        )
        for r in k["rows"]
    ]
    if not kernels:  # a profiler that saw none (no CUPTI under MPS, say)
        return None
    kernels.sort(key=lambda x: x.start_ns)
    iterations = max(1, int(k.get("iterations", 1)))
    per = len(kernels) // iterations if kernels and len(kernels) % iterations == 0 else None
    if per is not None:
        first = [x.name for x in kernels[:per]]
        if any([x.name for x in kernels[i : i + per]] != first for i in range(per, len(kernels), per)):
            per = None
    return Recording(kernels, iterations, per)


def device_properties(doc: dict[str, Any]) -> dict[str, Any]:
    """The GPU's per-SM limits, from the first recording that carries them."""
    for entry in entries(doc):
        props = (entry.get("kernels") or {}).get("device_properties") or []
        if props:
            return {**H100_PROPERTIES, **props[0]}
    return dict(H100_PROPERTIES)


def labelled(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every solo entry and pair member of a result, with where it stands."""
    out = [(f"{key} {job}", e) for key in ("solo", "solo_mps") for job, e in doc.get(key, {}).items()]
    for name, mode in doc.get("modes", {}).items():
        for pair in mode.get("pairs", []):
            group = " + ".join(pair.get("jobs", []))
            out.extend((f"{name} {group}: {m.get('job')}", m) for m in pair.get("members", []))
    return out


def entries(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for _, e in labelled(doc)]


# ---------------------------------------------------------------- occupancy


@dataclass
class Fit:
    resident: int  # blocks of this kernel one SM holds at once
    waves: float  # blocks over the GPU's block slots
    fill: float  # mean fraction of the slots its waves hold (a partial last wave holds fewer)
    thread_share: float  # share of an SM's threads its resident blocks take
    shared_share: float  # and of its shared memory


def max_blocks_per_sm(props: dict[str, Any]) -> int:
    cc = (int(props.get("computeMajor", 9)), int(props.get("computeMinor", 0)))
    return 16 if cc in ((7, 5), (8, 6), (8, 7), (8, 9)) else 32


def fit(k: Kernel, props: dict[str, Any]) -> Fit | None:
    """How the kernel's blocks fill the SMs by its launch resources (None without them)."""
    if k.blocks <= 0 or k.threads <= 0:
        return None
    sms = int(props["numSms"])
    warps = math.ceil(k.threads / 32)
    limits = [max_blocks_per_sm(props), int(props["maxThreadsPerMultiprocessor"]) // (warps * 32)]
    if k.registers > 0:  # registers are allocated per warp in units of 256
        per_warp = math.ceil(k.registers * 32 / 256) * 256
        limits.append(int(props["regsPerMultiprocessor"]) // (per_warp * warps))
    smem_per_sm = int(props["sharedMemPerMultiprocessor"])
    per_block_smem = k.shared_bytes + (1024 if props.get("computeMajor", 9) >= 8 else 0)
    if k.shared_bytes > 0:
        limits.append(smem_per_sm // per_block_smem)
    resident = max(1, min(limits))
    waves = k.blocks / (resident * sms)
    fill = waves / math.ceil(waves)
    held = min(resident, math.ceil(k.blocks / sms))  # blocks on a busy SM in the first wave
    return Fit(
        resident,
        waves,
        fill,
        min(1.0, held * warps * 32 / int(props["maxThreadsPerMultiprocessor"])),
        min(1.0, held * per_block_smem / smem_per_sm) if k.shared_bytes > 0 else 0.0,
    )


@dataclass
class BinRow:
    bin: int
    time_share: float
    kernels: float  # per iteration
    fill: float
    hold_us: float
    waves: float
    thread_share: float
    shared_share: float


def bins(rec: Recording, props: dict[str, Any]) -> tuple[float, list[BinRow]]:
    """(share of kernel time without launch resources, rows by SM-demand bin), time-weighted."""
    acc: dict[int, list[float]] = {}
    unknown = total = 0.0
    for k in rec.kernels:
        total += k.dur_ns
        f = fit(k, props)
        if f is None:
            unknown += k.dur_ns
            continue
        b = min(SM_BINS - 1, int(f.fill * SM_BINS))
        a = acc.setdefault(b, [0.0] * 7)
        w = k.dur_ns
        a[0] += w
        a[1] += 1
        a[2] += w * f.fill
        a[3] += w * k.dur_ns / math.ceil(f.waves)
        a[4] += w * f.waves
        a[5] += w * f.thread_share
        a[6] += w * f.shared_share
    rows = []
    for b in sorted(acc):
        a = acc[b]
        rows.append(
            BinRow(
                b,
                a[0] / total,
                a[1] / rec.iterations,
                a[2] / a[0],
                a[3] / a[0] / 1e3,
                a[4] / a[0],
                a[5] / a[0],
                a[6] / a[0],
            )
        )
    return (unknown / total if total else 0.0), rows


# ---------------------------------------------------------------- a job beside another


@dataclass
class Reference:
    """A job's kernels alone: duration by position in the iteration (where the
    sequence repeats) or by name and launch shape, and the gaps before each."""

    by_position: list[float] | None
    gap_before: list[float] | None
    by_key: dict[tuple[str, int, int], float]
    kernel_ns: float  # per iteration
    span_ns: float  # first start to last end of an iteration

    def duration(self, k: Kernel, position: int | None) -> float | None:
        if self.by_position is not None and position is not None and position < len(self.by_position):
            return self.by_position[position]
        return self.by_key.get((k.name, k.blocks, k.threads))


def span_ns(chunk: list[Kernel]) -> int:
    """An iteration's first start to its last end."""
    return max(k.end_ns for k in chunk) - chunk[0].start_ns


def reference(rec: Recording) -> Reference:
    chunks = rec.chunks()
    by_pos = gaps = None
    if rec.per_iteration is not None:
        by_pos = [statistics.median(c[i].dur_ns for c in chunks) for i in range(rec.per_iteration)]
        gaps = [0.0] + [
            statistics.median(c[i].start_ns - c[i - 1].end_ns for c in chunks) for i in range(1, rec.per_iteration)
        ]
    keyed: dict[tuple[str, int, int], list[int]] = {}
    for k in rec.kernels:
        keyed.setdefault((k.name, k.blocks, k.threads), []).append(k.dur_ns)
    spans = [span_ns(c) for c in chunks if c]
    return Reference(
        by_pos,
        gaps,
        {key: statistics.median(v) for key, v in keyed.items()},
        sum(k.dur_ns for k in rec.kernels) / rec.iterations,
        statistics.median(spans) if spans else 0.0,
    )


@dataclass
class MemberReport:
    job: str
    kernels_per_iteration: float
    kernel_ms_alone: float
    kernel_ms_pair: float
    stretch: float  # kernel time beside the other over alone
    span_ms_alone: float
    span_ms_pair: float
    overlapped: float  # share of its kernel time during which a kernel of the other ran
    by_meeting: dict[str, dict[str, float]] = field(default_factory=dict)  # alone / behind / ahead
    waits: int = 0  # kernels that became ready while a kernel of the other ran
    wait_over_left: float | None = None  # median of (extra wait to start) / (what that kernel had left)
    wait_ms_per_iteration: float | None = None  # extra waiting to start, per iteration
    covered: float = 1.0  # share of its recorded kernels in the stretch both recordings cover


class Timeline:
    """The other job's kernels, for overlap queries."""

    def __init__(self, kernels: list[Kernel]) -> None:
        self.kernels = sorted(kernels, key=lambda k: k.start_ns)
        self.starts = [k.start_ns for k in self.kernels]
        # kernels of one process may overlap (several streams): a running maximum of ends
        self.max_end: list[int] = []
        m = -(2**63)
        for k in self.kernels:
            m = max(m, k.end_ns)
            self.max_end.append(m)

    def overlapping(self, s: int, e: int) -> list[Kernel]:
        hi = bisect.bisect_left(self.starts, e)
        lo = bisect.bisect_left(self.max_end, s + 1)  # first index whose running end passes s
        return [k for k in self.kernels[lo:hi] if k.end_ns > s]

    def running_at(self, t: int) -> Kernel | None:
        """The kernel running at t with the most left to run."""
        found = [k for k in self.overlapping(t, t + 1) if k.start_ns <= t]
        return max(found, key=lambda k: k.end_ns) if found else None


def member_report(job: str, rec: Recording, ref: Reference, other: Recording) -> MemberReport:
    """One member beside the other, over the stretch both recordings cover (the
    other's kernels outside its recording are not known, so neither are this
    one's meetings there)."""
    tl = Timeline(other.kernels)
    lo = max(rec.kernels[0].start_ns, other.kernels[0].start_ns)
    hi = min(max(k.end_ns for k in rec.kernels), max(k.end_ns for k in other.kernels))

    def inside(k: Kernel) -> bool:
        return lo <= k.start_ns and k.end_ns <= hi

    meet: dict[str, list[float]] = {c: [0.0, 0.0] for c in MEETINGS}
    overlapped = total = 0.0
    counted = 0
    ratios: list[float] = []
    extra_wait = 0.0
    for chunk in rec.chunks():
        for i, k in enumerate(chunk):
            if not inside(k):
                continue
            counted += 1
            position = i if rec.per_iteration is not None else None
            alone = ref.duration(k, position)
            behind = ahead = 0
            for o in tl.overlapping(k.start_ns, k.end_ns):
                t = min(k.end_ns, o.end_ns) - max(k.start_ns, o.start_ns)
                if o.start_ns < k.start_ns:
                    behind += t
                else:
                    ahead += t
            total += k.dur_ns
            overlapped += min(k.dur_ns, behind + ahead)
            cls = "alone" if behind + ahead < k.dur_ns / 2 else ("behind" if behind >= ahead else "ahead")
            if alone:
                meet[cls][0] += k.dur_ns
                meet[cls][1] += alone
            if i == 0 or ref.gap_before is None or position is None or not inside(chunk[i - 1]):
                continue
            ready = chunk[i - 1].end_ns
            running = tl.running_at(ready)
            if running is None:
                continue
            wait = (k.start_ns - ready) - ref.gap_before[i]
            left = running.end_ns - ready
            if left > 0:
                ratios.append(max(0.0, wait) / left)
                extra_wait += max(0.0, wait)
    alone_total = sum(v[1] for v in meet.values())
    pair_total = sum(v[0] for v in meet.values())
    per_iteration = len(rec.kernels) / rec.iterations
    iterations = counted / per_iteration  # as many as the kernels counted make
    whole = [c for c in rec.chunks() if c and rec.per_iteration is not None and all(inside(k) for k in c)]
    spans = [span_ns(c) for c in whole]
    return MemberReport(
        job=job,
        kernels_per_iteration=per_iteration,
        kernel_ms_alone=ref.kernel_ns / 1e6,
        kernel_ms_pair=total / iterations / 1e6 if iterations else math.nan,
        stretch=pair_total / alone_total if alone_total else math.nan,
        span_ms_alone=ref.span_ns / 1e6,
        span_ms_pair=statistics.median(spans) / 1e6 if spans else math.nan,
        overlapped=overlapped / total if total else 0.0,
        by_meeting={
            c: {"time_share": v[0] / pair_total if pair_total else 0.0, "stretch": v[0] / v[1] if v[1] else math.nan}
            for c, v in meet.items()
        },
        waits=len(ratios),
        wait_over_left=statistics.median(ratios) if ratios else None,
        wait_ms_per_iteration=extra_wait / iterations / 1e6 if ratios else None,
        covered=counted / len(rec.kernels),
    )


def pair_reports(doc: dict[str, Any], mode: str) -> list[list[MemberReport]]:
    """Every recorded pair of `mode`, each member against its job alone (under MPS: alone under MPS)."""
    solo_key = "solo_mps" if mode.startswith("mps") and doc.get("solo_mps") else "solo"
    alone: dict[str, Reference] = {}
    for job, entry in doc.get(solo_key, {}).items():
        rec = recording(entry)
        if rec is not None:
            alone[job] = reference(rec)
    out = []
    for pair in doc.get("modes", {}).get(mode, {}).get("pairs", []):
        members = pair.get("members", [])
        recs = [recording(m) for m in members]
        if len(members) != 2 or any(r is None for r in recs):
            continue
        reports = []
        for m, rec, other in ((members[0], recs[0], recs[1]), (members[1], recs[1], recs[0])):
            assert rec is not None and other is not None
            if m["job"] in alone:
                reports.append(member_report(m["job"], rec, alone[m["job"]], other))
        if len(reports) == 2:
            out.append(reports)
    return out


# ---------------------------------------------------------------- output


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="mps_kernels.py",
        description="Read the kernels recorded by `benchmarks/collocation.py --kernels N` on a GPU: how each "
        "job's kernels fill the SMs alone, and how they stretch, overlap and wait beside another job's.",
    )
    p.add_argument("result", type=Path, help="the JSON file collocation.py wrote")
    p.add_argument("--mode", default="mps", help="which collocated runs to read: mps (default), time_slicing, ...")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the figures as JSON")
    args = p.parse_args(argv)
    try:
        doc = json.loads(args.result.read_text())
    except (OSError, json.JSONDecodeError) as e:
        print(f"mps_kernels.py: error: cannot read {args.result}: {e}", file=sys.stderr)
        return 2
    if not any((entry.get("kernels") or {}).get("rows") for entry in entries(doc)):
        print(
            f"mps_kernels.py: error: {args.result} holds no recorded kernels; run "
            "`benchmarks/collocation.py --kernels 3` on a GPU first",
            file=sys.stderr,
        )
        return 2
    for where, entry in labelled(doc):
        why = (entry.get("kernels") or {}).get("error")
        if why:
            print(f"no kernels for {where}: {why}")
    props = device_properties(doc)
    out: dict[str, Any] = {"device_properties": props, "alone": {}, "pairs": []}
    solo_key = "solo_mps" if args.mode.startswith("mps") and doc.get("solo_mps") else "solo"
    print(f"jobs alone ({solo_key}), kernels by SM-demand bin ({props['numSms']} SMs)")
    head = ("bin", 3), ("time", 5), ("k/it", 6), ("fill", 5), ("hold us", 8), ("waves", 6), ("thr", 5), ("smem", 5)
    print(f"{'job':24} " + " ".join(f"{h:>{w}}" for h, w in head))
    for job, entry in doc.get(solo_key, {}).items():
        rec = recording(entry)
        if rec is None:
            continue
        unknown, rows = bins(rec, props)
        out["alone"][job] = {"no_launch_shape": unknown, "bins": [asdict(b) for b in rows]}
        for b in rows:
            print(
                f"{job:24} {b.bin:3d} {b.time_share:5.2f} {b.kernels:6.1f} {b.fill:5.2f} {b.hold_us:8.1f} "
                f"{b.waves:6.1f} {b.thread_share:5.2f} {b.shared_share:5.2f}"
            )
    pairs = pair_reports(doc, args.mode)
    print(f"\n{args.mode}: each job beside the other (kernel ms per iteration alone -> beside; stretch by what")
    print("its kernels met; wait/left: median extra wait to start over what the other's kernel had left)")
    print(
        f"{'job':24} {'kernel ms':>15} {'stretch':>7} {'overlap':>7} {'alone':>11} {'behind':>11} {'ahead':>11} "
        f"{'wait/left':>9} {'wait ms/it':>10} {'covered':>7}"
    )
    for reports in pairs:
        out["pairs"].append([asdict(r) for r in reports])
        for r in reports:
            cells = [f"{fmt(r.by_meeting[c]['time_share'])}:{fmt(r.by_meeting[c]['stretch'])}" for c in MEETINGS]
            print(
                f"{r.job:24} {r.kernel_ms_alone:6.2f} -> {r.kernel_ms_pair:6.2f} {fmt(r.stretch):>7} "
                f"{r.overlapped:7.2f} {cells[0]:>11} {cells[1]:>11} {cells[2]:>11} "
                f"{fmt(r.wait_over_left):>9} {fmt(r.wait_ms_per_iteration):>10} {r.covered:7.2f}"
            )
        print()
    if not pairs:
        print(f"(no pair of mode {args.mode!r} with both members recorded)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
