#!/usr/bin/env bash
# Measures, on a machine with a CUDA GPU and plain PyTorch + torchvision (no
# compiled extension), what torch-emugpu ships as measured data: the
# preprocessing table, the calibration sweep, DataStall-model profiles, the
# host's per-op launch cost, the end-to-end training validation and the
# data-pipeline epochs. Run from the repository root; results go to $OUT
# (default ./gpu-results), one tarball.
# The measuring steps run torch_emugpu/measure's tools themselves, which import
# nothing that needs the extension; `dataset make` goes through the command.
#
#   benchmarks/measure_on_gpu.sh [steps...]   steps: preprocessing calibrate profiles host validation pipeline pinned
#                                              mps-kernels
set -uo pipefail
OUT=${OUT:-$PWD/gpu-results}
WORK=${WORK:-/tmp/emugpu-measure}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(preprocessing profiles host validation pipeline)
log() { echo "== $(date +%T) $*"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$WORK/gpu.txt"
$PY -c 'import torch, torchvision; print(torch.__version__, torchvision.__version__, torch.version.cuda, torch.backends.cudnn.version())' | tee -a "$WORK/gpu.txt"
nproc | tee -a "$WORK/gpu.txt"

for step in "${steps[@]}"; do
  log "$step"
  case $step in
    preprocessing)
      timeout 240 $PY -m torch_emugpu.measure.profiler --preprocessing --device cuda --out "$WORK/profiles" --no-progress ;;
    calibrate)
      # 899 points, about 3 minutes by estimate; the cap keeps the step (imports included) under 7 minutes
      XDG_DATA_HOME=$WORK/xdg timeout 390 $PY -m torch_emugpu.measure.calibrate --device cuda --no-progress
      cp -r "$WORK"/xdg/torch-emugpu/profiles/. "$WORK/profiles/" ;;
    profiles)
      timeout 240 $PY -m torch_emugpu.measure.profiler --device cuda --out "$WORK/profiles" --no-progress \
        --models alexnet,resnet18,shufflenet_v2_x1_0,mobilenet_v2,resnet50,vgg11 --batch-sizes 32,64,128,256 ;;
    host)
      # the host's cost per launched op (profiles carry it too, as provenance.host): about 15 s
      timeout 60 $PY -m torch_emugpu.measure.host_cost --device cuda --out "$WORK/host_cost.json" ;;
    validation)
      timeout 300 $PY benchmarks/training_validation.py --device cuda --out "$WORK/validation.json" --no-progress ;;
    pipeline)
      [ -d "$WORK/data" ] || $PY -m torch_emugpu.cli dataset make imagenet-like "$WORK/data" --images 2560 \
        --jobs "$(nproc)" --no-progress
      p="timeout 120 $PY benchmarks/data_pipeline.py --data $WORK/data --device cuda --out $WORK/pipeline.json"
      $p --models resnet18 --workers 2,4,8,14 --pin both
      $p --models resnet50 --workers 4,14 --pin both
      $p --models resnet18,resnet50 --workers 4 --preprocessing gpu
      $p --models resnet18 --workers 14 --cold ;;
    pinned)
      [ -d "$WORK/data" ] || $PY -m torch_emugpu.cli dataset make imagenet-like "$WORK/data" --images 256 --no-progress
      timeout 200 $PY benchmarks/data_pipeline.py --data "$WORK/data" --device cuda --out "$WORK/pinned.json" \
        --preprocessing none --limit 20480 --batch 256 --models resnet18,resnet50 --workers 8 --pin both ;;
    mps-kernels)
      # the five collocated pairs alone, under time slicing and under MPS (root), every member recording the
      # kernels of 3 iterations (benchmarks/mps_kernels.py reads them): about 4 minutes
      timeout 540 $PY benchmarks/collocation.py --seconds 4 --kernels 3 --out "$WORK/collocation_kernels.json" \
        && $PY benchmarks/mps_kernels.py "$WORK/collocation_kernels.json" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
  echo "== $step exit $?"
done
tar -C "$WORK" -czf "$OUT/results.tar.gz" --exclude data .
ls -la "$OUT"
