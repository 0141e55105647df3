"""Run a command written for CUDA on emulated GPUs, unmodified.

    torch-emugpu run --gpu h100 -- python train.py --device cuda
    torch-emugpu run --gpu a100 --gpus 8 -- torchrun --nproc-per-node 8 train.py

Inside CMD (and every process it starts: torchrun workers, mp.spawn, DataLoader
workers), `import torch` brings the emulated GPUs in as CUDA: torch.cuda.*,
"cuda"/"cuda:N" device arguments, .cuda(), autocast and GradScaler for "cuda",
and the nccl backend (as `emu`). The same mode without this command: set
EMUGPU_AS_CUDA=1 (and EMUGPU_GPU, EMUGPU_DEVICE_COUNT) in the environment.
See the README's "Running existing scripts" for what cannot be covered.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", default=None, help="the GPU to emulate, e.g. h100, a100 (`torch-emugpu gpus` lists them)")
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        metavar="N",
        help="emulated GPUs per process (default: torchrun's LOCAL_WORLD_SIZE, else 1); "
        "CUDA_VISIBLE_DEVICES narrows them as it does CUDA's",
    )
    p.add_argument("--mode", choices=["timing", "compute"], default=None, help="timing (default) or compute")
    p.add_argument("--clock", choices=["real", "virtual"], default=None, help="real (default) or virtual")
    p.add_argument(
        "--report",
        action="store_true",
        help="at exit, each process prints per emulated GPU it used: peak memory and compute busy time",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command to run")


def environment(args: argparse.Namespace, base: dict[str, str]) -> dict[str, str]:
    """The environment CMD runs in: run mode on, the options as EMUGPU_* variables."""
    env = dict(base)
    env["EMUGPU_AS_CUDA"] = "1"
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"  # torch imports the autoload entry point that installs the mode
    env.pop("EMUGPU_AS_CUDA_GPUS", None)  # a fresh count: this run's, not an enclosing run's
    if args.gpu is not None:
        env["EMUGPU_GPU"] = args.gpu
    if args.gpus is not None:
        env["EMUGPU_DEVICE_COUNT"] = str(args.gpus)
    if args.mode is not None:
        env["EMUGPU_MODE"] = args.mode
    if args.clock is not None:
        env["EMUGPU_CLOCK"] = args.clock
    if args.report:
        env["EMUGPU_AS_CUDA_REPORT"] = "1"
    return env


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError(
            "run: expected a command after the options, e.g. `torch-emugpu run --gpu h100 -- python train.py`"
        )
    if args.gpus is not None and args.gpus < 1:
        raise ValueError(f"run: --gpus expects at least 1 GPU, got {args.gpus}")
    if args.gpu is not None:
        import torch_emugpu

        torch_emugpu.configure(gpu=args.gpu)  # an unknown name fails here, once, with the catalog's message
    executable = shutil.which(command[0])
    if executable is None:
        raise FileNotFoundError(f"run: command not found: {command[0]!r} (expected a program on PATH or a path)")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(executable, command, environment(args, dict(os.environ)))
