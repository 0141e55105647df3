"""The import-time check that the running torch is the one the extension was built against
(torch_emugpu/_build_info.py), and what autoload does when it fails. The wheel's own refusals, in a
fresh environment, are in test_wheel.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

import torch_emugpu
from torch_emugpu import _build_info

REPO = Path(__file__).resolve().parents[2]


def test_the_same_release_passes_whatever_its_local_build():
    assert _build_info.torch_mismatch("2.14.1+cpu", {"torch": "2.14.1+cu130"}) is None
    assert _build_info.torch_mismatch("2.14.1", {"torch": "2.14.1+cu130"}) is None


def test_another_release_names_both_versions_and_both_fixes():
    err = _build_info.torch_mismatch("2.13.0+cpu", {"torch": "2.14.1+cu130"})
    assert isinstance(err, ImportError)
    text = str(err)
    assert "built against torch 2.14.1+cu130" in text and "has torch 2.13.0+cpu" in text
    assert "pip install torch==2.14.1" in text  # install the torch it needs
    assert "pip install --force-reinstall --no-deps" in text  # or rebuild against this one
    assert f"torch-emugpu {torch_emugpu.__version__}" in text


def test_a_build_without_its_facts_is_not_refused():
    # A build older than the check (or a bare CMake build) has no _build.json: _C's own import decides.
    assert _build_info.torch_mismatch("2.13.0", None) is None
    assert _build_info.torch_mismatch("2.13.0", {"compiler": "GNU 12"}) is None


def test_this_checkouts_build_facts_name_the_running_torch():
    info = _build_info.build_info()
    assert info is not None, f"no {_build_info.BUILD_FILE}: build the extension with setup.py"
    assert info["torch"] == torch.__version__
    assert info["cxx11_abi"] == int(torch._C._GLIBCXX_USE_CXX11_ABI)
    assert info["compiler"].split()[0] in ("GNU", "Clang", "AppleClang")


def _autoload(tmp_path: Path, run_mode: bool) -> subprocess.CompletedProcess:
    # A stand-in torch_emugpu whose import fails as the real one does beside the wrong torch.
    stub = tmp_path / "torch_emugpu"
    stub.mkdir(exist_ok=True)
    (stub / "__init__.py").write_text(
        "class TorchMismatchError(ImportError):\n    pass\n"
        "raise TorchMismatchError('torch-emugpu 0.1.0 was built against torch 9.9.9, but this environment has ...')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMUGPU_")}
    env.update(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}", EMUGPU_AUTOLOAD="1")  # "1": no torch import needed
    if run_mode:
        env["EMUGPU_AS_CUDA"] = "1"
    code = "import torch_emugpu_autoload; torch_emugpu_autoload.autoload(); print('returned')"
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )


def test_autoload_only_warns_so_that_import_torch_keeps_working(tmp_path):
    r = _autoload(tmp_path, run_mode=False)
    assert r.returncode == 0, r.stderr
    assert "returned" in r.stdout
    assert "built against torch 9.9.9" in r.stderr and "The emugpu device is not available" in r.stderr


def test_in_run_mode_autoload_raises(tmp_path):
    r = _autoload(tmp_path, run_mode=True)
    assert r.returncode != 0 and "returned" not in r.stdout
    assert "TorchMismatchError" in r.stderr and "built against torch 9.9.9" in r.stderr
