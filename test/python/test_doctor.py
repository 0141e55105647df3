"""`torch-emugpu doctor`: versions, the extension, the daemon, the configuration, the catalog and the
profiles; exit status 1, with what to do, when something is broken."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_emugpu
from torch_emugpu.cli import daemon, doctor

REPO = Path(__file__).resolve().parents[2]


def _doctor(**env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "torch_emugpu", "doctor"], env=full, capture_output=True, text=True, timeout=120
    )


def test_in_process_everything_works(capsys):
    assert doctor.run(argparse.Namespace()) == 0
    out = capsys.readouterr().out
    assert f"torch-emugpu  {torch_emugpu.__version__}" in out
    assert f"torch         {torch.__version__}" in out
    assert f"built with    torch {torch.__version__}" in out
    assert f"loads: {torch_emugpu._C.__file__}" in out
    assert f"runs: {daemon.binary()}" in out
    assert "EMUGPU_GPU" in out and "EMUGPU_CLOCK" in out
    assert "NVIDIA H100 80GB HBM3" in out  # the catalog, and the shipped profiles' GPU
    assert "resnet50" in out and "batch 32-256" in out
    assert out.rstrip().endswith("everything works")


def test_a_missing_daemon_is_a_problem_with_what_to_do(capsys, monkeypatch):
    def missing() -> Path:
        raise FileNotFoundError("emugpud is not built: expected /nowhere/bin/emugpud; reinstall the package")

    monkeypatch.setattr(daemon, "binary", missing)
    assert doctor.run(argparse.Namespace()) == 1
    out = capsys.readouterr().out
    assert "PROBLEM: emugpud is not built" in out
    assert "1 problem(s):" in out and "reinstall the package" in out


def test_a_daemon_that_does_not_run_is_a_problem(capsys, monkeypatch, tmp_path):
    fake = tmp_path / "emugpud"
    fake.write_text("#!/bin/sh\necho 'cannot open shared object' >&2\nexit 127\n")
    fake.chmod(0o755)
    monkeypatch.setattr(daemon, "binary", lambda: fake)
    assert doctor.run(argparse.Namespace()) == 1
    assert "--help exited 127: cannot open shared object" in capsys.readouterr().out


@pytest.mark.slow
def test_the_environment_shows_parsed_with_its_source_and_typos_are_named():
    r = _doctor(EMUGPU_GPU="v100", EMUGPU_DEVICE_COUNT="3", EMUGPU_GPUS="2")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("  EMUGPU_")}
    # The core's parse of a loose name, and the text it was given.
    assert "Tesla V100" in rows["EMUGPU_GPU"] and "environment: 'v100'" in rows["EMUGPU_GPU"]
    assert "  3  (environment)" in rows["EMUGPU_DEVICE_COUNT"]
    assert "(default: timing)" in rows["EMUGPU_MODE"]
    assert "EMUGPU_GPUS is set but torch-emugpu reads no such variable" in r.stdout
    assert "emulated now: 3 x Tesla V100" in r.stdout


@pytest.mark.slow
def test_a_configuration_that_does_not_parse_exits_1_naming_it():
    r = _doctor(EMUGPU_GPU="h1000")
    assert r.returncode == 1
    assert "PROBLEM: the configuration does not parse" in r.stdout
    assert "h1000" in r.stdout
    assert "EMUGPU_GPU" in r.stdout and "Versions" in r.stdout  # the rest still printed
