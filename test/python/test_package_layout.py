"""The package's layout (torch_emugpu/README.md): no import circle between its
modules, and measuring tools that run without the compiled extension.

The graph is read from the source with `ast`, so it sees every import a
module can make: at module level, inside functions (the lazy ones only run on
some paths, and so escape a test that merely imports), and under
TYPE_CHECKING. A module's import of its parent package, which Python makes
implicitly before any submodule, is not an edge: every module has it.
"""

from __future__ import annotations

import ast
import json
import pathlib

import pytest
from conftest import REPO, run_python

PACKAGE = "torch_emugpu"
ROOT = pathlib.Path(REPO) / PACKAGE
EXTENSION = f"{PACKAGE}._C"
# Run on a CUDA machine with plain PyTorch (benchmarks/measure_on_gpu.sh), where the extension is not built.
MEASURING_TOOLS = f"{PACKAGE}.measure"


def _modules() -> dict[str, pathlib.Path]:
    """Dotted name -> source file, packages under their own name (their __init__.py)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _target(name: str, known: set[str]) -> str | None:
    """The module of the package that importing `name` (a module or a name inside one) reaches."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, the extension included."""
    modules = _modules()
    known = set(modules) | {EXTENSION}
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [_target(alias.name, known) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import name`: the submodule pkg.name if there is one, else pkg itself
                targets = [
                    _target(f"{base}.{alias.name}", known) if f"{base}.{alias.name}" in known else _target(base, known)
                    for alias in node.names
                ]
            else:
                continue
            graph[name].update(t for t in targets if t is not None and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def path_to(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """The import chain [start, ..., goal], or None where `start` never reaches `goal`."""
    came_from: dict[str, str] = {}
    queue = [start]
    while queue:
        node = queue.pop(0)
        if node == goal:
            chain = [goal]
            while chain[-1] != start:
                chain.append(came_from[chain[-1]])
            return chain[::-1]
        for nxt in sorted(graph[node]):
            if nxt not in came_from and nxt != start:
                came_from[nxt] = node
                queue.append(nxt)
    return None


def _measuring_tools() -> list[str]:
    return sorted(m for m in _modules() if m == MEASURING_TOOLS or m.startswith(MEASURING_TOOLS + "."))


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    # relative (`from .. import _C`), absolute, submodule-by-name and function-level imports all count
    assert f"{PACKAGE}.device.memory" in graph[f"{PACKAGE}.device.device_module"]
    assert EXTENSION in graph[f"{PACKAGE}.distributed"]
    assert f"{PACKAGE}.measure.preprocessing_profiler" in graph[f"{PACKAGE}.measure.profiler"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert path_to({"a": {"b"}, "b": {"c"}, "c": set()}, "a", "c") == ["a", "b", "c"]


def test_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_measuring_tools_never_reach_the_extension():
    # Nor, so, the package's __init__, which imports it.
    graph = import_graph()
    tools = _measuring_tools()
    assert len(tools) >= 7, tools
    for tool in tools:
        chain = path_to(graph, tool, EXTENSION)
        assert chain is None, f"{tool} needs the extension: " + " -> ".join(chain or [])


@pytest.mark.slow
def test_measuring_tools_import_without_the_extension():
    # A CUDA machine without the build, where the extension cannot be found: the package's
    # __init__ tries it and goes on without; the tools must import, and never try it again.
    # (`from torch_emugpu import _C` would quietly get the None the __init__ leaves: the
    # test above, on the source, is the one that sees it.)
    code = f"""
import importlib, json, sys, warnings

tried = []

class NoExtension:
    def find_spec(self, name, path=None, target=None):
        if name == {EXTENSION!r}:
            tried.append(name)
            raise ImportError("blocked: as on a machine where the extension was not built")
        return None

sys.meta_path.insert(0, NoExtension())
warnings.simplefilter("ignore")  # the package says once that the extension is missing
import torch_emugpu
by_package = list(tried)
tried.clear()
failed = {{}}
for name in {_measuring_tools()!r}:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = repr(e)
print(json.dumps({{"by_package": by_package, "by_tools": tried, "failed": failed,
                  "loaded": {EXTENSION!r} in sys.modules}}))
"""
    r = run_python(code, env={"EMUGPU_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["by_package"] == [EXTENSION]  # so the block works
    assert result["failed"] == {}
    assert result["by_tools"] == []
    assert result["loaded"] is False
