"""The PEP 517 build backend of torch-emugpu: setuptools', made to build against the torch already installed.

The extension must compile against the torch it will run with. pip's build isolation runs a backend with
the interpreter of the environment being installed into, but hides that environment's site-packages; a
build requirement on torch would then make pip fetch another torch (gigabytes, maybe another version). So
the hooks that build the extension put the environment's own site-packages back, after the isolated ones:
`pip install .` then compiles against the installed torch. Frontends that build with an interpreter of
their own (`python -m build` without --no-isolation, uv) still see no torch; setup.py then stops with the
commands to run.
"""

from __future__ import annotations

import site
import sys
import sysconfig
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (the hooks not wrapped below, e.g. build_sdist)


def _see_installed_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        known = set(sys.path)
        # addsitedir also reads the directory's .pth files, as the interpreter does outside isolation.
        for directory in dict.fromkeys(sysconfig.get_path(key) for key in ("purelib", "platlib")):
            if directory not in known:
                site.addsitedir(directory)


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    _see_installed_torch()
    return _setuptools.get_requires_for_build_wheel(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    _see_installed_torch()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    _see_installed_torch()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    _see_installed_torch()
    return _setuptools.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    _see_installed_torch()
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    _see_installed_torch()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
