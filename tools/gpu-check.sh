#!/usr/bin/env bash
# The GPU check, on a bare offline GPU machine (an NVIDIA H100 or H200 with CUDA's driver and a
# Python with PyTorch and NVIDIA's wheels; none of Debian's libraries, no network): unpacks the
# bundle tools/gpu-bundle.sh built (build-gpu-bundle/zeroth-gpu.tar.xz, or the file given),
# prints the machine (GPUs, glibc, the cuBLAS and NCCL the bundle's launcher found) and stops
# there, saying why in one line, without a GPU or with a glibc older than the bundle needs. Then,
# each step timed (8 minutes in all on 16 cores):
#   - the test binaries with GPU cases, whole: a skipped case is a failure (on a GPU machine
#     nothing has a reason to skip);
#   - the README's run on the GPU, one rank with the accumulation of its 4 ranks' batch (the same
#     16 sequences a step, in the same order), beside the same steps on the CPU's 4 ranks;
#   - bench kernels and bench optim on the GPU;
#   - bench train at ZeRO-3 in bf16 on the GPU, GPT-2 124M, SmolLM-135M and Llama 3.2 1B, tokens/s
#     and MFU beside this machine's PyTorch (its bf16 autocast and SDPA attention) on the same GPU;
#   - the optimizer offloaded to host memory: the host<->GPU copy rates (bench offload) and the
#     README's run with offload_optimizer on cpu.
# Writes results.json, table.txt, check.log and logs.tar.xz (every step's log and the runs' metrics)
# under $OUT when set (else build-gpu/out): four files, as a GPU visit brings back at most eight.
# Prints the table last. Exits non-zero when any step failed.
#   tools/gpu-check.sh [BUNDLE.tar.xz]
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tarball=${1:-build-gpu-bundle/zeroth-gpu.tar.xz}
out=${OUT:-$root/build-gpu/out}
mkdir -p "$out"
start=$(date +%s)
say() { printf '%s\n' "$*" | tee -a "$out/check.log"; }
elapsed() { echo $(($(date +%s) - start)); }

[[ -f $tarball ]] || { echo "gpu-check: no bundle at $tarball: build it with tools/gpu-bundle.sh where the CUDA toolkit is" >&2; exit 1; }
if [[ -n ${GPU_CHECK_DIR:-} ]]; then
  scratch=$GPU_CHECK_DIR
  mkdir -p "$scratch"
else
  scratch=$(mktemp -d /tmp/zeroth-gpu.XXXXXX)
fi
# Logs and runs go to work/; what comes back is packed into $out when the check ends, however it ends.
work="$scratch/work"
mkdir -p "$work"
: >"$out/check.log"
finish() {
  tar -C "$work" --exclude='checkpoints' --exclude='*.safetensors' --exclude='tokens' -cJf "$out/logs.tar.xz" . 2>/dev/null
  [[ -n ${GPU_CHECK_DIR:-} ]] || rm -rf "$scratch"
}
trap finish EXIT
tar -C "$scratch" -xJf "$tarball" || { echo "gpu-check: $tarball does not unpack" >&2; exit 1; }
bundle="$scratch/zeroth-gpu"
run="$bundle/run"
say "gpu-check: bundle $tarball unpacked in $bundle ($(elapsed) s)"

# The machine, and what the bundle needs of it.
need=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["glibc_floor"])' "$bundle/BUNDLE.json" 2>/dev/null ||
  sed -n 's/.*"glibc_floor": *"\([0-9.]*\)".*/\1/p' "$bundle/BUNDLE.json")
[[ -n $need ]] || { echo "gpu-check: $bundle/BUNDLE.json does not say which glibc the bundle needs: build it again" >&2; exit 1; }
have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
say "machine: $(uname -srm), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), glibc ${have:-unknown} (the bundle needs $need or newer)"
if [[ -z $have || $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1) != "$need" ]]; then
  echo "gpu-check: this machine's glibc is ${have:-unknown}, older than the $need the bundle's binaries need: build the bundle on a machine with an older glibc" >&2
  exit 1
fi
"$run" --where 2>&1 | tee -a "$out/check.log" | sed 's/^/  /'
((PIPESTATUS[0] == 0)) || exit 1
# The bundle's binary loads with its libraries and says what it sees (its CUDA line: the runtime
# and the GPUs the driver shows).
if ! "$run" zeroth report >"$work/report.txt" 2>&1; then
  tail -n 20 "$work/report.txt"
  echo "gpu-check: the bundle's zeroth does not start here (its report is in $work/report.txt)" >&2
  exit 1
