#!/usr/bin/env bash
# The project's one entry point for setting up, building and testing on a fresh Debian machine.
#   tools/dev.sh test [CMAKE_ARGS]  install packages, build with warnings as errors (CUDA backend when
#                                   nvcc exists), run ctest, build the fuzz harnesses with clang and
#                                   replay their corpus (tools/fuzz.sh --replay), check the layering and
#                                   file sizes (tools/check-layers.sh) and the source layout
#                                   (tools/format.sh check)
#   tools/dev.sh build [CMAKE_ARGS] install packages and build only
#   tools/dev.sh train [CONFIG [ARGS]] install what building and running need (not the tests'
#                                   packages), build the zeroth binary, run `zeroth train`
#                                   (default: configs/gpt-fortunes-zero3-bf16.json)
#   tools/dev.sh sanitize KIND      build with ZEROTH_SANITIZE=KIND (address,undefined | thread), run ctest
# Environment: BUILD_DIR (default build), ZEROTH_CUDA (AUTO|ON|OFF), JOBS (default: all cores).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
jobs=${JOBS:-$(nproc)}

# TIER: run (build and run zeroth) or test (and its tests: GoogleTest, PyTorch, Chromium, ...).
configure_and_build() {
  local dir=$1
  shift
  "$root/tools/install-deps.sh" "${TIER:-test}"
  # The SentencePiece vocabulary configs/llama-fortunes-zero3.json trains with (a few seconds, once).
  "$root/tools/fortunes-vocab.sh"
  local tests=ON
  [[ ${TIER:-test} == run ]] && tests=OFF
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
    -DZEROTH_CUDA="${ZEROTH_CUDA:-AUTO}" -DZEROTH_BUILD_TESTS="$tests" "$@"
  cmake --build "$dir" -j "$jobs" ${TARGET:+--target "$TARGET"}
}

run_tests() {
  local dir=$1
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 600
}

case "${1:-}" in
  test)
    # Warnings are errors here, so the project's own code stays at zero of them.
    configure_and_build "${BUILD_DIR:-build}" -DZEROTH_WERROR=ON "${@:2}"
    run_tests "${BUILD_DIR:-build}"
    # The fuzz harnesses built as tools/fuzz.sh builds them (clang, libFuzzer, ASan + UBSan), which no
    # other build uses, each replaying its corpus: code clang refuses, or an input that now fails
    # under the sanitizers, fails here.
    "$root/tools/fuzz.sh" --replay
    # After the tests, so a layout difference never hides their results.
    "$root/tools/check-layers.sh"
    "$root/tools/format.sh" check
    ;;
  build)
    configure_and_build "${BUILD_DIR:-build}" "${@:2}"
    ;;
  train)
    TIER=run TARGET=zeroth configure_and_build "${BUILD_DIR:-build}"
    config=${2:-configs/gpt-fortunes-zero3-bf16.json}
    exec "${BUILD_DIR:-build}/tools/zeroth" train "$config" "${@:3}"
    ;;
  sanitize)
    kind=${2:?"usage: tools/dev.sh sanitize address,undefined|thread"}
    dir=${BUILD_DIR:-build-${kind//,/-}}
    # Sanitized builds check the host code; the CUDA backend is exercised by tools/gpu-check.sh.
    ZEROTH_CUDA=OFF BUILD_TYPE=RelWithDebInfo configure_and_build "$dir" -DZEROTH_SANITIZE="$kind"
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    # oneTBB's and OpenBLAS's own synchronisation is invisible to TSan; kernels run single-threaded
    # under it (a product large enough for OpenBLAS to split otherwise shows as a race in sgemm).
    if [[ $kind == thread ]]; then
      export ZEROTH_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
      export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1 suppressions=$root/tools/tsan.supp}
    fi
    run_tests "$dir"
    ;;
  *)
    echo "usage: tools/dev.sh test | build | train [CONFIG [ARGS]] | sanitize address,undefined|thread" >&2
    exit 2
    ;;
esac
