"""torch-emugpu doctor: what is installed and whether it works.

Prints the versions (torch-emugpu, torch, Python, and what the compiled
extension was built with), whether the extension loads, the daemon binary,
the configuration in force (each EMUGPU_* variable, the value the core parsed
and where it came from), the GPU catalog and the profiles found. Exits with 1
when something is broken, after saying what to do about each problem.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The variables torch-emugpu reads (docs/configuration.md), with the default each one leaves in force. The
# first group's values are parsed by the core and shown as parsed (Config's field in the second column).
PARSED: dict[str, tuple[str, str]] = {
    "EMUGPU_GPU": ("gpu", "NVIDIA A100-SXM4-40GB"),
    "EMUGPU_DEVICE_COUNT": ("device_count", "LOCAL_WORLD_SIZE if set, else 1"),
    "EMUGPU_MODE": ("mode", "timing"),
    "EMUGPU_CLOCK": ("clock", "real"),
    "EMUGPU_HOST": ("host", "measured"),
    "EMUGPU_HOST_SPEED": ("host_speed", "1"),
    "EMUGPU_HOST_COST": ("host_cost_file", "the H100 machine's host (modelled host only)"),
    "EMUGPU_CATALOG": ("catalog", "the packaged profiles/gpus.json"),
    "EMUGPU_EXCHANGE": ("exchange", "auto"),
    "EMUGPU_HOST_COPY_GBPS": ("host_copy_gbps", "14"),
    "EMUGPU_HOST_OP_US": ("host_op_us", "0 (this host's pace)"),
}
OTHER: dict[str, str] = {
    "EMUGPU_DAEMON": "unset: this process's GPUs are its own",
    "EMUGPU_PRIORITY": "0 (emugpud's priority policy)",
    "EMUGPU_MIG": "whole GPUs, no MIG layout",
    "EMUGPU_VISIBLE_DEVICES": "CUDA's default choice of devices",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100 (under an emugpud --sharing mps only)",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "no limit (under an emugpud --sharing mps only)",
    "EMUGPU_PROFILE_PATH": "none (the user directory and the packaged profiles)",
    "EMUGPU_PROFILES": "on",
    "EMUGPU_CALIBRATION": "on",
    "EMUGPU_PCIE_SHARED_BY": "1 (own link)",
    "EMUGPU_PCIE_UPLINK_GBPS": "the GPU's own link rate",
    "EMUGPU_NET_GBPS": "100",
    "EMUGPU_NET_LATENCY_US": "3",
    "EMUGPU_AS_CUDA": "unset: not run mode",
    "EMUGPU_AS_CUDA_REPORT": "unset",
    "EMUGPU_AS_CUDA_QUIET": "unset",
    "EMUGPU_AS_CUDA_GPUS": "unset",
    "EMUGPU_AUTOLOAD": "load unless a real CUDA GPU is present",
}
BUILD_ONLY = {"EMUGPU_BUILD_TYPE", "EMUGPU_BUILD_WITH_TORCH"}  # build-time (setup.py, build backend): not shown


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)

    def problem(self, what: str) -> None:
        self.problems.append(what)
        print(f"  PROBLEM: {what}")


def _section(title: str) -> None:
    print(f"\n{title}")


def _versions() -> dict[str, Any] | None:
    import torch

    import torch_emugpu
    from torch_emugpu import _build_info

    _section("Versions")
    print(f"  torch-emugpu  {torch_emugpu.__version__}  ({Path(torch_emugpu.__file__).parent})")
    print(f"  torch         {torch.__version__}  ({Path(torch.__file__).parent})")
    print(f"  Python        {platform.python_version()}  ({sys.executable})")
    info = _build_info.build_info()
    if info is None:
        print(f"  built with    unknown: no {_build_info.BUILD_FILE} (a build older than this check, or none)")
        return None
    abi = {0: "old (pre-C++11) libstdc++ ABI", 1: "C++11 libstdc++ ABI"}.get(info.get("cxx11_abi", -1), "?")
    print(
        f"  built with    torch {info.get('torch')}, {info.get('compiler')}, {abi}, Python {info.get('python')}, "
        f"{info.get('build_type')}, {info.get('system')}"
    )
    return info


def _extension(report: Report, info: dict[str, Any] | None) -> bool:
    import torch

    from torch_emugpu.device import _extension

    _section("Extension (torch_emugpu._C)")
    if _extension.MISMATCH is not None:
        report.problem(str(_extension.MISMATCH))
        return False
    if _extension._C is None:
        report.problem(f"it does not load: {_extension.ERROR}; {_extension.BUILD_HINT}")
        return False
    print(f"  loads: {_extension._C.__file__}")
    if info is not None:
        print(f"  built against torch {info.get('torch')}; running torch {torch.__version__}")
    return True


def _daemon(report: Report) -> None:
    from torch_emugpu.cli import daemon

    _section("Daemon (emugpud)")
    try:
        path = daemon.binary()
    except FileNotFoundError as e:
        report.problem(str(e))
        return
    if not os.access(path, os.X_OK):
        report.problem(f"{path} is not executable; reinstall torch-emugpu (or chmod +x it)")
        return
    try:
        r = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        report.problem(f"{path} does not run ({e}); reinstall torch-emugpu")
        return
    if r.returncode != 0:
        report.problem(f"{path} --help exited {r.returncode}: {r.stderr.strip()[:300]}; reinstall torch-emugpu")
        return
    print(f"  runs: {path}")


def _configuration(report: Report, loaded: bool) -> dict[str, Any] | None:
    _section("Configuration (variable, value in force, where it came from)")
    parsed: dict[str, Any] | None = None
    if loaded:
        import torch_emugpu

        try:
            parsed = vars(torch_emugpu.config())
        except (ValueError, RuntimeError, IndexError) as e:
            report.problem(f"the configuration does not parse: {e}")
    width = max(len(n) for n in (*PARSED, *OTHER))

    def row(name: str, value: Any, source: str) -> None:
        print(f"  {name:{width}}  {value}  ({source})")

    for name, (key, default) in PARSED.items():
        raw = os.environ.get(name)
        value = parsed[key] if parsed is not None else ("?" if raw is None else raw)
        if raw is not None:
            source = "environment" if parsed is None or str(value) == raw else f"environment: {raw!r}"
        elif name == "EMUGPU_DEVICE_COUNT" and os.environ.get("LOCAL_WORLD_SIZE"):
            source = "LOCAL_WORLD_SIZE"
        else:
            source = f"default: {default}"
        row(name, value, source)
    for name, default in OTHER.items():
        raw = os.environ.get(name)
        row(name, raw if raw is not None else "-", "environment" if raw is not None else f"default: {default}")
    unknown = sorted(n for n in os.environ if n.startswith("EMUGPU_") and n not in (*PARSED, *OTHER, *BUILD_ONLY))
    for name in unknown:
        print(f"  note: {name} is set but torch-emugpu reads no such variable (a typo?)")
    if parsed is None and not loaded:
        print("  (values not parsed: the extension did not load)")
    return parsed


def _search_path(loaded: bool) -> None:
    if not loaded:
        return
    from torch_emugpu.timing import profiles

    _section("Profile search path (first match wins)")
    paths = profiles.search_path()
    if not paths:
        print("  none: EMUGPU_PROFILES=off")
    for p in paths:
        print(f"  {p}{'' if p.is_dir() else '  (absent)'}")


def _catalog(parsed: dict[str, Any] | None) -> None:
    if parsed is None:
        return
    import torch_emugpu

    names = torch_emugpu.gpu_names()
    _section(f"GPU catalog: {len(names)} GPUs ({parsed['catalog']})")
    line = " "
    for name in names:
        if len(line) + len(name) + 2 > 100:
            print(line.rstrip(","))
            line = " "
        line += f" {name},"
    print(line.rstrip(","))
    print(f"  emulated now: {parsed['device_count']} x {parsed['gpu']}, {parsed['mode']} mode, {parsed['clock']} clock")


def _profiles(parsed: dict[str, Any] | None) -> None:
    if parsed is None:
        return
    from torch_emugpu.timing import profiles

    rows = profiles.available()
    _section(f"Profiles found: {len(rows)}")
    by_gpu: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_gpu.setdefault(r["gpu"], []).append(r)
    for gpu in sorted(by_gpu):
        print(f"  {gpu}")
        for r in sorted(by_gpu[gpu], key=lambda r: r["model"]):
            tables = "; ".join(
                f"batch {sizes[0]}-{sizes[-1]} ({len(sizes)} sizes) x{count} GPU" for count, sizes in r["tables"]
            )
            print(f"    {r['model']:22} {tables}")


def run(_: argparse.Namespace) -> int:
    report = Report()
    print("torch-emugpu doctor")
    info = _versions()
    loaded = _extension(report, info)
    _daemon(report)
    parsed = _configuration(report, loaded)
    steps: list[Callable[[], None]] = [
        lambda: _search_path(loaded),
        lambda: _catalog(parsed),
        lambda: _profiles(parsed),
    ]
    for step in steps:
        try:
            step()
        except (ValueError, RuntimeError, OSError) as e:
            report.problem(str(e))
    print()
    if report.problems:
        print(f"{len(report.problems)} problem(s):")
        for p in report.problems:
            print(f"  - {p}")
        return 1
    print("everything works")
    return 0
