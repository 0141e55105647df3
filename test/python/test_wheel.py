"""The wheel, as a user gets it: `python -m build --wheel --no-isolation` (reusing build/torch, so nothing
recompiles), installed with pip in fresh virtual environments. Each environment sees the project's torch
through a .pth file instead of installing a second one (gigabytes): a directory of links to the project's
site-packages, less its own editable torch-emugpu. There the wheel installs, imports, trains one step on
emugpu and passes `torch-emugpu doctor`; beside another torch pip refuses it, and, forced in, its import
stops naming both versions. Also: the build backend under pip's isolation, and a build that sees no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SITE = Path(torch.__file__).resolve().parents[1]  # the project environment's site-packages
TORCH = torch.__version__
PUBLIC_TORCH = TORCH.split("+")[0]
OWN = ("torch_emugpu", "__editable__", "__editable___torch_emugpu")


def _env(**extra: str) -> dict[str, str]:
    # No configuration of ours, no package index (nothing may be downloaded), no autoload of the
    # project's checkout through PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EMUGPU_", "PIP_")) and k != "PYTHONPATH"}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.update(extra)
    return env


def _run(cmd: list[str], timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=_env(**env), capture_output=True, text=True, timeout=timeout, cwd="/")


def _shared_site(root: Path, keep: Callable[[str], bool]) -> Path:
    """Links to the project's site-packages entries that `keep` accepts."""
    shared = root / "shared-site"
    shared.mkdir()
    for entry in SITE.iterdir():
        if keep(entry.name):
            (shared / entry.name).symlink_to(entry)
    return shared


