"""emugpud, the sharing daemon, from the command line: `torch-emugpu daemon`
(and the `emugpud` command) start it with the package's GPU catalog;
`torch-emugpu smi` shows its GPUs and the processes attached, as nvidia-smi
does for a real node.

Processes attach with EMUGPU_DAEMON=ADDRESS: their emulated GPUs are then the
daemon's, and their allocations together stay within each GPU's memory."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

_PACKAGE = Path(__file__).resolve().parents[1]

QUERY_FIELDS = ("index", "name", "memory.total", "memory.used", "memory.free", "processes")


def binary() -> Path:
    """The emugpud executable built with the package."""
    path = _PACKAGE / "bin" / "emugpud"
    if not path.is_file():
        raise FileNotFoundError(
            f"emugpud is not built: expected {path}; reinstall the package "
            f"(pip install --no-build-isolation -e . in a checkout)"
        )
    return path


def catalog() -> Path:
    """The GPU catalog the package's devices read (EMUGPU_CATALOG, else the packaged gpus.json)."""
    if os.environ.get("EMUGPU_CATALOG"):
        return Path(os.environ["EMUGPU_CATALOG"])
    for candidate in (_PACKAGE / "profiles" / "gpus.json", _PACKAGE.parent / "profiles" / "gpus.json"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no GPU catalog: expected {_PACKAGE / 'profiles' / 'gpus.json'}")


def command(gpus: str | None, listen: str | None) -> list[str]:
    """The daemon's command line."""
    cmd = [str(binary()), "--catalog", str(catalog())]
    if gpus:
        cmd += ["--gpus", gpus]
    if listen:
        cmd += ["--listen", listen]
    return cmd


def run(args: argparse.Namespace) -> int:
    """`torch-emugpu daemon`: replaces this process with emugpud (it stops on SIGINT or SIGTERM)."""
    cmd = command(args.gpus, args.listen)
    sys.stdout.flush()
    os.execv(cmd[0], cmd)
    return 0  # not reached


def emugpud() -> int:
    """The `emugpud` command: the daemon with the package's catalog unless --catalog is given."""
    argv = sys.argv[1:]
    cmd = [str(binary())] + ([] if "--catalog" in argv else ["--catalog", str(catalog())]) + argv
    os.execv(cmd[0], cmd)
    return 0  # not reached


def status(address: str | None) -> dict[str, Any]:
    from torch_emugpu import _C

    if _C is None:
        raise RuntimeError("torch_emugpu._C is not built; `torch-emugpu smi` needs it")
    return dict(_C._daemon_status(address or os.environ.get("EMUGPU_DAEMON") or _C._daemon_default_address()))


def _mib(n: int) -> int:
    return n // 2**20


def _csv(s: dict[str, Any], fields: list[str], header: bool, units: bool) -> list[str]:
    def value(gpu: dict[str, Any], field: str) -> str:
        unit = " MiB" if units else ""
        return {
            "index": str(gpu["index"]),
            "name": gpu["name"],
            "memory.total": f"{_mib(gpu['capacity'])}{unit}",
            "memory.used": f"{_mib(gpu['used'])}{unit}",
            "memory.free": f"{_mib(gpu['capacity'] - gpu['used'])}{unit}",
            "processes": str(sum(1 for p in s["processes"] if p["bytes"][gpu["index"]] > 0)),
        }[field]

    lines = [", ".join(f + (" [MiB]" if units and f.startswith("memory.") else "") for f in fields)] if header else []
    lines += [", ".join(value(g, f) for f in fields) for g in s["gpus"]]
    return lines


def _table(s: dict[str, Any]) -> list[str]:
    lines = [f"emugpud at {s['address']}", ""]
    lines.append(f"{'GPU':>3}  {'Name':32} {'Memory-Usage':>22}  {'Processes':>9}")
    for g in s["gpus"]:
        users = sum(1 for p in s["processes"] if p["bytes"][g["index"]] > 0)
        usage = f"{_mib(g['used'])}MiB / {_mib(g['capacity'])}MiB"
        lines.append(f"{g['index']:>3}  {g['name'][:32]:32} {usage:>22}  {users:>9}")
    lines += ["", f"{'GPU':>3}  {'PID':>8}  {'Clock':7} {'GPU Memory':>12}  Process"]
    rows = [(g, p) for p in s["processes"] for g, b in enumerate(p["bytes"]) if b > 0]
    if not rows:
        lines.append("     no process holds memory" if s["processes"] else "     no process attached")
    for g, p in rows:
        lines.append(f"{g:>3}  {p['pid']:>8}  {p['clock']:7} {_mib(p['bytes'][g]):>9}MiB  {p['name'][:60]}")
    idle = [p for p in s["processes"] if not any(p["bytes"])]
    for p in idle:
        lines.append(f"{'-':>3}  {p['pid']:>8}  {p['clock']:7} {0:>9}MiB  {p['name'][:60]}")
    return lines


def smi(args: argparse.Namespace) -> int:
    """`torch-emugpu smi`: the daemon's GPUs and processes, as a table or as nvidia-smi's CSV queries."""
    try:
        s = status(args.address)
    except RuntimeError as e:  # no daemon there: say so, as a command does
        print(f"torch-emugpu smi: {e}", file=sys.stderr)
        return 2
    if args.query_gpu:
        fields = [f.strip() for f in args.query_gpu.split(",") if f.strip()]
        unknown = [f for f in fields if f not in QUERY_FIELDS]
        if unknown:
            raise ValueError(f"--query-gpu: unknown field(s) {', '.join(unknown)}; known: {', '.join(QUERY_FIELDS)}")
        options = set(args.format.split(",")) if args.format else {"csv"}
        if "csv" not in options or not options <= {"csv", "noheader", "nounits"}:
            raise ValueError(f"--format: expected csv[,noheader][,nounits], got {args.format!r}")
        print("\n".join(_csv(s, fields, "noheader" not in options, "nounits" not in options)))
        return 0
    print("\n".join(_table(s)))
    return 0


def add_parsers(sub: Any) -> None:
    """The `daemon` and `smi` subcommands."""
    d = sub.add_parser(
        "daemon",
        help="run emugpud: GPUs that several processes share (EMUGPU_DAEMON=ADDRESS attaches them)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("--gpus", metavar="MODEL[:COUNT]", help="the GPUs: a catalog name or alias and how many")
    d.add_argument(
        "--listen",
        metavar="ADDRESS",
        help="unix:PATH (only this user may attach) or tcp:HOST:PORT; default $XDG_RUNTIME_DIR/emugpud.sock",
    )
    d.set_defaults(func=run)
    s = sub.add_parser("smi", help="show emugpud's GPUs and the processes attached, as nvidia-smi does")
    s.add_argument("--address", help="the daemon's address (default: EMUGPU_DAEMON, else the default socket)")
    s.add_argument("--query-gpu", metavar="FIELDS", help=f"comma-separated fields: {', '.join(QUERY_FIELDS)}")
    s.add_argument("--format", metavar="FORMAT", help="with --query-gpu: csv[,noheader][,nounits]")
    s.set_defaults(func=smi)
