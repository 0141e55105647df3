"""Thin setuptools shim: CMake builds torch_emugpu._C against the installed torch."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
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
            ],
            check=True,
        )
        subprocess.run([cmake, "--build", str(build_dir), "--target", "_C", "emugpud"], check=True)
        built = next(build_dir.glob("_C*.so"))
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target)
        # The sharing daemon travels inside the package; `torch-emugpu daemon` and `emugpud` run it. An
        # editable install copies only the extension from its build directory, so the source tree gets it too.
        for package_dir in {target.parent, ROOT / "torch_emugpu"}:
            daemon = package_dir / "bin" / "emugpud"
            daemon.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(build_dir / "emugpud", daemon)
        # The GPU catalog and the measured data travel inside the package for non-editable installs.
        for src in (ROOT / "profiles").rglob("*.json"):
            dest = target.parent / "profiles" / src.relative_to(ROOT / "profiles")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)


setup(ext_modules=[CMakeExtension("torch_emugpu._C")], cmdclass={"build_ext": CMakeBuild})