def _venv(root: Path, shared: Path) -> Path:
    """A fresh virtual environment that sees `shared` after its own site-packages; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "shared_project_site.pth").write_text(f"{shared}\n")
    return python


def _not_ours(name: str) -> bool:
    return not name.startswith(OWN) and name != "torch_emugpu_autoload.py"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)],
        env={**_env(), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        capture_output=True,
        text=True,
        timeout=3600,  # a checkout whose build/torch is missing or stale compiles here
        cwd=REPO,
    )
    assert r.returncode == 0, f"python -m build failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    print(f"wheel built in {time.monotonic() - start:.1f} s")
    (built,) = out.glob("torch_emugpu-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment with the wheel installed by pip's resolver (no --no-deps): its python."""
    root = tmp_path_factory.mktemp("fresh")
    python = _venv(root, _shared_site(root, _not_ours))
    r = _run([str(python), "-m", "pip", "install", str(wheel)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Successfully installed torch-emugpu" in r.stdout
    return python


def test_the_wheel_pins_the_torch_it_was_built_against_and_carries_its_binaries(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        requires = [line for line in z.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
        build = json.loads(z.read("torch_emugpu/_build.json"))
        daemon_mode = z.getinfo("torch_emugpu/bin/emugpud").external_attr >> 16
    assert f"Requires-Dist: torch=={PUBLIC_TORCH}" in requires
    assert build["torch"] == TORCH
    assert any(n.startswith("torch_emugpu/_C.") and n.endswith(".so") for n in names)
    assert daemon_mode & 0o111, "emugpud must stay executable"
    assert "torch_emugpu/profiles/gpus.json" in names
    assert any(n.startswith("torch_emugpu/profiles/") and n.endswith("resnet50.json") for n in names), names
    assert "torch_emugpu_autoload.py" in names
    assert wheel.name.endswith(f"-cp{sys.version_info.major}{sys.version_info.minor}-linux_x86_64.whl")


TRAIN_STEP = """
import sys, torch                          # autoloads the wheel's torch_emugpu (torch.backends entry point)
mod = sys.modules["torch_emugpu"]
assert mod.__file__.startswith(sys.prefix), mod.__file__
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
before = [p.detach().clone() for p in model.parameters()]
model = model.to("emugpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 16).to("emugpu"), torch.randint(0, 4, (8,)).to("emugpu")
loss = torch.nn.functional.cross_entropy(model(x), y)
opt.zero_grad(); loss.backward(); opt.step()
torch.emugpu.synchronize()
moved = [not torch.equal(b, p.detach().cpu()) for b, p in zip(before, model.parameters())]
print("device", next(model.parameters()).device.type, "loss", round(loss.item(), 4), "moved", all(moved),
      "peak", torch.emugpu.max_memory_allocated(), "gpu", torch.emugpu.get_device_name())
"""


def test_installed_in_a_fresh_environment_it_imports_and_trains_a_step(fresh: Path):
    r = _run([str(fresh), "-c", TRAIN_STEP], EMUGPU_MODE="compute", EMUGPU_GPU="h100")
    assert r.returncode == 0, r.stdout + r.stderr
    words = r.stdout.split()
    assert words[words.index("device") + 1] == "emugpu"
    assert words[words.index("moved") + 1] == "True"  # the optimizer step changed every parameter
    assert float(words[words.index("loss") + 1]) > 0
    assert int(words[words.index("peak") + 1]) > 0
    assert "H100" in r.stdout


def test_doctor_in_the_fresh_environment_finds_everything(fresh: Path):
    r = _run([str(fresh.parent / "torch-emugpu"), "doctor"])
    assert r.returncode == 0, r.stdout + r.stderr
    prefix = str(fresh.parent.parent)
    assert f"loads: {prefix}" in r.stdout  # the wheel's extension, not the checkout's
    assert f"runs: {prefix}" in r.stdout  # and its emugpud
    assert f"built with    torch {TORCH}" in r.stdout
    assert "resnet50" in r.stdout and r.stdout.rstrip().endswith("everything works")


def test_beside_another_torch_pip_refuses_the_wheel(wheel: Path, tmp_path: Path):
    # torch 2.13.0 "installed" (its metadata; pip reads nothing else), the rest of the project's packages.
    shared = _shared_site(tmp_path, lambda n: _not_ours(n) and n != "torch" and not n.startswith("torch-"))
    info = shared / "torch-2.13.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")
    python = _venv(tmp_path, shared)
    r = _run([str(python), "-m", "pip", "install", "--dry-run", str(wheel)])
    assert r.returncode != 0
    assert f"torch=={PUBLIC_TORCH}" in r.stderr and "torch-emugpu" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def mismatched(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel forced in (--no-deps) where it claims another torch than the one running: its python."""
    root = tmp_path_factory.mktemp("mismatched")
    python = _venv(root, _shared_site(root, _not_ours))
    r = _run([str(python), "-m", "pip", "install", "--no-deps", str(wheel)])
    assert r.returncode == 0, r.stdout + r.stderr
    code = "import importlib.util as u; print(u.find_spec('torch_emugpu').submodule_search_locations[0])"
    package = Path(_run([str(python), "-c", code], TORCH_DEVICE_BACKEND_AUTOLOAD="0").stdout.strip())
    build = json.loads((package / "_build.json").read_text())
    build["torch"] = "2.13.0+cpu"
    (package / "_build.json").write_text(json.dumps(build))
    return python


def test_forced_in_beside_another_torch_its_import_names_both_versions(mismatched: Path):
    r = _run([str(mismatched), "-c", "import torch_emugpu"], TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode != 0
    assert "TorchMismatchError" in r.stderr
    assert "built against torch 2.13.0+cpu" in r.stderr and f"has torch {TORCH}" in r.stderr
    assert "pip install torch==2.13.0" in r.stderr


def test_import_torch_still_works_there_with_a_warning_except_in_run_mode(mismatched: Path):
    r = _run([str(mismatched), "-c", "import torch; print(torch.ones(2).sum().item())"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "2.0"
    assert "built against torch 2.13.0+cpu" in r.stderr and "The emugpu device is not available" in r.stderr
    r = _run([str(mismatched), "-c", "import torch"], EMUGPU_AS_CUDA="1")
    assert r.returncode != 0
    assert "Failed to load the backend extension: emugpu" in r.stderr and "2.13.0+cpu" in r.stderr


def test_doctor_reports_the_mismatch_and_exits_1(mismatched: Path):
    r = _run([str(mismatched.parent / "torch-emugpu"), "doctor"])
    assert r.returncode == 1
    assert f"torch         {TORCH}" in r.stdout and "built with    torch 2.13.0+cpu" in r.stdout
    assert "PROBLEM: torch-emugpu" in r.stdout and "pip install torch==2.13.0" in r.stdout


def test_under_pips_build_isolation_the_backend_builds_against_the_installed_torch(fresh: Path, tmp_path: Path):
    # pip's isolation: the target environment's interpreter, its site-packages hidden, setuptools from an
    # overlay. The backend must find the installed torch and pin it, instead of asking pip for another one.
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    for entry in SITE.iterdir():
        if entry.name.startswith(("setuptools", "wheel", "_distutils_hack", "pkg_resources", "packaging")):
            (overlay / entry.name).symlink_to(entry)
    code = (
        # What pip's sitecustomize does: the environment's site directories (and what their .pth files
        # added) leave sys.path; the overlay and the backend's directory come first.
        "import sys; sys.path = [p for p in sys.path if 'site-packages' not in p and 'shared-site' not in p]\n"
        f"sys.path[:0] = [{str(overlay)!r}, {str(REPO / 'build_backend')!r}]\n"
        "import importlib.util; assert importlib.util.find_spec('torch') is None, 'isolated: no torch'\n"
        "import emugpu_build\n"
        "requires = emugpu_build.get_requires_for_build_wheel()\n"
        "assert not [r for r in requires if r.startswith('torch')], requires\n"
        f"print(emugpu_build.prepare_metadata_for_build_wheel({str(tmp_path)!r}))\n"
    )
    r = subprocess.run(
        [str(fresh), "-c", code],
        env={**_env(), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    metadata = (tmp_path / r.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert f"Requires-Dist: torch=={PUBLIC_TORCH}" in metadata, r.stderr[-3000:]


ISOLATED_REQUIRES = """
import sys; sys.path = [p for p in sys.path if 'site-packages' not in p and 'shared-site' not in p]
sys.path[:0] = [{overlay!r}, {backend!r}]
import importlib.util; assert importlib.util.find_spec('torch') is None, 'isolated: no torch'
import emugpu_build
wheel = [r for r in emugpu_build.get_requires_for_build_wheel() if r.startswith('torch')]
editable = [r for r in emugpu_build.get_requires_for_build_editable() if r.startswith('torch')]
print('RESULT', emugpu_build.TESTED_TORCH, wheel, editable, sep='|')
"""


def test_an_isolated_build_asks_for_the_tested_torch_only_where_it_sees_none(tmp_path: Path):
    # `python -m build` (isolated, its own interpreter): where neither the environment nor an activated
    # venv has a torch, the backend asks the frontend for the tested release, which it installs; an
    # activated venv's torch is used as pip's target environment's is, with nothing fetched.
    shared = _shared_site(tmp_path, lambda n: _not_ours(n) and n != "torch" and not n.startswith("torch-"))
    python = _venv(tmp_path, shared)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    for entry in SITE.iterdir():
        if entry.name.startswith(("setuptools", "wheel", "_distutils_hack", "pkg_resources", "packaging")):
            (overlay / entry.name).symlink_to(entry)
    code = ISOLATED_REQUIRES.format(overlay=str(overlay), backend=str(REPO / "build_backend"))

    def requires(**extra: str) -> list[str]:
        env = {k: v for k, v in _env(**extra).items() if k != "VIRTUAL_ENV" or "VIRTUAL_ENV" in extra}
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        r = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
        assert r.returncode == 0, r.stdout + r.stderr
        (line,) = (line for line in r.stdout.splitlines() if line.startswith("RESULT|"))
        return line.split("|")[1:]

    tested, wheel_requires, editable_requires = requires()
    assert wheel_requires == editable_requires == str([f"torch=={tested}"])
    assert requires(EMUGPU_BUILD_WITH_TORCH="2.13.0")[1] == str(["torch==2.13.0"])
    assert requires(EMUGPU_BUILD_WITH_TORCH="")[1] == "[]"  # opted out: setup.py then says what to run
    assert requires(VIRTUAL_ENV=sys.prefix)[1:] == ["[]", "[]"]  # the activated venv has torch


def test_the_tested_torch_is_the_one_setup_installs():
    sys.path.insert(0, str(REPO / "build_backend"))
    try:
        import emugpu_build
    finally:
        sys.path.remove(str(REPO / "build_backend"))
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert f"torch=={emugpu_build.TESTED_TORCH} " in setup
    assert emugpu_build.TESTED_TORCH == PUBLIC_TORCH, "the project's venv runs another torch than the tested one"


def test_a_build_that_sees_no_torch_says_what_to_run(tmp_path: Path):
    shared = _shared_site(tmp_path, lambda n: _not_ours(n) and n != "torch" and not n.startswith("torch-"))
    python = _venv(tmp_path, shared)
    build = [str(python), "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(REPO)]
    # Outside isolation the frontend checks the backend's requirements: it names the tested torch.
    r = _run(build)
    assert r.returncode != 0
    assert f"torch=={PUBLIC_TORCH}" in r.stdout + r.stderr and "not installed" in r.stdout + r.stderr
    # Asked for no torch (EMUGPU_BUILD_WITH_TORCH empty), setup.py says what to run.
    r = _run(build, EMUGPU_BUILD_WITH_TORCH="")
    assert r.returncode != 0
    output = r.stdout + r.stderr
    assert "torch-emugpu: no torch to build against" in output
    assert "pip install --no-build-isolation ." in output and "python -m build --wheel --no-isolation" in output
    assert not list(tmp_path.glob("*.whl"))


def test_the_sdist_carries_the_sources_and_no_build_output(tmp_path: Path):
    r = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path), str(REPO)],
        env={**_env(), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (sdist,) = tmp_path.glob("torch_emugpu-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
        pkg_info = t.extractfile(f"{sdist.name[: -len('.tar.gz')]}/PKG-INFO").read().decode()  # type: ignore[union-attr]
    for needed in ("CMakeLists.txt", "setup.py", "pyproject.toml", "build_backend/emugpu_build.py",
                   "csrc/backend/runtime.cpp", "csrc/daemon/main.cpp", "profiles/gpus.json",
                   "torch_emugpu/__init__.py", "torch_emugpu/_C.pyi"):  # fmt: skip
        assert needed in names, needed
    assert not [n for n in names if n.endswith(".so") or "/bin/emugpud" in n or n.endswith("_build.json")]
    # Any supported torch builds it; the wheel built from it pins that torch (metadata computed then).
    assert "Requires-Dist: torch>=2.13" in pkg_info and "Dynamic: requires-dist" in pkg_info
