"""The modelled host against a real one, probe by probe.

Replays `torch_emugpu.measure.host_cost`'s five probes (a Python loop of bare
ops, one of views, a small module's forward, an autograd backward through a chain of tiny
ops, a foreach AdamW step) on the emulated GPU under the virtual clock with
the modelled host, and prints per probe: the units the real probe counted
(aten ops, or parameters for the optimizer), the ops the modelled host
charges (calls into the emulator; an output allocated just before its op is
part of that op), and the modelled host time against the real host's time
for the same step (the autograd probe's untimed forward left out) (`--reference`, by default the H100 machine's
`data/h100/host_cost.json`). A ratio above 1 means the modelled host is
slower than the real one for that kind of work.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch

import torch_emugpu
from torch_emugpu.measure import host_cost

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--reference",
        type=Path,
        default=HERE / "data" / "h100" / "host_cost.json",
        help="a host_cost.json measured on a CUDA machine (default: the shipped H100 one)",
    )
    parser.add_argument("--gpu", default="h100", help="the emulated GPU (default: h100)")
    args = parser.parse_args()
    reference = json.loads(args.reference.read_text())
    torch_emugpu.configure(gpu=args.gpu, clock="virtual", host="modelled")
    device = torch.device("emugpu")
    header = ("figure", "units", "calls", "calls/unit", "real us", "modelled us", "ratio")
    print(f"{header[0]:18s} " + " ".join(f"{h:>{w}s}" for h, w in zip(header[1:], (5, 6, 10, 9, 11, 6), strict=True)))
    for figure, make in host_cost.probes().items():
        if reference.get(figure) is None:
            print(f"{figure:18s} no reference figure ({figure} is null in {args.reference})")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the module probe's "no profile matched" warning
            probe = make(device)
            for _ in range(host_cost.WARMUP_STEPS):
                probe.step()
        calls, host_s = 0, 0.0
        if probe.untimed is not None:  # the step's untimed part (autograd's forward) is not the real figure's
            torch_emugpu.reset_clock_report()
            probe.untimed()
            before = torch_emugpu.clock_report()
            calls, host_s = -before["calls"], -before["host_s"]
        torch_emugpu.reset_clock_report()
        probe.step()
        stats = torch_emugpu.clock_report()
        calls += stats["calls"]
        real_us = reference[figure] * probe.units
        modelled_us = (host_s + stats["host_s"]) * 1e6
        print(
            f"{figure:18s} {probe.units:5d} {calls:6d} {calls / probe.units:10.2f} "
            f"{real_us:9.1f} {modelled_us:11.1f} {modelled_us / real_us:6.2f}"
        )


if __name__ == "__main__":
    main()
