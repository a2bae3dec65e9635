#!/usr/bin/env bash
# The launcher of a GPU bundle (tools/gpu-bundle.sh copies it in as `run`): runs one of the
# bundle's programs with the GPU machine's cuBLAS and NCCL on the library path, which the bundle
# does not carry, and the bundle's test references where its tests look.
#   ./run PROGRAM [ARGS...]   (zeroth, core_tests, core_cuda_tests, comm_tests, models_tests, optim_tests)
#   ./run --where             says which cuBLAS and NCCL it found, and exits
# cuBLAS 13 (libcublas.so.13, libcublasLt.so.13) and NCCL 2 (libnccl.so.2) are looked for in
# $ZEROTH_CUDA_LIBS (folders, ':'-separated) first, then in the Python's NVIDIA wheels (nvidia/cu13/lib,
# nvidia/cublas/lib, nvidia/nccl/lib under its site-packages), then in the CUDA toolkit's folders.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

candidates() {
  if [[ -n ${ZEROTH_CUDA_LIBS:-} ]]; then tr ':' '\n' <<<"$ZEROTH_CUDA_LIBS"; fi
  local py
  for py in python3 python; do
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" - <<'PY' 2>/dev/null || true
import os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
import site, sys
places = list(sys.path)
try:  # a virtual environment's site module may lack these
    places += site.getsitepackages() + [site.getusersitepackages()]
except Exception:
    pass
for s in places:
    roots.append(os.path.join(s, "nvidia"))
seen = set()
for r in roots:
    for sub in ("cu13/lib", "cublas/lib", "nccl/lib"):
        d = os.path.join(r, sub)
        if d not in seen and os.path.isdir(d):
            seen.add(d)
            print(d)
PY
    break
  done
  printf '%s\n' /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu
}

find_lib() {  # the first candidate folder holding $1
  local d
  while IFS= read -r d; do
    [[ -n $d && -e $d/$1 ]] && { echo "$d"; return 0; }
  done < <(candidates)
  return 1
}

cublas=$(find_lib libcublas.so.13) || {
  echo "run: no cuBLAS 13 (libcublas.so.13) here: not in \$ZEROTH_CUDA_LIBS, the Python's NVIDIA wheels (pip's nvidia-cublas) or /usr/local/cuda; set ZEROTH_CUDA_LIBS to its folder" >&2
  exit 1
}
[[ -e $cublas/libcublasLt.so.13 ]] || { echo "run: $cublas holds libcublas.so.13 but not libcublasLt.so.13" >&2; exit 1; }
nccl=$(find_lib libnccl.so.2) || {
  echo "run: no NCCL 2 (libnccl.so.2) here: not in \$ZEROTH_CUDA_LIBS, the Python's NVIDIA wheels (pip's nvidia-nccl-cu13) or /usr/local/cuda; set ZEROTH_CUDA_LIBS to its folder" >&2
  exit 1
}
if [[ ${1:-} == --where ]]; then
  echo "cuBLAS: $cublas/libcublas.so.13 -> $(readlink -f "$cublas/libcublas.so.13")"
  echo "NCCL:   $nccl/libnccl.so.2 -> $(readlink -f "$nccl/libnccl.so.2")"
  exit 0
fi
program=${1:?"usage: run PROGRAM [ARGS...] (zeroth, core_tests, core_cuda_tests, comm_tests, models_tests, optim_tests) | run --where"}
shift
[[ -x $here/$program && $program != */* ]] || { echo "run: $program is not one of this bundle's programs" >&2; exit 2; }
# The path as it was, for programs the bundle's start that must not see these (a PyTorch with
# its own NCCL: tools/gpu-check.sh's python wrapper puts it back).
if [[ -n ${LD_LIBRARY_PATH+x} ]]; then export ZEROTH_RUN_OUTER_LD_LIBRARY_PATH=$LD_LIBRARY_PATH; fi
export LD_LIBRARY_PATH="$cublas${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ZEROTH_TEST_DATA_DIR="$here/tests"
exec "$here/$program" "$@"