fi
grep -E '^  (zeroth|cpu |cuda|nccl)' "$work/report.txt" | tee -a "$out/check.log"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no usable NVIDIA GPU here (nvidia-smi missing or failing); the bundle unpacked and found its libraries, nothing else to check" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader | tee "$work/gpus.txt" | sed 's/^/  gpu: /' | tee -a "$out/check.log"
python3 -c 'import torch; print("  pytorch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tee -a "$out/check.log"

# Each step: its name, its status and seconds into results.tsv; its output into its log.
: >"$work/results.tsv"
step() {
  local name=$1 log=$2
  shift 2
  local t0=$(date +%s) status=ok
  say ""
  say "== $name ($(elapsed) s)"
  if ! "$@" >"$work/$log" 2>&1; then status=FAIL; fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" $(($(date +%s) - t0)) "$log" >>"$work/results.tsv"
  tail -n "${TAIL:-15}" "$work/$log" | sed 's/^/  /' | tee -a "$out/check.log"
  say "  -> $status in $(($(date +%s) - t0)) s"
}

# 1. The test binaries with GPU cases, one after the other (cases that time work would not stand
# sharing the GPU and the cores); gtest's JSON says what failed and what skipped.
tests() {
  local b status=0
  for b in core_tests core_cuda_tests comm_tests models_tests optim_tests; do
    timeout 300 "$run" "$b" --gtest_brief=1 --gtest_output="json:$work/$b.json" >"$work/$b.log" 2>&1 || status=1
  done
  python3 - "$work" <<'PY' || status=1
import json, os, sys
out, bad = sys.argv[1], 0
for b in ("core_tests", "core_cuda_tests", "comm_tests", "models_tests", "optim_tests"):
    try:
        r = json.load(open(os.path.join(out, b + ".json")))
    except Exception as e:
        print(f"{b}: no report ({e}); see {b}.log"); bad = 1; continue
    cases = [t for s in r["testsuites"] for t in s["testsuite"]]
    failed = [f'{t["classname"]}.{t["name"]}' for t in cases if t.get("failures")]
    skipped = [f'{t["classname"]}.{t["name"]}' for t in cases if t.get("result") == "SKIPPED"]
    gpu = [t for t in cases if "cuda" in (t["name"] + t.get("value_param", "")).lower() or "Nccl" in t["classname"] or "Cuda" in t["name"]]
    print(f"{b}: {len(cases)} cases ({len(gpu)} on the GPU), {len(failed)} failed, {len(skipped)} skipped")
    for n in failed + [s + " (skipped)" for s in skipped]: print("  " + n)
    bad |= bool(failed or skipped)
sys.exit(bad)
PY
  return $status
}
TAIL=12 step "tests with GPU cases" tests.log tests

# 2. The README's run: the GPU (one rank accumulating the 4 ranks' micro-batches) beside the CPU.
readme() {
  local common=(--set data.train="$bundle/data/fortunes" --set run.steps=50 --set run.eval_interval=50 --set run.sample_tokens=0
    --set run.progress=lines --set steps_per_print=10)
  "$run" zeroth train "$bundle/configs/gpt-fortunes-zero3-bf16.json" "${common[@]}" --set run.device=cuda --set run.world_size=1 \
    --set gradient_accumulation_steps=4 --set run.output_dir="$work/readme-cuda" || return 1
  "$run" zeroth train "$bundle/configs/gpt-fortunes-zero3-bf16.json" "${common[@]}" --set run.output_dir="$work/readme-cpu" || return 1
  # The same batches in bf16 on two devices: every loss finite and within 0.1 of the CPU's (bf16's
  # rounding differs between cuBLAS and oneDNN and compounds over the steps; a broken step moves
  # the loss by far more).
  python3 - "$work/readme-cuda/metrics.jsonl" "$work/readme-cpu/metrics.jsonl" <<'PY'
import json, math, sys
def losses(p): return {m["step"]: m["loss"] for m in map(json.loads, open(p)) if "loss" in m and "lr" in m}
g, c = losses(sys.argv[1]), losses(sys.argv[2])
print("step  loss cuda (1 rank, 4 micro-batches)  loss cpu (4 ranks)  difference")
bad = sorted(g) != sorted(c) or not g
for s in sorted(g):
    d = g[s] - c.get(s, float("nan"))
    if s % 10 == 0 or s == 1: print(f"{s:4d}  {g[s]:.4f}{'':28s}{c.get(s, float('nan')):.4f}{'':12s}{d:+.4f}")
    bad = bad or not math.isfinite(g[s]) or not abs(d) <= 0.1
sys.exit("the GPU's losses are not the CPU's (within 0.1, finite, the same steps)" if bad else 0)
PY
}
TAIL=9 step "README run, cuda beside cpu" readme.log readme

