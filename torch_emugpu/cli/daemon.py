"""emugpud, the sharing daemon, from the command line: `torch-emugpu daemon`
(and the `emugpud` command) start it with the package's GPU catalog;
`torch-emugpu smi` shows its GPUs and the processes attached, as nvidia-smi
does for a real node.

Processes attach with EMUGPU_DAEMON=ADDRESS: their emulated GPUs are then the
daemon's, and their allocations together stay within each GPU's memory."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from torch_emugpu import sharing_policy

_PACKAGE = Path(__file__).resolve().parents[1]

QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "memory.used",
    "memory.free",
    "utilization.gpu",
    "processes",
)
SHARING_POLICIES = ("time-slice", "fair", "fifo", "priority", "mps", "none")


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


def sharing_spec(sharing: str) -> str:
    """emugpud's --sharing for `sharing`: a policy's name, plugin:PATH, exec:COMMAND, or python:FILE (run by
    torch_emugpu.sharing_policy; its file is loaded here first, so that a broken one fails before the daemon starts)."""
    if sharing.startswith("python:"):
        file = Path(sharing.removeprefix("python:")).resolve()
        sharing_policy.load(file)
        return "exec:" + shlex.join([sys.executable, "-m", "torch_emugpu.sharing_policy", str(file)])
    return sharing


def _sharing(value: str) -> str:
    if value in SHARING_POLICIES or value.startswith(("python:", "plugin:", "exec:")):
        return value
    raise argparse.ArgumentTypeError(
        f"expected one of {', '.join(SHARING_POLICIES)}, python:FILE, plugin:PATH or exec:COMMAND, got {value!r}"
    )


def command(gpus: str | None, listen: str | None, sharing: str | None = None, mig: str | None = None) -> list[str]:
    """The daemon's command line."""
    cmd = [str(binary()), "--catalog", str(catalog())]
    if gpus:
        cmd += ["--gpus", gpus]
    if mig:
        cmd += ["--mig", mig]
    if listen:
        cmd += ["--listen", listen]
    if sharing:
        cmd += ["--sharing", sharing_spec(sharing)]
    return cmd


def run(args: argparse.Namespace) -> int:
    """`torch-emugpu daemon`: replaces this process with emugpud (it stops on SIGINT or SIGTERM)."""
    cmd = command(args.gpus, args.listen, args.sharing, args.mig)
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


def gpu_utilization(s: dict[str, Any], index: int) -> int:
    """Percent of the recent window the GPU ran some process's kernels, as nvidia-smi's utilization.gpu:
    the chance that any attached process had work, from their busy fractions."""
    idle = 1.0
    for p in s["processes"]:
        idle *= 1.0 - min(1.0, max(0.0, p["busy"][index]))
    return round(100 * (1.0 - idle))


def _users(s: dict[str, Any], index: int) -> list[dict[str, Any]]:
    return [p for p in s["processes"] if p["bytes"][index] > 0 or p["busy"][index] > 0]


def device_id(gpu: dict[str, Any]) -> str:
    """A device as nvidia-smi numbers it: "1" for a whole GPU, "1:2" for its MIG instance 2."""
    return str(gpu["gpu"]) if gpu["instance"] < 0 else f"{gpu['gpu']}:{gpu['instance']}"


def device_name(gpu: dict[str, Any]) -> str:
    return gpu["name"] if gpu["instance"] < 0 else f"{gpu['name']} MIG {gpu['mig_profile']}"


def _csv(s: dict[str, Any], fields: list[str], header: bool, units: bool) -> list[str]:
    def value(gpu: dict[str, Any], field: str) -> str:
        unit = " MiB" if units else ""
        return {
            "index": device_id(gpu),
            "name": device_name(gpu),
            "uuid": gpu["uuid"] or "-",
            "memory.total": f"{_mib(gpu['capacity'])}{unit}",
            "memory.used": f"{_mib(gpu['used'])}{unit}",
            "memory.free": f"{_mib(gpu['capacity'] - gpu['used'])}{unit}",
            "utilization.gpu": f"{gpu_utilization(s, gpu['index'])}{' %' if units else ''}",
            "processes": str(len(_users(s, gpu["index"]))),
        }[field]

    def title(f: str) -> str:
        if units and f.startswith("memory."):
            return f + " [MiB]"
        return f + (" [%]" if units and f.startswith("utilization.") else "")

    lines = [", ".join(title(f) for f in fields)] if header else []
    lines += [", ".join(value(g, f) for f in fields) for g in s["gpus"]]
    return lines


