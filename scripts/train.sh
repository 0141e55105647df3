#!/usr/bin/env bash
# Sets up (if needed) and runs the main job: an emulated training run.
# Arguments go to `torch-emugpu train` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/torch-emugpu train "$@"
