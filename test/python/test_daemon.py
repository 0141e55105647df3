"""emugpud: processes attached to one daemon share its GPUs' memory; a process
that dies releases what it held at once; `torch-emugpu smi` shows the daemon's
view; and the failures a user meets (no daemon, another GPU or clock, a
daemon restarted under a process) are clear errors.

Each test starts its own daemon on a socket in its temporary directory and
stops it with SIGTERM; every wait is bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO

from torch_emugpu.cli import daemon as daemon_cli

pytestmark = pytest.mark.slow  # processes and a daemon: scripts/test.sh --fast leaves them out

TIMEOUT = 60
GIB = 2**30

# A process that attaches, allocates GIB GiB on emugpu:0, says so, and waits for a line on stdin.
HOLDER = """
import sys, torch, torch_emugpu
try:
    x = torch.empty(int(sys.argv[1]) << 28, device="emugpu")
    print("holding", torch.emugpu.memory_allocated(), flush=True)
except torch.OutOfMemoryError as e:
    print("oom", str(e).replace("\\n", " "), flush=True)
sys.stdin.readline()
if len(sys.argv) > 2:
    try:
        y = torch.empty(int(sys.argv[2]) << 28, device="emugpu")
        print("holding more", flush=True)
    except RuntimeError as e:
        print("error", type(e).__name__, str(e).replace("\\n", " "), flush=True)
