"""The wheel's package list (pyproject.toml, explicit as the project's CMake
source lists are) names every package of the source tree: a subpackage left
out installs a torch_emugpu that fails at import (test_wheel.py shows it,
slowly; this catches it in the fast suite)."""

from __future__ import annotations

from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]


def test_every_package_of_the_tree_is_in_the_wheel() -> None:
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "torch_emugpu").rglob("__init__.py")}
    assert tree, "no packages found under torch_emugpu"
    assert tree == listed, (
        f"missing from pyproject.toml: {sorted(tree - listed)}; listed but absent: {sorted(listed - tree)}"
    )
