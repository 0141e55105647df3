"""The `torch-emugpu` command."""

from __future__ import annotations

import argparse
import sys


def _gpus(_: argparse.Namespace) -> int:
    import torch_emugpu

    for name in torch_emugpu.gpu_names():
        print(name)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from torch_emugpu import train

    parser = argparse.ArgumentParser(
        prog="torch-emugpu",
        description="Run PyTorch training on an emulated GPU: real scripts, GPU timing and memory, no GPU.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("train", help="run an emulated training job and print its summary",
                       description=train.__doc__)
    train.add_arguments(p)
    p.set_defaults(func=train.main)
    g = sub.add_parser("gpus", help="list the GPUs that can be emulated")
    g.set_defaults(func=_gpus)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, IndexError) as e:
        print(f"torch-emugpu: error: {e}", file=sys.stderr)
        return 2
    except __import__("torch").OutOfMemoryError as e:
        print(f"torch-emugpu: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    raise SystemExit(main())
