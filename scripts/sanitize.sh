#!/usr/bin/env bash
# Checks the torch-free core under sanitizers; exits non-zero on any finding.
#   1. AddressSanitizer + UndefinedBehaviorSanitizer build (build/asan): ctest
#   2. ThreadSanitizer build (build/tsan): ctest
#   3. the fuzz targets under ASan+UBSan (build/fuzz), each run for FUZZ_SECONDS
#      (default 20): the catalog/profile/calibration parsers from the seeds in
#      test/fuzz/corpus, the TCP transport's frame parser from test/fuzz/frames,
#      emugpud's protocol parser and handler from test/fuzz/share
# Usage: scripts/sanitize.sh [FUZZ_SECONDS]     (also: JOBS=2, FUZZ_SEED=N, SANITIZE_CLEAN=1)
# SANITIZE_CLEAN=1 (CI) removes each build once its step has passed, so the disk
# holds one sanitizer build at a time (about 0.3 GB) instead of all three.
# About 10 minutes on 2 cores, mostly compiling. A fuzz finding is saved as
# build/fuzz/crash-input.json; replay it with
#   build/fuzz/emugpu_parser_fuzz -runs=0 build/fuzz/crash-input.json
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .venv/bin ] && export PATH="$PWD/.venv/bin:$PATH"

FUZZ_SECONDS="${1:-${FUZZ_SECONDS:-20}}"
JOBS="${JOBS:-1}"
SANITIZE_CLEAN="${SANITIZE_CLEAN:-0}"
FUZZ_SEED="${FUZZ_SEED:-$(date +%s)}"

# Reports must stop the run, not scroll past.
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
if symbolizer="$(command -v llvm-symbolizer)"; then
  export ASAN_SYMBOLIZER_PATH="$symbolizer"
fi

step() { printf '\n=== %s\n' "$*"; }

# -g1: line tables are all a sanitizer's stack trace needs; full debug info
# (-g) made the builds twice the size (ASan+UBSan: 577 MB against 277 MB).
configure() {  # DIR SANITIZERS [cmake args...]
  local dir="$1" sanitize="$2"
  shift 2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMUGPU_BUILD_TORCH=OFF \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
    "-DEMUGPU_SANITIZE=$sanitize" "$@" >/dev/null
}

done_with() {  # DIR: a step passed; with SANITIZE_CLEAN=1 its build goes
  if [ "$SANITIZE_CLEAN" = 1 ]; then rm -rf "$1"; fi
}

step "address,undefined: build and ctest (build/asan)"
configure build/asan address,undefined -DEMUGPU_BUILD_TESTS=ON -DEMUGPU_BUILD_FUZZ=OFF
cmake --build build/asan -j"$JOBS"
ctest --test-dir build/asan --output-on-failure
done_with build/asan

step "thread: build and ctest (build/tsan)"
configure build/tsan thread -DEMUGPU_BUILD_TESTS=ON -DEMUGPU_BUILD_FUZZ=OFF
cmake --build build/tsan -j"$JOBS"
ctest --test-dir build/tsan --output-on-failure
done_with build/tsan

step "address,undefined: fuzz the parsers for ${FUZZ_SECONDS} s each, seed ${FUZZ_SEED} (build/fuzz)"
configure build/fuzz address,undefined -DEMUGPU_BUILD_TESTS=OFF -DEMUGPU_BUILD_FUZZ=ON
cmake --build build/fuzz -j"$JOBS" --target emugpu_parser_fuzz emugpu_frame_fuzz emugpu_share_fuzz
mkdir -p build/fuzz/corpus-new build/fuzz/frames-new build/fuzz/share-new  # libFuzzer adds what it finds to the first directory
(cd build/fuzz && ./emugpu_parser_fuzz "-max_total_time=${FUZZ_SECONDS}" "-seed=${FUZZ_SEED}" \
  corpus-new ../../test/fuzz/corpus)
(cd build/fuzz && ./emugpu_frame_fuzz "-max_total_time=${FUZZ_SECONDS}" "-seed=${FUZZ_SEED}" \
  frames-new ../../test/fuzz/frames)
(cd build/fuzz && ./emugpu_share_fuzz "-max_total_time=${FUZZ_SECONDS}" "-seed=${FUZZ_SEED}" \
  share-new ../../test/fuzz/share)
done_with build/fuzz

step "sanitize.sh: no findings"
