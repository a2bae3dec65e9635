#!/usr/bin/env bash
# The one script to run on a machine with an NVIDIA GPU: builds the CUDA backend, runs the whole
# test suite with the GPU cases enabled (the tensor-parallel kernels' among them), trains on the GPU
# with and without tensor parallelism, benchmarks the GPU kernels, and prints a short table last.
# Budget: under 8 minutes. Without a usable GPU it says so and exits non-zero.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-$root/build-gpu/out}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
start=$(date +%s)

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no usable NVIDIA GPU here (nvidia-smi missing or failing); nothing to check" >&2
  exit 1
fi
nvidia-smi -L | tee "$out/gpus.txt"

step() { printf '\n== %s (%ds)\n' "$1" $(($(date +%s) - start)); }
status_build=FAIL status_tests=FAIL status_bench=FAIL status_comm=FAIL status_offload=FAIL

step "build (ZEROTH_CUDA=ON, sm_80/sm_90)"
# Only the GPU architecture of this machine, to keep the build inside the time budget.
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d '.')
if BUILD_DIR=build-gpu ZEROTH_CUDA=ON tools/dev.sh build -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" >"$out/build.log" 2>&1; then
  status_build=ok
else
  tail -n 40 "$out/build.log"
fi

if [[ $status_build == ok ]]; then
  step "zeroth report"
  build-gpu/tools/zeroth report | tee "$out/report.txt"

  step "tests (GPU cases enabled)"
  if ctest --test-dir build-gpu --output-on-failure -j 4 --timeout 300 >"$out/tests.log" 2>&1; then status_tests=ok; fi
  grep -E "tests passed|tests failed" "$out/tests.log"
  skipped=$(grep -ciE "(cuda|nccl).*Skipped" "$out/tests.log" || true)
  if [[ $skipped != 0 ]]; then
    echo "gpu-check: $skipped GPU test(s) skipped although a GPU is present" >&2
    status_tests=FAIL
  fi

  step "bench kernels on the GPU"
  if build-gpu/tools/zeroth bench kernels --device cuda --size 1GiB --reps 20 --json >"$out/bench_kernels_cuda.json" 2>"$out/bench.err"; then
    status_bench=ok
  else
    cat "$out/bench.err"
  fi
  build-gpu/tools/zeroth bench kernels --device cuda --size 1GiB --reps 20 | tee "$out/bench_kernels_cuda.txt"

  step "bench optim on the GPU (fused AdamW vs device-to-device copy)"
  build-gpu/tools/zeroth bench optim --device cuda --params 1e8 1e9 --reps 20 | tee "$out/bench_optim_cuda.txt" || status_bench=FAIL

  step "bench offload: disk sweep (fio beside it when installed), host<->GPU copies from pinned and pageable memory"
  if build-gpu/tools/zeroth bench offload --device cuda --size 1GiB --path /tmp | tee "$out/bench_offload_cuda.txt"; then
    status_offload=ok
  fi

  step "GPT training on one GPU (the README's config, 30 steps)"
  status_train=FAIL
  if build-gpu/tools/zeroth train configs/gpt-fortunes-zero3-bf16.json --set run.device=cuda --set run.world_size=1 \
      --set run.steps=30 --set run.eval_interval=0 --set run.output_dir="$out/train" | tee "$out/train_cuda.txt"; then
    status_train=ok
  fi

  step "GPT with tensor parallelism on the GPU (2 local ranks, tp 2 with sequence parallelism, 10 steps)"
  # The vocabulary-parallel loss and embedding kernels and the split layers on CUDA; the ranks share
  # the GPU through the local backend (NCCL takes one GPU per rank).
  status_tp=FAIL
  if build-gpu/tools/zeroth train configs/gpt-3d.json --set run.device=cuda --set parallel.pipeline=1 --set run.world_size=2 \
      --set parallel.micro_batches=2 --set parallel.sequence_parallel=true --set run.trace=false --set run.steps=10 \
      --set run.eval_interval=0 --set run.output_dir="$out/train_tp" | tee "$out/train_tp_cuda.txt"; then
    status_tp=ok
  fi

  step "bench comm on the GPUs (nccl, one rank per GPU)"
  gpus=$(nvidia-smi -L | wc -l)
  if build-gpu/tools/zeroth bench comm --backend nccl --ranks "$gpus" --min-bytes 1MiB --max-bytes 256MiB \
      | tee "$out/bench_comm_nccl.txt"; then
    status_comm=ok
  fi
fi

step "summary"
printf '%-28s %s\n' "build (CUDA)" "$status_build" "tests" "$status_tests" "bench kernels (cuda)" "$status_bench" \
  "bench comm (nccl)" "$status_comm" "bench offload (cuda)" "$status_offload" "train GPT (cuda)" "${status_train:-not run}" \
  "train GPT tp 2 (cuda)" "${status_tp:-not run}"
if [[ -f $out/bench_kernels_cuda.json ]]; then
  python3 - "$out/bench_kernels_cuda.json" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{'kernel':<28} {'GB/s':>9} {'vs d2d copy':>12}")
print(f"{'memcpy_d2d':<28} {r['memcpy_gbps']:9.1f} {'100%':>12}")
for k in r["kernels"]:
    print(f"{k['name']:<28} {k['gbps']:9.1f} {100 * k['ratio']:11.0f}%")
PY
fi
echo "elapsed: $(($(date +%s) - start)) s"
[[ $status_build == ok && $status_tests == ok && $status_bench == ok && $status_comm == ok && $status_offload == ok ]]
