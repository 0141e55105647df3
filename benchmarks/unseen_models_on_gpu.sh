#!/usr/bin/env bash
# Runs benchmarks/unseen_models.py once on a machine with a CUDA GPU and plain PyTorch + torchvision (no
# compiled extension), within 6 minutes: the script itself is killed at 360 s, and by its defaults starts no
# case after 330 s and kills a compiled case's child at 345 s; every finished case is already in the JSON.
# Run from the repository root; results go to $OUT (default ./gpu-results).
#
#   OUT=/somewhere benchmarks/unseen_models_on_gpu.sh
set -uo pipefail
OUT=${OUT:-./gpu-results}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/unseen_gpu.txt"
$PY -c 'import torch, torchvision; print(torch.__version__, torchvision.__version__, torch.version.cuda, torch.backends.cudnn.version())' \
  | tee -a "$OUT/unseen_gpu.txt"
timeout 360 $PY benchmarks/unseen_models.py --device cuda --out "$OUT/unseen_h100.json" --no-progress
echo "== unseen_models exit $?"
