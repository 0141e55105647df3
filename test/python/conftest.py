"""Shared fixtures: every test starts from the default configuration."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

import torch_emugpu

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A run started in the background of a non-interactive shell (`cmd &`) inherits SIGINT ignored, and every
# process the tests start would too (an ignored signal stays ignored across exec): the Ctrl-C tests need it
# delivered as from a terminal. A handler of ours is reset to the default at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def free_port() -> int:
    """A loopback TCP port the kernel just handed out (a number drawn at random can be taken)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session", autouse=True)
def autograd_sized_for_every_test():
    """PyTorch's autograd engine sizes its per-device threads once, at the process's first backward,
    and configure() refuses more devices after that; a first backward on the most devices any test
    configures keeps each test file runnable alone, in any order."""
    torch_emugpu.configure(gpu=torch_emugpu._C.DEFAULT_GPU, device_count=4, mode="timing")
    torch.ones(1, device="emugpu", requires_grad=True).sum().backward()
    torch.emugpu.synchronize()
    yield


@pytest.fixture(autouse=True)
def default_config():
    """Configure the default GPU; tests that reconfigure are undone afterwards."""
    # A failed test's frames (and its device tensors) stay referenced from
    # sys.last_traceback; drop them so one failure does not fail the rest.
    sys.last_type = sys.last_value = sys.last_traceback = None
    gc.collect()
    cfg = torch_emugpu._C._configured() and torch_emugpu.config()
    if not cfg or (cfg.gpu, cfg.device_count) != (torch_emugpu._C.DEFAULT_GPU, 2):
        torch_emugpu.configure(gpu=torch_emugpu._C.DEFAULT_GPU, device_count=2, mode="timing")
    if torch_emugpu.config().clock != "real":  # a virtual-clock test left it on
        torch_emugpu.configure(clock="real", host="measured", host_speed=1.0)
    torch_emugpu.configure(mode="timing")
    yield
    gc.collect()
    torch.emugpu.synchronize()


@pytest.fixture
def virtual_clock() -> Iterator[None]:
    """The virtual clock with the modelled host: emulated times are exact, whatever else the machine does."""
    torch_emugpu.configure(clock="virtual", host="modelled")
    yield
    gc.collect()  # the test's tensors, so that the device may be reconfigured
    torch.emugpu.synchronize()
    torch_emugpu.configure(clock="real", host="measured", host_speed=1.0)


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for import-time and environment behaviour)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def run_example(script: str | os.PathLike[str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs an example or benchmark script as a user would, from the repository, without the test run's
    EMUGPU_ settings; fails the test with its error output if it exits non-zero."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    env["PYTHONPATH"] = REPO
    r = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@contextlib.contextmanager
def child_env(**env: str) -> Iterator[None]:
    """Environment variables for the children started inside (spawn copies os.environ)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def profile_search_dir(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, device_count: int
) -> Iterator[pathlib.Path]:
    """An EMUGPU_PROFILE_PATH directory and an empty user directory, on
    `device_count` T4s; the profile cache is reloaded after."""
    from torch_emugpu.timing import profiles

    monkeypatch.setenv("EMUGPU_PROFILE_PATH", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    (tmp_path / "env").mkdir()
    torch_emugpu.configure(gpu="t4", device_count=device_count)
    yield tmp_path / "env"
    monkeypatch.delenv("EMUGPU_PROFILE_PATH")
    profiles.reload()


def write_synthetic_profile(
    directory: pathlib.Path,
    model: str,
    batches: list[dict],
    parameters: int | None,
    gpu: str = "Tesla T4",
    name: str | None = None,
    **extra: object,
) -> pathlib.Path:
    """A synthetic profile of `model` (fingerprint: its parameter count, if
    given) for `gpu`; `extra` adds top-level fields (`data_parallel`)."""
    doc = {
        "schema": "torch-emugpu profile v1",
        "gpu": gpu,
        "model": model,
        "fingerprint": {"parameters": parameters} if parameters else None,
        "provenance": {
            "tool": "test",
            "torch": torch.__version__,
            "dtype": "float32",
            "date": "2026-11-22",
            "source": "synthetic test profile",
        },
        "batches": batches,
        **extra,
    }
    path = directory / (name or f"{model}.json")
    path.write_text(json.dumps(doc))
    return path
