"""Regression suite for other users and the network: shared memory that cannot
collide between jobs or be planted by another user, and nothing from the
network unpickled or executed. A hostile second user is simulated with uid
65534 where the tests run as root."""

from __future__ import annotations

import ast
import os
import pathlib
import signal
import struct
import subprocess
import sys
import time

import pytest
from conftest import free_port

REPO = str(pathlib.Path(__file__).resolve().parents[2])
SHM = pathlib.Path("/dev/shm")
PCIE_PREFIX = f"emugpu-u{os.geteuid()}-pcie-"

# Configures two emulated GPUs behind one PCIe uplink, as a torchrun rank
# does, says "ready" and waits for a line on stdin.
HOLD = """
import sys, torch, torch_emugpu
torch.ones(1, device="emugpu:0")
print("ready", flush=True)
sys.stdin.readline()
"""


def job_env(port: str, run_id: str = "none") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    env.update(
        PYTHONPATH=REPO,
        EMUGPU_DEVICE_COUNT="2",
        EMUGPU_PCIE_SHARED_BY="2",
        TORCHELASTIC_RUN_ID=run_id,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
        GROUP_RANK="0",
        LOCAL_WORLD_SIZE="2",
    )
    return env


def pcie_segments() -> set[str]:
    return {p.name for p in SHM.iterdir() if p.name.startswith(PCIE_PREFIX)}


def start_holding(env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"the job did not start: {proc.communicate(timeout=60)[1][-2000:]}")
    return proc


def start_job(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """A holding job and the one PCIe segment it made."""
    before = pcie_segments()
    proc = start_holding(env)
    made = pcie_segments() - before
    assert len(made) == 1, made
    return proc, made.pop()


def stop(proc: subprocess.Popen[str]) -> None:
    """Ends a holding job normally (its exit removes its segment)."""
    proc.communicate("\n", timeout=60)
    assert proc.returncode == 0


def a_free_port_text() -> str:
    return str(free_port())


@pytest.mark.slow
def test_two_jobs_with_torchruns_default_run_id_get_their_own_pcie_segments() -> None:
    first, mine = start_job(job_env(a_free_port_text()))
    try:
        # another job, another rendezvous endpoint: start_job fails if it made no segment of its own
        second, theirs = start_job(job_env(a_free_port_text()))
        stop(second)
        assert theirs != mine
    finally:
        stop(first)


@pytest.mark.slow
def test_sigterm_removes_a_jobs_pcie_segment() -> None:
    proc, name = start_job(job_env(a_free_port_text()))
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM  # still ends as SIGTERM would
    assert not (SHM / name).exists()


@pytest.mark.slow
def test_the_next_job_sweeps_a_sigkilled_jobs_segment() -> None:
    proc, name = start_job(job_env(a_free_port_text()))
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert (SHM / name).exists()  # nothing ran at the kill
    time.sleep(2.5)  # segments younger than 2 s may be between creation and lock: left alone
    stop(start_holding(job_env(a_free_port_text())))
    assert not (SHM / name).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a segment as another user needs root (setuid to 65534)")
@pytest.mark.slow
def test_a_segment_planted_by_another_user_is_refused_naming_its_owner() -> None:
    env = job_env(a_free_port_text())
    proc, name = start_job(env)  # learn the job's segment name
    stop(proc)
    planted = SHM / name
    assert not planted.exists()  # removed at the job's exit
    pid = os.fork()
    if pid == 0:  # the hostile user: world-writable, every uplink busy until INT64_MAX
        try:
            os.setuid(65534)
            fd = os.open(planted, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
            os.fchmod(fd, 0o666)
            os.write(fd, struct.pack("<q", 2**63 - 1) * 128)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the second user could not plant the segment"
    try:
        job = subprocess.run(
            [sys.executable, "-c", 'import torch, torch_emugpu; torch.ones(1, device="emugpu:0")'],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert job.returncode != 0
        assert "(uid 65534) with mode 0666" in job.stderr, job.stderr[-2000:]
        assert "will not use it" in job.stderr
    finally:
        planted.unlink(missing_ok=True)


UNPICKLING = {"loads", "load", "Unpickler", "eval", "exec"}
# Local inter-process channels of one user's own processes, never the network.
LOCAL_ONLY = {
    "torch_emugpu/data/datasets.py": "exceptions of `dataset make`'s own forked workers, over a multiprocessing queue",
}


def test_no_module_unpickles_or_evaluates_anything() -> None:
    # What ranks read from the store or their peers is parsed by the C++ backend as numbers and quoted text
    # (CollectiveWords.AReportFromTheStoreIsOnlyQuotedPrintableAndShort); the Python package must not add a
    # path that turns bytes into objects or code.
    found = []
    for path in pathlib.Path(REPO, "torch_emugpu").rglob("*.py"):
        if str(path.relative_to(REPO)) in LOCAL_ONLY:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            builtin = isinstance(func, ast.Name) and name in {"eval", "exec"}  # not model.eval()
            if (owner in {"pickle", "marshal", "dill", "torch"} and name in UNPICKLING) or builtin:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {owner}.{name}")
    assert not found, found


WORKER = """
import os, time, torch, torch_emugpu
torch.ones(1, device=f"emugpu:{os.environ['LOCAL_RANK']}")
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_sigterm_to_the_torchrun_agent_leaves_no_segment(tmp_path: pathlib.Path) -> None:
    # How Slurm and Kubernetes stop a job: the agent gets SIGTERM and passes it to its workers.
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EMUGPU_", "TORCHELASTIC_", "MASTER_"))}
    env.update(PYTHONPATH=REPO, EMUGPU_PCIE_SHARED_BY="2")
    before = pcie_segments()
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2"]
        + ["--master-addr", "127.0.0.1", "--master-port", a_free_port_text(), str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert agent.stdout is not None
        ready = 0
        seen: list[str] = []
        while ready < 2:
            line = agent.stdout.readline()
            assert line, "torchrun ended before its workers were ready:\n" + "".join(seen[-40:])
            seen.append(line)
            ready += line.strip().endswith("ready")
        (name,) = pcie_segments() - before  # both ranks of the node share one, named for the default run id
        assert "-pcie-none-" in name
        agent.send_signal(signal.SIGTERM)
        agent.communicate(timeout=120)
    finally:
        agent.kill()
    assert not (SHM / name).exists()
