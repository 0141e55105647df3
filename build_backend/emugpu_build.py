"""The PEP 517 build backend of torch-emugpu: setuptools', made to build against the right torch.

The extension must compile against the torch it will run with. pip's build isolation runs a backend with
the interpreter of the environment being installed into, but hides that environment's site-packages; a
static build requirement on torch would then make pip fetch another torch (gigabytes, maybe another
version). So the hooks first look for a torch already installed: the target environment's own
site-packages (pip), then the activated virtual environment's (`python -m build` and uv build with an
interpreter of their own, run from an activated venv). Only where neither has one do they ask the frontend
for the torch release this version is tested with (TESTED_TORCH, or EMUGPU_BUILD_WITH_TORCH=X.Y.Z), which it
installs into its isolated environment, as torchvision's source builds do; the wheel then pins that torch.
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (the hooks not wrapped below, e.g. build_sdist)

# The torch release this version is tested with (scripts/setup.sh installs the same; a test keeps them equal).
TESTED_TORCH = "2.14.1"


def _has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def _site_dirs_of_active_venv() -> list[str]:
    """The activated virtual environment's site-packages, where it serves this interpreter's Python version."""
    venv = os.environ.get("VIRTUAL_ENV")
    if not venv:
        return []
    lib = Path(venv) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    return [str(lib)] if lib.is_dir() else []


def _see_installed_torch() -> None:
    if _has_torch():
        return
    known = set(sys.path)
    candidates = [sysconfig.get_path(key) for key in ("purelib", "platlib")] + _site_dirs_of_active_venv()
    for directory in dict.fromkeys(candidates):
        if directory in known:
            continue
        # addsitedir appends after the isolated directories and reads the directory's .pth files, as the
        # interpreter does outside isolation.
        site.addsitedir(directory)
        if _has_torch():
            return


def _torch_to_install() -> list[str]:
    """Nothing where a torch can be seen; else the tested torch, for the frontend's isolated environment.
    EMUGPU_BUILD_WITH_TORCH picks another release; set empty, nothing is asked for (setup.py then says what to run)."""
    _see_installed_torch()
    if _has_torch():
        return []
    version = os.environ.get("EMUGPU_BUILD_WITH_TORCH", TESTED_TORCH).strip()
    return [f"torch=={version}"] if version else []


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    return _setuptools.get_requires_for_build_wheel(config_settings) + _torch_to_install()


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    _see_installed_torch()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    _see_installed_torch()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    return _setuptools.get_requires_for_build_editable(config_settings) + _torch_to_install()


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    _see_installed_torch()
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    _see_installed_torch()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
