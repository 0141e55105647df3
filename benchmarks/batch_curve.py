"""Batch sizes between profiled ones: the straight line against the cost model's curve.

For every shipped profile with at least three batch sizes, each middle point is
left out in turn and predicted from the others: once by the straight line
between its neighbours (the first occurrence of a batch size, and every
occurrence before issue 28), once along the cost model's curve through them
(csrc/core/batch_curve.h), which the emulator uses from a region's second
occurrence on. Each case runs the model on the emulated GPU of the profile at
the left-out batch size under the virtual clock, with only the reduced profile
on the search path, and reads region_report()'s targets. Printed: per case and
region the error of each prediction against the left-out measurement, then the
median, 90th percentile and largest |error| of each.

    python benchmarks/batch_curve.py [--models resnet50 vgg11 ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "profiles"


def shipped_profiles() -> list[tuple[Path, dict[str, Any]]]:
    """Shipped profiles with at least three batch sizes on one GPU."""
    out = []
    for path in sorted(SHIPPED.glob("*/*.json")):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and len(doc.get("batches", [])) >= 3:
            out.append((path, doc))
    return out


def predict(doc: dict[str, Any], left_out: int) -> dict[str, dict[str, Any]]:
    """Runs `doc`'s model at batch `left_out` with that point removed; per region, the targets."""
    import torch
    import torchvision

    import torch_emugpu
    from torch_emugpu import _C
    from torch_emugpu.timing import profiles

    reduced = dict(doc, batches=[b for b in doc["batches"] if b["batch_size"] != left_out])
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / f"{doc['model']}.json").write_text(json.dumps(reduced))
        os.environ["EMUGPU_PROFILE_PATH"] = directory
        profiles.reload()
        dev = torch.device("emugpu", 0)
        model = torchvision.models.get_model(doc["model"], num_classes=1000).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
        x = torch.empty(left_out, *doc.get("input", {}).get("shape", [3, 224, 224]), device=dev)
        y = torch.zeros(left_out, dtype=torch.long, device=dev)
        targets: dict[str, dict[str, Any]] = {}
        # The first iteration takes the straight line; from the second on, its ops bend it.
        for iteration in range(3):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            torch.emugpu.synchronize()
            if iteration not in (0, 2):
                continue
            for r in torch_emugpu.region_report():
                if r["key"].startswith(f"{doc['model']}@{left_out}:"):
                    targets.setdefault(r["key"].rsplit(":", 1)[1], {})[r["target_from"]] = r["target_s"]
        # The cost model's curve each region was bent along, for a look at the joint (kCurveExponent).
        for region, column in (("forward", "forward_s"), ("backward", "backward_s")):
            points = [(b["batch_size"], b[column]) for b in reduced["batches"]]
            bent = _C._region_curve_target(0, f"{doc['model']}@{left_out}:{region}", left_out, points)
            if bent is not None and region in targets:
                targets[region]["curve"] = {
                    "fixed_s": bent["cost_model_fixed_s"],
                    "variable_s": bent["cost_model_variable_s"],
                    "points": points,
                }
        del model, opt, x, y
    return targets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", nargs="*", help="only these models (default: every shipped profile with >= 3 sizes)"
    )
    parser.add_argument("--json", type=Path, help="also write the cases as JSON here")
    args = parser.parse_args()
    os.environ.setdefault("EMUGPU_CLOCK", "virtual")
    os.environ.setdefault("EMUGPU_HOST", "modelled")
    warnings.filterwarnings("ignore")
    import torch_emugpu

    cases = []
    for _path, doc in shipped_profiles():
        if args.models and doc["model"] not in args.models:
            continue
        torch_emugpu.configure(gpu=doc["gpu"], device_count=1)
        sizes = [b["batch_size"] for b in doc["batches"]]
        for left_out in sizes[1:-1]:
            measured = next(b for b in doc["batches"] if b["batch_size"] == left_out)
            for region, t in predict(doc, left_out).items():
                truth = measured["forward_s" if region == "forward" else "backward_s"]
                case = {"model": doc["model"], "batch": left_out, "region": region, "measured_s": truth}
                for method, target in t.items():
                    if method == "curve":
                        case["curve"] = target
                    else:
                        case[method] = target / truth - 1
                cases.append(case)
                line = " ".join(
                    f"{m}: {100 * case[m]:+6.1f}%" for m in ("straight line", "cost-model curve") if m in case
                )
                print(
                    f"{doc['model']:20s} b{left_out:<4d} {region:8s} measured {truth * 1e3:7.2f} ms  {line}", flush=True
                )
    print()
    for method in ("straight line", "cost-model curve"):
        errors = sorted(abs(c[method]) for c in cases if method in c)
        if not errors:
            continue
        p90 = errors[min(len(errors) - 1, round(0.9 * (len(errors) - 1)))]
        print(
            f"{method:17s} |error| over {len(errors)} cases: median {100 * statistics.median(errors):.1f}%, "
            f"p90 {100 * p90:.1f}%, max {100 * errors[-1]:.1f}%"
        )
    if args.json:
        args.json.write_text(json.dumps(cases, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
