#!/usr/bin/env bash
# Sets up (if needed) and runs every test: the core's GoogleTest suite (ctest),
# the pytest suite, and ruff.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
cmake -S . -B build/core -G Ninja -DEMUGPU_BUILD_TORCH=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/core
ctest --test-dir build/core --output-on-failure
ruff check torch_emugpu torch_emugpu_autoload.py test benchmarks examples
python -m pytest "$@"
