"""Thin setuptools shim: CMake builds torch_emugpu._C against the installed torch, and the wheel then
requires exactly that torch (`torch==X.Y.Z`, as torchvision's does): the extension loads in no other.

The build backend (build_backend/emugpu_build.py) lets an isolated build see the torch already installed,
or has the frontend install the tested one; where still no torch can be seen, building the extension stops
with the commands to run."""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
OLDEST_TORCH = "2.13"  # the oldest torch the sources build against (an sdist made without torch says so)


def installed_torch() -> ModuleType | None:
    try:
        import torch
    except ImportError:
        return None
    return torch


def torch_requirement(torch: ModuleType | None) -> str:
    """The wheel's requirement: the public version of the torch it compiles against (2.14.1 for 2.14.1+cu130:
    the CPU and CUDA builds of one release share the ABI the extension links against)."""
    if torch is None:
        return f"torch>={OLDEST_TORCH}"
    return "torch==" + torch.__version__.split("+")[0]


NO_TORCH = f"""torch-emugpu: no torch to build against.
Its extension compiles against the torch installed where it will run, and this build sees none
(Python {sys.executable}). Install torch first, then build without isolation, in that environment:
    pip install 'torch>={OLDEST_TORCH}' setuptools wheel cmake ninja
    pip install --no-build-isolation .       # or, for a wheel: python -m build --wheel --no-isolation"""


def install_file(src: Path, dest: Path) -> None:
    """Copies under a temporary name, then renames: a running emugpud, or a process that maps the old _C,
    keeps its file (copying over it fails with "text file busy", or corrupts the mapping)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.copy2(src, partial)
    os.replace(partial, dest)


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        torch = installed_torch()
        if torch is None:
            raise SystemExit(NO_TORCH)
        from torch.utils import cpp_extension

        include_dirs = ";".join(str(Path(p).resolve()) for p in cpp_extension.include_paths())
        build_dir = ROOT / "build" / "torch"
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = os.environ.get("EMUGPU_BUILD_TYPE", "Release")
        # Prefer the cmake installed next to this Python (the venv's), then PATH.
        local = Path(sys.executable).parent / "cmake"
        cmake = str(local) if local.exists() else (shutil.which("cmake") or "cmake")
        subprocess.run(
            [
                cmake, "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
                f"-DCMAKE_BUILD_TYPE={cfg}",
                f"-DPython3_EXECUTABLE={sys.executable}",
                "-DEMUGPU_BUILD_TESTS=OFF",
                # The torch this process imported, also where a child Python would not find it (pip's isolation);
                # its real paths, so that a torch reached through links compiles with the same flags (no rebuild).
                f"-DEMUGPU_TORCH_VERSION={torch.__version__}",
                f"-DEMUGPU_TORCH_INCLUDE_DIRS={include_dirs}",
                f"-DEMUGPU_TORCH_LIB_DIR={Path(torch.__file__).resolve().parent / 'lib'}",
                f"-DEMUGPU_TORCH_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            ],
            check=True,
        )  # fmt: skip
        subprocess.run([cmake, "--build", str(build_dir), "--target", "_C", "emugpud"], check=True)
        built = next(build_dir.glob("_C*.so"))
        target = Path(self.get_ext_fullpath(ext.name))
        install_file(built, target)
        # The sharing daemon and what the extension was built with (_build.json: the import-time torch check
        # and `torch-emugpu doctor` read it) travel inside the package. An editable install copies only the
        # extension from its build directory, so the source tree gets them too.
        for package_dir in {target.parent, ROOT / "torch_emugpu"}:
            install_file(build_dir / "emugpud", package_dir / "bin" / "emugpud")
            install_file(build_dir / "build_info.json", package_dir / "_build.json")
        # The GPU catalog and the measured data travel inside the package for non-editable installs.
        for src in (ROOT / "profiles").rglob("*.json"):
            install_file(src, target.parent / "profiles" / src.relative_to(ROOT / "profiles"))


setup(
    ext_modules=[CMakeExtension("torch_emugpu._C")],
    cmdclass={"build_ext": CMakeBuild},
    # An sdist builds against any torch from the oldest supported on; the wheel made from it pins its own.
    install_requires=[
        torch_requirement(None if "sdist" in sys.argv[1:] else installed_torch()),
        "tqdm",
        "numpy",
        "pillow",
    ],
)
