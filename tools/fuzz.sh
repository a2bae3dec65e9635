#!/usr/bin/env bash
# libFuzzer on every parser that takes bytes from outside (tests/fuzz: the training config,
# safetensors, checkpoint manifests, llm.c token files, rendezvous store messages).
#   tools/fuzz.sh [--seconds S] [HARNESS...]   (default: 60 s each, every harness)
#   tools/fuzz.sh --replay [HARNESS...]        build them, run each input of tests/fuzz/corpus once
#                                              under libFuzzer, ASan and UBSan (tools/dev.sh test does)
# Builds the harnesses with clang, ASan and UBSan in build-fuzz (BUILD_DIR), then runs each for S
# seconds from its corpus in tests/fuzz/corpus (new inputs kept in build-fuzz/corpus/HARNESS,
# never in the checkout) and prints executions and coverage per harness. A crash, leak, hang
# (10 s an input) or allocation over 2 GiB leaves its input in build-fuzz/findings/HARNESS and
# makes the script fail; fix it, then add that input to tests/fuzz/corpus/HARNESS, which ctest
# replays in every build.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
seconds=60
replay=0
harnesses=()
while (($#)); do
  case $1 in
    --seconds) seconds=${2:?--seconds needs a number}; shift 2 ;;
    --seconds=*) seconds=${1#*=}; shift ;;
    --replay) replay=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) harnesses+=("$1"); shift ;;
  esac
done
[[ $seconds =~ ^[0-9]+$ && $seconds -gt 0 ]] || { echo "fuzz.sh: --seconds must be a positive whole number, got '$seconds'" >&2; exit 2; }
all=(config safetensors manifest token_file store)
((${#harnesses[@]})) || harnesses=("${all[@]}")
for h in "${harnesses[@]}"; do
  [[ " ${all[*]} " == *" $h "* ]] || { echo "fuzz.sh: no harness '$h' (there are: ${all[*]})" >&2; exit 2; }
done

# Debian 12's clang, and its runtime libraries, libFuzzer among them.
"$root/tools/install-deps.sh" clang libclang-rt-14-dev
dir=${BUILD_DIR:-build-fuzz}
# File by file (ZEROTH_UNITY=OFF): every other build compiles the libraries as unity files, where a
# file may lean on its batch's includes; here, in CI, the harnesses' libraries show that each stands alone.
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZEROTH_CUDA=OFF -DZEROTH_FUZZ=ON \
  -DZEROTH_SANITIZE=address,undefined -DZEROTH_UNITY=OFF >/dev/null
cmake --build "$dir" -j "${JOBS:-$(nproc)}" --target "${harnesses[@]/#/fuzz_}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
if ((replay)); then
  # Every input once (-runs=0 stops after the corpus is read in), as the fuzzer itself runs them.
  for h in "${harnesses[@]}"; do
    log="$dir/replay-$h.log"
    if "$dir/tests/fuzz/fuzz_$h" -runs=0 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 "tests/fuzz/corpus/$h" >"$log" 2>&1; then
      printf 'fuzz.sh: replayed %-12s %4d inputs: clean\n' "$h" "$(ls "tests/fuzz/corpus/$h" | wc -l)"
    else
      tail -n 30 "$log"
      echo "fuzz.sh: replaying tests/fuzz/corpus/$h under fuzz_$h failed (log $log)" >&2
      exit 1
    fi
  done
  exit 0
fi
status=0
summary=()
for h in "${harnesses[@]}"; do
  corpus="$dir/corpus/$h" findings="$dir/findings/$h"
  mkdir -p "$corpus" "$findings"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -max_len=65536
        -print_final_stats=1 -artifact_prefix="$findings/")
  [[ -f tests/fuzz/$h.dict ]] && args+=(-dict="tests/fuzz/$h.dict")
  log="$dir/fuzz-$h.log"
  echo "fuzz.sh: $h for $seconds s (log $log)"
  if "$dir/tests/fuzz/fuzz_$h" "${args[@]}" "$corpus" "tests/fuzz/corpus/$h" >"$log" 2>&1; then
    outcome=clean
  else
    outcome="FINDING: $(ls -t "$findings" | head -1) (see $log)"
    status=1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
  summary+=("$(printf '%-12s %12s runs  %-22s corpus %5s  %s' "$h" "${runs:-?}" "${cov:-cov: ?}" "$(ls "$corpus" | wc -l)" "$outcome")")
done
printf '%s\n' "" "fuzz.sh: ${seconds} s per harness" "${summary[@]}"
exit $status
