"""The `torch-emugpu` command: its parser, and the subcommands small enough to live here."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _gpus(_: argparse.Namespace) -> int:
    import torch_emugpu

    for name in torch_emugpu.gpu_names():
        print(name)
    return 0


def _explain(args: argparse.Namespace) -> int:
    from torch_emugpu.cli import explain

    return explain.main(args)


def _train(args: argparse.Namespace) -> int:
    from torch_emugpu.cli import train

    return train.main(args)


def _run(args: argparse.Namespace) -> int:
    from torch_emugpu.cli import run

    return run.main(args)


def _doctor(args: argparse.Namespace) -> int:
    from torch_emugpu.cli import doctor

    return doctor.run(args)


def _profile(args: argparse.Namespace) -> int:
    from torch_emugpu.measure import profiler

    return profiler.main(args)


def _calibrate(args: argparse.Namespace) -> int:
    from torch_emugpu.measure import calibrate

    return calibrate.main(args)


def _import(args: argparse.Namespace) -> int:
    from torch_emugpu.measure import importers
    from torch_emugpu.measure.common import user_profile_dir

    out = Path(args.out) if args.out else user_profile_dir()
    written = importers.import_gpemu(
        args.src, out, progress=not args.no_progress, on_skip=lambda why: print(f"skipped {why}", file=sys.stderr)
    )
    print(f"wrote {len(written)} profiles under {out}")
    return 0


def _dataset(args: argparse.Namespace) -> int:
    from torch_emugpu.data import datasets

    return datasets.main(args)


def _profiles(args: argparse.Namespace) -> int:
    from torch_emugpu.timing import profiles

    rows = profiles.available()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print("no profiles found; searched: " + ", ".join(str(p) for p in profiles.search_path()))
        return 0
    width = max(len(r["gpu"]) for r in rows)
    print(f"{'GPU':{width}}  {'model':22} {'batch sizes':14} {'GPUs':5} source")
    for r in sorted(rows, key=lambda r: (r["gpu"], r["model"])):
        for count, sizes in r["tables"]:
            span = f"{sizes[0]}-{sizes[-1]} ({len(sizes)})"
            print(f"{r['gpu']:{width}}  {r['model']:22} {span:14} {count:<5} {r['path']}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from torch_emugpu.timing import profiles

    entry = profiles.find(args.gpu, args.model)
    doc = json.loads(Path(entry["path"]).read_text())
    print(f"{doc['model']} on {doc['gpu']}  ({entry['path']})")
    print(
        f"source: {doc['provenance']['source']}; torch {doc['provenance']['torch']}, "
        f"{doc['provenance']['dtype']}, {doc['provenance'].get('aggregation', '')}"
    )

    def ms(v: float | None) -> str:
        return f"{v * 1e3:10.2f}" if v is not None else f"{'-':>10}"

    def mib(v: float | None) -> str:
        return f"{v / 2**20:10.1f}" if v is not None else f"{'-':>10}"

    print(f"{'batch':>6} {'fwd ms':>10} {'bwd ms':>10} {'H2D ms':>10} {'peak MiB':>10} {'persist MiB':>11}")
    for b in doc["batches"]:
        print(
            f"{b['batch_size']:6d} {ms(b['forward_s'])} {ms(b['backward_s'])} "
            f"{ms(b.get('transfer_pageable_s'))} {mib(b.get('peak_bytes'))} {mib(b.get('persistent_bytes')):>11}"
        )
    if args.plot:
        profiles.plot(doc, args.plot)
        print(f"plot written to {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torch-emugpu",
        description="Run PyTorch training on an emulated GPU: real scripts, GPU timing and memory, no GPU.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from torch_emugpu.cli import train
    from torch_emugpu.measure import calibrate, profiler

    p = sub.add_parser("train", help="run an emulated training job and print its summary", description=train.__doc__)
    train.add_arguments(p)
    p.set_defaults(func=_train)

    from torch_emugpu.cli import explain

    ex = sub.add_parser(
        "explain",
        help="per op family, what the cost model charges a model's training iteration",
        description=explain.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain.add_arguments(ex)
    ex.set_defaults(func=_explain)

    from torch_emugpu.cli import run

    rn = sub.add_parser(
        "run",
        help='run a command written for CUDA, unmodified, on emulated GPUs (torch.cuda, "cuda", nccl)',
        description=run.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_arguments(rn)
    rn.set_defaults(func=_run)

    g = sub.add_parser("gpus", help="list the GPUs that can be emulated")
    g.set_defaults(func=_gpus)

    from torch_emugpu.cli import doctor

    dr = sub.add_parser(
        "doctor",
        help="versions, whether the extension and the daemon work, the configuration, the catalog and profiles",
        description=doctor.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dr.set_defaults(func=_doctor)

    pr = sub.add_parser(
        "profile",
        help="measure profiles on a real GPU (or the CPU) and write them",
        description=profiler.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    profiler.add_arguments(pr)
    pr.set_defaults(func=_profile)

    ca = sub.add_parser(
        "calibrate",
        help="measure a microbenchmark sweep on a real GPU for the per-op cost model",
        description=calibrate.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    calibrate.add_arguments(ca)
    ca.set_defaults(func=_calibrate)

    im = sub.add_parser("import", help="convert another profile database into torch-emugpu profiles")
    im.add_argument("format", choices=["gpemu"], help="gpemu: GPEmu's published profiled_data/ layout")
    im.add_argument("src", help="the directory to import (profiled_data/ or its parent)")
    im.add_argument("--out", default=None, help="output directory (default: the user profile directory)")
    im.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    im.set_defaults(func=_import)

    ls = sub.add_parser("profiles", help="list the profiles on the search path (GPU x model x batch sizes)")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(func=_profiles)

    sh = sub.add_parser("show", help="print (and plot) one profile: time and memory against batch size")
    sh.add_argument("gpu", help="GPU name, matched loosely (e.g. v100-pcie-32gb)")
    sh.add_argument("model", help="model name (e.g. resnet50)")
    sh.add_argument("--plot", default=None, metavar="PNG", help="also write a PNG plot (needs matplotlib)")
    sh.set_defaults(func=_show)

    from torch_emugpu.cli import daemon

    daemon.add_parsers(sub)
    ds = sub.add_parser("dataset", help="make or check an image dataset (ImageFolder layout)")
    dsub = ds.add_subparsers(dest="action", required=True, metavar="ACTION")
    mk = dsub.add_parser("make", help="write generated JPEGs: DIR/<class>/<index>.JPEG, then DIR/dataset.json")
    mk.add_argument(
        "kind",
        help="imagenet-like (pixel and file sizes like ImageNet-1k's training set) or fixed (every image --size WxH)",
    )
    mk.add_argument("dir", help="output directory (new or empty)")
    mk.add_argument("--images", type=int, required=True, help="number of images")
    mk.add_argument("--classes", type=int, default=None, help="number of classes (default 100, at most --images)")
    mk.add_argument("--seed", type=int, default=0, help="the same seed gives the same bytes (default 0)")
    mk.add_argument("--jobs", type=int, default=None, help="processes (default: the number of CPUs)")
    mk.add_argument("--size", default=None, metavar="WxH", help="every image's size (fixed kind only)")
    mk.add_argument("--quality", type=int, default=90, help="JPEG quality, 1..100 (default 90)")
    mk.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    ck = dsub.add_parser("check", help="scan DIR: images, classes, bytes and the files skipped, with reasons")
    ck.add_argument("dir", help="dataset directory (DIR/<class>/<image>)")
    ck.add_argument("--decode", action="store_true", help="also decode every image (slower; finds corrupt data)")
    ck.add_argument("--no-progress", action="store_true", help="hide the progress bar of --decode")
    ds.set_defaults(func=_dataset)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from torch_emugpu.data import WorkerDiedError

    try:
        return int(args.func(args))
    except (ValueError, IndexError, FileNotFoundError) as e:
        print(f"torch-emugpu: error: {e}", file=sys.stderr)
        return 2
    except WorkerDiedError as e:
        print(f"torch-emugpu: error: {e}", file=sys.stderr)
        return 1
    except torch.OutOfMemoryError as e:
        print(f"torch-emugpu: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    raise SystemExit(main())