# 3. The GPU's kernels and optimizer step.
step "bench kernels --device cuda" bench_kernels.log "$run" zeroth bench kernels --device cuda --size 1GiB --reps 20
step "bench optim --device cuda" bench_optim.log "$run" zeroth bench optim --device cuda --params 1e8 1e9 --reps 20 --no-torch

# 4. Training steps at ZeRO-3 in bf16 beside PyTorch on the same GPU.
# PyTorch with the library path it had before the bundle's launcher: its own NCCL and cuBLAS.
cat >"$scratch/python3-outside" <<SH
#!/bin/sh
if [ -n "\${ZEROTH_RUN_OUTER_LD_LIBRARY_PATH+x}" ]; then export LD_LIBRARY_PATH="\$ZEROTH_RUN_OUTER_LD_LIBRARY_PATH"; else unset LD_LIBRARY_PATH; fi
exec "$(command -v python3)" "\$@"
SH
chmod +x "$scratch/python3-outside"
train_bench() {
  local preset=$1 batch=$2
  "$run" zeroth bench train --device cuda --preset "$preset" --seq 1024 --batch "$batch" --steps 5 --stage 3 --dtype bf16 \
    --python "$scratch/python3-outside" --script "$bundle/tools/bench/train_torch.py" --json >"$work/bench_train_$preset.json" || return 1
  cat "$work/bench_train_$preset.json"
  # The reference must have run: its error, when it did not, is in the JSON.
  python3 -c 'import json, sys; sys.exit("no PyTorch figure" if "tokens_per_s" not in json.load(open(sys.argv[1])).get("torch", {}) else 0)' \
    "$work/bench_train_$preset.json"
}
for m in "gpt2-124m 16" "smollm-135m 16" "llama-3.2-1b 8"; do
  read -r preset batch <<<"$m"
  TAIL=25 step "bench train $preset (ZeRO-3 bf16) beside PyTorch" "bench_train_$preset.log" train_bench "$preset" "$batch"
done

# 5. Offload: host<->GPU copy rates, and the README's run with the optimizer in host memory.
step "bench offload --device cuda (copies)" bench_offload.log "$run" zeroth bench offload --device cuda --size 256MiB --reps 1 --path "$scratch"
step "README run, offload_optimizer cpu, on cuda" offload_train.log "$run" zeroth train "$bundle/configs/gpt-fortunes-zero3-bf16.json" \
  --set data.train="$bundle/data/fortunes" --set run.steps=30 --set run.eval_interval=0 --set run.sample_tokens=0 --set run.progress=lines \
  --set run.device=cuda --set run.world_size=1 --set gradient_accumulation_steps=4 \
  --set zero_optimization.offload_optimizer='{"device": "cpu", "pin_memory": true}' --set run.output_dir="$work/offload-cuda"

# The results: one JSON, one table, the table last.
python3 - "$work" "$out" "$(elapsed)" <<'PY' || { echo "gpu-check: the results could not be summed up" >&2; exit 1; }
import json, os, sys
work, out, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps = [dict(zip(("step", "status", "seconds", "log"), l.rstrip("\n").split("\t"))) for l in open(os.path.join(work, "results.tsv"))]
bench = {}
for f in sorted(os.listdir(work)):
    if f.startswith("bench_train_") and f.endswith(".json"):
        try:
            bench[f[len("bench_train_"):-5]] = json.load(open(os.path.join(work, f)))
        except Exception:
            pass
gpus = open(os.path.join(work, "gpus.txt")).read().strip().splitlines()
json.dump({"gpus": gpus, "seconds": seconds, "steps": steps, "bench_train": bench}, open(os.path.join(out, "results.json"), "w"), indent=2)
lines = [f"gpu-check on {gpus[0] if gpus else '?'}: {seconds} s", f"{'step':<48} {'status':<6} {'s':>5}"]
lines += [f"{s['step']:<48} {s['status']:<6} {s['seconds']:>5}" for s in steps]
if bench:
    lines.append("")
    lines.append(f"{'model (ZeRO-3, bf16)':<22} {'zeroth tok/s':>13} {'MFU':>6} {'pytorch tok/s':>14} {'MFU':>6} {'zeroth/pytorch':>15}")
    for name, b in bench.items():
        t = b.get("torch", {})
        ratio = b["tokens_per_s"] / t["tokens_per_s"] if t.get("tokens_per_s") else 0
        lines.append(f"{name:<22} {b['tokens_per_s']:>13.0f} {100 * b.get('mfu', 0):>5.1f}% {t.get('tokens_per_s', 0):>14.0f} "
                     f"{100 * t.get('mfu', 0):>5.1f}% {ratio:>14.2f}x")
open(os.path.join(out, "table.txt"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
! grep -q "	FAIL	" "$work/results.tsv"
