"""The emulated H100 against the real one on the unseen models
(`benchmarks/unseen_models.py`; the real runs: `benchmarks/data/h100/unseen.json`),
per case and as median, 90th percentile and worst |error|.

The real runs record wall time per iteration (zero_grad, forward and loss to a
synchronise, backward and step to a synchronise), not the GPU's busy time. On
a real H100 some cases are host-bound: the GPU waits for Python, PyTorch and
the driver to launch its kernels (swin_t's and GPT-2 batch 4's iterations are
longer than their kernels). So each case is compared twice:

- `busy`: the emulated GPU's busy time per iteration against the real
  iteration (the cost model alone; a host-bound real case reads too fast);
- `as run`: the emulated iteration under the virtual clock with the modelled
  H100 host (`EMUGPU_CLOCK=virtual EMUGPU_HOST=modelled`: 22.2 us per op
  the script launches, 22.7 us per op of autograd's backward, 2.24 us more
  per tensor of a foreach op's lists, as `python -m
  torch_emugpu.measure.host_cost` measured on the H100's host), against the
  real iteration: the same metric on both sides.

`host` marks the cases whose emulated iteration is host-bound (as run more
than 10% above busy); busy time is summarised over all cases and over the
others, where busy time and iteration are the same metric. Peak memory is `max_memory_allocated` on both sides.

    # run the emulated cases (profiles off, the shipped H100 calibration), then compare
    python benchmarks/unseen_compare.py --out /tmp/unseen_emulated.json
    # compare a file written earlier by unseen_models.py --device emugpu
    python benchmarks/unseen_compare.py --emulated /tmp/unseen_emulated.json

Compiled cases are left out unless named with --cases (torch.compile on emugpu
times the graphs' ops, not Inductor's fused kernels).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "data" / "h100" / "unseen.json"
HOST_BOUND = 0.10  # as run this much above busy: the emulated iteration waits for its host


def p90(values: list[float]) -> float:
    """The 90th percentile, nearest rank (of 22 cases: the 20th)."""
    ranked = sorted(values)
    return ranked[max(0, math.ceil(0.9 * len(ranked)) - 1)]


def summary(label: str, errors: list[float]) -> str:
    if not errors:
        return f"{label}: no cases"
    a = [abs(e) for e in errors]
    return (
        f"{label}: median |error| {statistics.median(a):.1%}, p90 {p90(a):.1%}, max {max(a):.1%}, "
        f"median signed {statistics.median(errors):+.1%} over {len(a)} cases"
    )


def compare(reference: dict[str, Any], emulated: dict[str, Any]) -> dict[str, list[float]]:
    ref = {c["id"]: c for c in reference["cases"] if "error" not in c}
    print(f"{emulated.get('device')} against {reference.get('device')}")
    print(
        f"{'case':42} {'real ms':>8} {'busy ms':>8} {'error':>7} {'as run':>8} {'error':>7} {'host':>4} "
        f"{'real GiB':>8} {'emu GiB':>8} {'error':>7}"
    )
    out: dict[str, list[float]] = {"busy": [], "busy_device_bound": [], "as_run": [], "memory": []}
    for c in emulated["cases"]:
        r = ref.get(c["id"])
        if r is None or "error" in c:
            if "error" in c:
                print(f"{c['id']:42} failed: {c['error'].splitlines()[-1][:80]}")
            continue
        real = r["iteration_s"]
        busy = c.get("device_busy_s")
        if busy is None:
            raise SystemExit(f"{c['id']}: no device_busy_s; expected a file of unseen_models.py --device emugpu")
        eb, ea = busy / real - 1, c["iteration_s"] / real - 1
        host = c["iteration_s"] > busy * (1 + HOST_BOUND)
        out["busy"].append(eb)
        if not host:
            out["busy_device_bound"].append(eb)
        out["as_run"].append(ea)
        mem = ""
        if r.get("peak_bytes") and c.get("peak_bytes"):
            em = c["peak_bytes"] / r["peak_bytes"] - 1
            out["memory"].append(em)
            mem = f"{r['peak_bytes'] / 2**30:8.2f} {c['peak_bytes'] / 2**30:8.2f} {em:+7.1%}"
        print(
            f"{c['id']:42} {real * 1e3:8.2f} {busy * 1e3:8.2f} {eb:+7.1%} {c['iteration_s'] * 1e3:8.2f} {ea:+7.1%} "
            f"{'yes' if host else '':>4} {mem}"
        )
    print(summary("busy time against the real iteration", out["busy"]))
    print(summary("busy time, cases whose emulated iteration is not host-bound", out["busy_device_bound"]))
    print(summary("as run (virtual clock, modelled H100 host)", out["as_run"]))
    print(summary("peak memory", out["memory"]))
    return out


def run_emulated(out: Path, cases: str | None, warmup: int, iterations: int) -> None:
    ids = cases
    if ids is None:
        listed = subprocess.run(
            [sys.executable, str(HERE / "unseen_models.py"), "--list"], check=True, capture_output=True, text=True
        ).stdout.split()
        ids = ",".join(i for i in listed if not i.endswith("/compiled"))
    env = dict(os.environ)
    env.update({"EMUGPU_CLOCK": "virtual", "EMUGPU_HOST": "modelled", "EMUGPU_PROFILES": "off", "EMUGPU_GPU": "h100"})
    cmd = [sys.executable, str(HERE / "unseen_models.py"), "--device", "emugpu", "--out", str(out)]
    cmd += ["--cases", ids, "--warmup", str(warmup), "--iterations", str(iterations), "--budget-s", "1e9"]
    cmd += ["--no-progress"]
    subprocess.run(cmd, check=True, env=env)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--emulated", help="a JSON file of unseen_models.py --device emugpu")
    src.add_argument("--out", help="run the emulated cases first (virtual clock, modelled host), into this file")
    p.add_argument("--reference", default=str(REFERENCE), help=f"the real runs (default {REFERENCE.name} of H100)")
    p.add_argument("--cases", default=None, help="comma-separated case ids (default: all but the compiled ones)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up iterations per case (default 2)")
    p.add_argument("--iterations", type=int, default=3, help="measured iterations per case (default 3)")
    args = p.parse_args()
    path = Path(args.emulated or args.out)
    if args.out:
        run_emulated(path, args.cases, args.warmup, args.iterations)
    emulated = json.loads(path.read_text())
    if args.cases:
        wanted = set(args.cases.split(","))
        emulated["cases"] = [c for c in emulated["cases"] if c["id"] in wanted or c["model"] in wanted]
    compare(json.loads(Path(args.reference).read_text()), emulated)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
