"""Sharing policies for emugpud written in Python.

`torch-emugpu daemon --sharing python:my_policy.py` runs `my_policy.py`'s
function `share(me, others)` for every share report a process sends (every
2 ms of real time while it launches work): `me` and `others` (the processes
with work on the same GPU recently) are `Sharer`s, and the function returns
the fraction of the GPU's speed `me`'s kernels get while it has work (the
daemon keeps it within [0.01, 1]). For example, shortest iteration first::

    def share(me, others):
        busy = [o for o in others if o.busy > 0]
        return 1.0 if all(me.iteration_ns <= o.iteration_ns for o in busy) else 0.0

The daemon runs this module as a program (`python -m torch_emugpu.sharing_policy
FILE`) and asks it one line per report (emugpud's custom_policy.h). A
function that raises, or a program that stops answering, makes the daemon
time-slice from then on (it says so on its standard error). Each answer is a
round trip to this process (tens of microseconds), inside the daemon's loop.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["Sharer", "load", "serve"]


@dataclass(frozen=True)
class Sharer:
    """What a process reported about its compute on one GPU (docs/gpu-sharing.md)."""

    busy: float  # fraction of the recent window its compute engine had work, [0, 1]
    iteration_ns: int  # its compute between host waits, alone on the GPU
    priority: int  # EMUGPU_PRIORITY
    demand: float  # fraction of the GPU's SMs its kernels hold while they run
    hold_ns: int  # how long its kernels' blocks hold an SM


Policy = Callable[[Sharer, list[Sharer]], float]


def load(path: str | Path) -> Policy:
    """The function `share` of the Python file `path`; ValueError saying what is missing."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--sharing python:{path}: expected a Python file defining share(me, others), found none")
    namespace = runpy.run_path(str(file))
    share = namespace.get("share")
    if not callable(share):
        raise ValueError(f"--sharing python:{path}: expected a function share(me, others) in it, found none")
    return share


def _parse(line: str) -> tuple[Sharer, list[Sharer]]:
    fields = line.split()
    count = int(fields[0])
    if len(fields) != 1 + 5 * (count + 1):
        raise ValueError(f"expected {1 + 5 * (count + 1)} fields, got {len(fields)}")
    sharers = [
        Sharer(float(b), int(i), int(p), float(d), int(h))
        for b, i, p, d, h in zip(*[iter(fields[1:])] * 5, strict=True)
    ]
    return sharers[0], sharers[1:]


def serve(policy: Policy, requests: IO[str] = sys.stdin, answers: IO[str] = sys.stdout) -> None:
    """Answers emugpud's share requests with `policy` until the daemon closes the pipe."""
    for line in requests:
        me, others = _parse(line)
        answers.write(f"{float(policy(me, others))!r}\n")
        answers.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m torch_emugpu.sharing_policy",
        description="Serves a Python sharing policy to emugpud (torch-emugpu daemon --sharing python:FILE runs this).",
    )
    parser.add_argument("file", help="a Python file defining share(me, others) -> float")
    args = parser.parse_args(argv)
    serve(load(args.file))


if __name__ == "__main__":
    main()