def _table(s: dict[str, Any]) -> list[str]:
    lines = [f"emugpud at {s['address']}, sharing {s['sharing']}", ""]
    lines.append(f"{'GPU':>4}  {'Name':40} {'Memory-Usage':>22}  {'GPU-Util':>8}  {'Processes':>9}")
    for g in s["gpus"]:
        usage = f"{_mib(g['used'])}MiB / {_mib(g['capacity'])}MiB"
        util = f"{gpu_utilization(s, g['index'])}%"
        users = len(_users(s, g["index"]))
        lines.append(f"{device_id(g):>4}  {device_name(g)[:40]:40} {usage:>22}  {util:>8}  {users:>9}")
    mig = [g for g in s["gpus"] if g["instance"] >= 0]
    if mig:
        lines += ["", f"{'MIG':>4}  {'Profile':8}  UUID (EMUGPU_VISIBLE_DEVICES or, under torch-emugpu run, CUDA's)"]
        lines += [f"{device_id(g):>4}  {g['mig_profile']:8}  {g['uuid']}" for g in mig]
    lines += ["", f"{'GPU':>4}  {'PID':>8}  {'Clock':7} {'GPU Memory':>12}  {'SM':>4}  {'Share':>5}  Process"]
    rows = [(g, p) for p in s["processes"] for g in range(len(s["gpus"])) if p in _users(s, g)]
    if not rows:
        lines.append("     no process uses a GPU" if s["processes"] else "     no process attached")
    for g, p in rows:
        sm, share = f"{round(100 * p['busy'][g])}%", f"{round(100 * p['share'][g])}%"
        gpu, memory = device_id(s["gpus"][g]), f"{_mib(p['bytes'][g]):>9}MiB"
        lines.append(f"{gpu:>4}  {p['pid']:>8}  {p['clock']:7} {memory}  {sm:>4}  {share:>5}  {p['name'][:60]}")
    idle = [p for p in s["processes"] if not any(p in _users(s, g) for g in range(len(s["gpus"])))]
    for p in idle:
        lines.append(f"{'-':>4}  {p['pid']:>8}  {p['clock']:7} {0:>9}MiB  {'-':>4}  {'-':>5}  {p['name'][:60]}")
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


def top(args: argparse.Namespace) -> int:
    """`torch-emugpu top`: smi's table, refreshed every --interval seconds until Ctrl-C (or --count times)."""
    import time

    shown = 0
    clear = "\033[H\033[2J" if sys.stdout.isatty() else ""
    try:
        while args.count is None or shown < args.count:
            try:
                lines = _table(status(args.address))
            except RuntimeError as e:  # the daemon went away: say so and stop, as smi does
                print(f"torch-emugpu top: {e}", file=sys.stderr)
                return 2
            stamp = time.strftime("%H:%M:%S")
            print(clear + "\n".join([f"{lines[0]}  ({stamp}, every {args.interval:g} s)"] + lines[1:]), flush=True)
            shown += 1
            if args.count is None or shown < args.count:
                time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    return 0


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


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
        "--mig",
        metavar="LAYOUT",
        help="split each GPU into MIG instances, e.g. 3g.40gb,2g.20gb,1g.10gb,1g.10gb (nvidia-smi's profile names); "
        "each is a device of its own, selected with EMUGPU_VISIBLE_DEVICES",
    )
    d.add_argument(
        "--listen",
        metavar="ADDRESS",
        help="unix:PATH (only this user may attach) or tcp:HOST:PORT; default $XDG_RUNTIME_DIR/emugpud.sock",
    )
    d.add_argument(
        "--sharing",
        type=_sharing,
        metavar="POLICY",
        help="how the attached processes' kernels share each GPU: time-slice (the CUDA driver's default, "
        "and this default), fair, fifo (one iteration each in turn, as GPEmu), priority (EMUGPU_PRIORITY), "
        "mps (kernels of several processes at once, as NVIDIA's MPS; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and "
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT apply), none (memory only); or your own: python:FILE (its function "
        "share(me, others), torch_emugpu.sharing_policy), plugin:PATH.so (a C function, csrc/daemon/emugpu_policy.h) "
        "or exec:COMMAND",
    )
    d.set_defaults(func=run)
    s = sub.add_parser("smi", help="show emugpud's GPUs and the processes attached, as nvidia-smi does")
    s.add_argument("--address", help="the daemon's address (default: EMUGPU_DAEMON, else the default socket)")
    s.add_argument("--query-gpu", metavar="FIELDS", help=f"comma-separated fields: {', '.join(QUERY_FIELDS)}")
    s.add_argument("--format", metavar="FORMAT", help="with --query-gpu: csv[,noheader][,nounits]")
    s.set_defaults(func=smi)
    t = sub.add_parser("top", help="smi's table of emugpud's GPUs and processes, live (Ctrl-C stops it)")
    t.add_argument("--address", help="the daemon's address (default: EMUGPU_DAEMON, else the default socket)")
    t.add_argument("--interval", type=_positive, default=1.0, help="seconds between refreshes (default 1)")
    t.add_argument("--count", type=int, help="stop after this many refreshes (default: until Ctrl-C)")
    t.set_defaults(func=top)