"""


class Daemon:
    def __init__(self, tmp: Path, gpus: str = "h100:2", sharing: str | None = None, mig: str | None = None) -> None:
        self.address = f"unix:{tmp / 'emugpud.sock'}"
        self.proc = subprocess.Popen(
            daemon_cli.command(gpus, self.address, sharing, mig),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.banner = self.proc.stdout.readline()  # printed once it listens
        assert "listening on" in self.banner, self.proc.stderr.read() if self.proc.stderr else ""

    def status(self) -> dict:
        return daemon_cli.status(self.address)

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        self.proc.send_signal(sig)
        out, _ = self.proc.communicate(timeout=TIMEOUT)
        return self.proc.returncode, out


@pytest.fixture
def emugpud(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    yield d
    if d.proc.poll() is None:
        d.stop()


def env(address: str, **extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    e.update(EMUGPU_DAEMON=address, **extra)
    return e


def holder(address: str, gib: int, more: int | None = None, **extra: str) -> subprocess.Popen:
    args = [sys.executable, "-c", HOLDER, str(gib)] + ([str(more)] if more is not None else [])
    return subprocess.Popen(
        args, env=env(address, **extra), cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def allocate_once(address: str, **extra: str) -> subprocess.CompletedProcess:
    """A process that attaches with `extra` in its environment and allocates one element."""
    return subprocess.run(
        [sys.executable, "-c", "import torch, torch_emugpu; torch.empty(1, device='emugpu')"],
        env=env(address, **extra),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=REPO,
    )


def first_line(p: subprocess.Popen) -> str:
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line, f"process {p.pid} said nothing (exit {p.poll()})"
    return line.strip()


def finish(p: subprocess.Popen) -> str:
    out, _ = p.communicate("go\n", timeout=TIMEOUT)
    return out.strip()


def used_gib(d: Daemon, gpu: int = 0) -> float:
    return d.status()["gpus"][gpu]["used"] / GIB


def test_processes_share_a_gpus_memory_and_the_one_that_does_not_fit_is_out_of_memory(emugpud: Daemon) -> None:
    a = holder(emugpud.address, 50)
    assert first_line(a).startswith("holding")
    b = holder(emugpud.address, 40)
    refused = first_line(b)
    assert refused.startswith("oom"), refused
    assert "Other processes sharing this GPU through emugpud hold 50.00 GiB" in refused
    finish(b)
    assert used_gib(emugpud) == pytest.approx(50)
    finish(a)  # exits: its memory goes back
    c = holder(emugpud.address, 70)
    assert first_line(c).startswith("holding")
    finish(c)


def test_a_killed_process_releases_its_memory_when_its_socket_closes(emugpud: Daemon) -> None:
    a = holder(emugpud.address, 60)
    assert first_line(a).startswith("holding")
    assert used_gib(emugpud) == pytest.approx(60)
    a.kill()
    a.wait(TIMEOUT)
    deadline = time.monotonic() + 10  # at once in practice; bounded loosely so that a loaded host cannot fail it
    while used_gib(emugpud) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert used_gib(emugpud) == 0
    assert emugpud.status()["processes"] == []


def test_attached_processes_get_the_daemons_gpus(emugpud: Daemon) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch, torch_emugpu; a = torch_emugpu._C._daemon_attachment(); "
            "print(torch.emugpu.device_count(), torch.emugpu.get_device_name(1), a['address'])",
        ],
        env=env(emugpud.address),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "NVIDIA", "H100", "80GB", "HBM3", emugpud.address]


def test_smi_shows_the_gpus_and_the_processes_holding_memory(emugpud: Daemon) -> None:
    a = holder(emugpud.address, 2)
    assert first_line(a).startswith("holding")
    cli = [sys.executable, "-m", "torch_emugpu.cli", "smi", "--address", emugpud.address]
    table = subprocess.run(cli, capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO)
    assert table.returncode == 0, table.stderr
    assert "NVIDIA H100 80GB HBM3" in table.stdout and "2048MiB / 80790MiB" in table.stdout
    assert f"{a.pid}" in table.stdout and "real" in table.stdout
    csv = subprocess.run(
        [
            *cli,
            "--query-gpu",
            "index,memory.used,memory.free,utilization.gpu,processes",
            "--format",
            "csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=REPO,
    )
    assert csv.returncode == 0, csv.stderr
    assert csv.stdout.splitlines() == ["0, 2048, 78742, 0, 1", "1, 0, 80790, 0, 0"]  # it launched nothing
    live = [sys.executable, "-m", "torch_emugpu.cli", "top", "--address", emugpud.address, "--count", "2"]
    top = subprocess.run([*live, "--interval", "0.05"], capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO)
    assert top.returncode == 0, top.stderr
    assert top.stdout.count("2048MiB / 80790MiB") == 2 and "every 0.05 s" in top.stdout
    bad = subprocess.run([*cli, "--query-gpu", "fan.speed"], capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO)
    assert bad.returncode == 2 and "unknown field(s) fan.speed" in bad.stderr
    finish(a)


def test_no_daemon_at_the_address_is_an_error_naming_it_and_how_to_start_one(tmp_path: Path) -> None:
    address = f"unix:{tmp_path / 'nobody.sock'}"
    p = holder(address, 1)
    out = finish(p)
    assert p.returncode != 0
    smi = subprocess.run(
        [sys.executable, "-m", "torch_emugpu.cli", "smi", "--address", address],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=REPO,
    )
    assert smi.returncode == 2
    assert f"no daemon answers at {address}" in smi.stderr and "torch-emugpu daemon" in smi.stderr
    assert "holding" not in out


def test_another_gpu_model_or_clock_is_refused_naming_both(emugpud: Daemon) -> None:
    gpu = allocate_once(emugpud.address, EMUGPU_GPU="a100")
    assert gpu.returncode != 0
    assert "asks for NVIDIA A100" in gpu.stderr and "owns 2 x NVIDIA H100 80GB HBM3" in gpu.stderr
    a = holder(emugpud.address, 1)
    assert first_line(a).startswith("holding")
    virtual = allocate_once(emugpud.address, EMUGPU_CLOCK="virtual")
    assert virtual.returncode != 0
    assert "runs the virtual clock" in virtual.stderr and f"process {a.pid}" in virtual.stderr
    finish(a)


def test_a_daemon_restarted_under_a_process_fails_it_clearly(tmp_path: Path) -> None:
    d = Daemon(tmp_path)
    a = holder(d.address, 1, more=1)
    assert first_line(a).startswith("holding")
    assert d.stop()[0] == 0
    d = Daemon(tmp_path)  # the same address, a new daemon that never knew the process
    try:
        out = finish(a)
        assert "error RuntimeError" in out and "lost the daemon" in out, out
        assert used_gib(d) == 0
    finally:
        d.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_daemon_stops_cleanly_and_removes_its_socket(tmp_path: Path, sig: int) -> None:
    d = Daemon(tmp_path)
    a = holder(d.address, 1)
    assert first_line(a).startswith("holding")
    code, out = d.stop(sig)
    assert code == 0 and "emugpud: stopped" in out
    assert not (tmp_path / "emugpud.sock").exists()
    finish(a)
