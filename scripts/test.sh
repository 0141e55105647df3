#!/usr/bin/env bash
# Sets up (if needed) and runs every test: the core's GoogleTest suite
# (ctest), the style and type checks (ruff, ruff format, clang-format, mypy)
# and the pytest suite.
#   scripts/test.sh            everything (what CI runs)
#   scripts/test.sh --fast     leaves out the pytest tests marked slow (multi-process runs, tests of seconds each): under 5 minutes
# Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
pytest_args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then pytest_args+=(-m "not slow"); else pytest_args+=("$arg"); fi
done
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
cmake -S . -B build/core -G Ninja -DEMUGPU_BUILD_TORCH=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/core
ctest --test-dir build/core --output-on-failure
python_sources=(torch_emugpu torch_emugpu_autoload.py setup.py build_backend test benchmarks examples)
ruff check "${python_sources[@]}"
ruff format --check "${python_sources[@]}"
git ls-files -- 'csrc/*.cpp' 'csrc/*.h' 'test/*.cpp' 'test/*.h' 'benchmarks/*.cpp' | xargs clang-format --dry-run -Werror
mypy
python -m pytest "${pytest_args[@]}"
