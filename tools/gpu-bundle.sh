#!/usr/bin/env bash
# The GPU check's bundle, built here (where nvcc is at /usr/local/cuda and Debian's libraries are)
# for a bare offline GPU machine that has none of them: tools/gpu-check.sh unpacks it there.
#   tools/gpu-bundle.sh [--rehearse]
# A Release build of the CUDA backend for Hopper and Ampere (CUDA_ARCHS, default "80;90"), libstdc++ and libgcc
# linked in (ZEROTH_PORTABLE), in BUILD_DIR (default build-gpu-bundle); then the bundle in
# BUILD_DIR/zeroth-gpu and BUILD_DIR/zeroth-gpu.tar.xz:
#   zeroth and the test binaries that hold GPU cases (core, core_cuda, comm, models, optim), each with an
#   RPATH of $ORIGIN/lib; lib/: every shared library they load but glibc's, the CUDA driver's,
#   cuBLAS's and NCCL's (the GPU machine has those: its CUDA toolkit or its Python's NVIDIA
#   wheels, which `run` finds at start); run: the launcher; configs/, the fortunes' text files
#   (data/fortunes), the SentencePiece vocabulary the Llama config uses (runs/tokenizers), the
#   test references (tests/reference), the PyTorch side of `bench train` (tools/bench), and
#   BUNDLE.json (what it holds, the glibc it needs).
# Prints the size, the glibc floor and the libraries carried; fails over 60 MiB (what a visit can
# carry). --rehearse then proves the bundle carries what it needs: unpacked in a scratch folder,
# `zeroth report` and a short CPU training run start from it in a mount namespace where every
# Debian library the build linked is hidden (an empty file bound over it), and ldd of every
# bundled binary names nothing outside it but glibc, the kernel's vdso and the CUDA driver,
# cuBLAS and NCCL (needs root, as tools/dev.sh does).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
rehearse=0
case "${1:-}" in
  --rehearse) rehearse=1 ;;
  "") ;;
  -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
  *) echo "gpu-bundle.sh: unknown argument $1 (--rehearse, or nothing)" >&2; exit 2 ;;
esac
dir=${BUILD_DIR:-build-gpu-bundle}
archs=${CUDA_ARCHS:-80;90}
limit_mib=60
start=$(date +%s)

[[ -x /usr/local/cuda/bin/nvcc ]] || { echo "gpu-bundle.sh: nvcc is not at /usr/local/cuda/bin: the bundle is built where the CUDA toolkit is" >&2; exit 1; }
"$root/tools/install-deps.sh" test
"$root/tools/fortunes-vocab.sh"
mkdir -p "$dir"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZEROTH_CUDA=ON -DZEROTH_PORTABLE=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$archs" >"$dir/configure.log" 2>&1 || { tail -n 30 "$dir/configure.log"; exit 1; }
binaries=(zeroth core_tests core_cuda_tests comm_tests models_tests optim_tests)
cmake --build "$dir" -j "${JOBS:-$(nproc)}" --target "${binaries[@]}"

# What the GPU machine has: glibc's own libraries and the loader, the kernel's vdso, the CUDA
# driver, cuBLAS (and cuBLASLt) and NCCL.
provided='^(linux-vdso\.so|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libutil\.so|ld-linux-x86-64\.so|libcuda\.so|libcublas\.so|libcublasLt\.so|libnccl\.so)'

stage="$dir/zeroth-gpu"
rm -rf "$stage" "$dir/zeroth-gpu.tar.xz"
mkdir -p "$stage/lib" "$stage/configs" "$stage/data/fortunes" "$stage/runs/tokenizers" "$stage/tests/reference" "$stage/tools/bench"
where=(tools/zeroth tests/core/core_tests tests/core/core_cuda_tests tests/comm/comm_tests tests/models/models_tests tests/optim/optim_tests)
for path in "${where[@]}"; do
  cp "$dir/$path" "$stage/"
  strip --strip-debug "$stage/$(basename "$path")"
done
# Every library the binaries load, as this machine resolves it (with its own dependencies: ldd
# lists the whole tree), but what the GPU machine provides.
declare -A carried=()
for b in "${binaries[@]}"; do
  while read -r name _ path _; do
    [[ $name =~ $provided || $name == /* || $name == linux-vdso* ]] && continue
    [[ ${path:-} == /* ]] || { echo "gpu-bundle.sh: $b needs $name, which this machine does not have either" >&2; exit 1; }
    carried[$name]=$path
  done < <(ldd "$stage/$b")
done
for name in "${!carried[@]}"; do
  cp -L "${carried[$name]}" "$stage/lib/$name"
  strip --strip-unneeded "$stage/lib/$name" 2>/dev/null || true
done

cp configs/*.json configs/README.md "$stage/configs/"
# The fortunes' text files, as data.format "text" reads the folder (no symbolic links, no .dat
# indexes): the README's run trains on them.
while IFS= read -r -d '' f; do
  grep -qaP '\x00' "$f" || cp "$f" "$stage/data/fortunes/"
done < <(find /usr/share/games/fortunes -maxdepth 1 -type f -print0)
cp runs/tokenizers/fortunes-4096.model "$stage/runs/tokenizers/"
cp tests/reference/*.safetensors tests/reference/*.json "$stage/tests/reference/"
cp tools/bench/train_torch.py "$stage/tools/bench/"
cp tools/gpu-run.sh "$stage/run"
chmod +x "$stage/run"

# The newest glibc symbol version any bundled file asks for: the oldest glibc that runs them.
floor=$(for f in "$stage"/{zeroth,*_tests} "$stage"/lib/*; do objdump -T "$f"; done 2>/dev/null |
  grep -oE 'GLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' | sed 's/GLIBC_//' | sort -uV | tail -n1)
libs=$(cd "$stage/lib" && ls | sort | tr '\n' ' ')
python3 - "$stage/BUNDLE.json" "$floor" "$archs" "$(git rev-parse HEAD 2>/dev/null || echo unknown)" $libs <<'PY'
import json, sys, datetime
path, floor, archs, commit, *libs = sys.argv[1:]
json.dump({"glibc_floor": floor, "cuda_architectures": archs, "commit": commit,
           "built": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"), "libraries": libs,
           "provided_by_the_gpu_machine": ["glibc", "the CUDA driver (libcuda.so.1)", "cuBLAS, cuBLASLt (libcublas.so.13)",
                                           "NCCL (libnccl.so.2)"]}, open(path, "w"), indent=2)
PY
tar -C "$dir" -cf - zeroth-gpu | xz -T0 -6 >"$dir/zeroth-gpu.tar.xz"
bytes=$(stat -c %s "$dir/zeroth-gpu.tar.xz")
unpacked=$(du -sb "$stage" | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
printf 'gpu-bundle.sh: %s: %s MiB (%s MiB unpacked), CUDA architectures %s, glibc %s or newer, built in %d s\n' \
  "$dir/zeroth-gpu.tar.xz" "$(mib "$bytes")" "$(mib "$unpacked")" "$archs" "$floor" $(($(date +%s) - start))
printf 'gpu-bundle.sh: libraries carried: %s\n' "$libs"
if ((bytes > limit_mib * 1048576)); then
  echo "gpu-bundle.sh: the bundle is over ${limit_mib} MiB, more than a GPU visit can carry" >&2
  exit 1
fi
((rehearse)) || exit 0

# ---- the rehearsal
[[ $(id -u) == 0 ]] || { echo "gpu-bundle.sh --rehearse: needs root (a mount namespace)" >&2; exit 1; }
t0=$(date +%s)
scratch=$(mktemp -d /tmp/zeroth-gpu-rehearsal.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
tar -C "$scratch" -xJf "$dir/zeroth-gpu.tar.xz"
bundle="$scratch/zeroth-gpu"
# cuBLAS and NCCL as the GPU machine's toolkit would give them: the library path holds their
# folder alone.
cuda_libs=/usr/local/cuda/lib64
status=0
# 1. ldd of every bundled binary: nothing from outside the bundle but what the GPU machine has.
for b in "${binaries[@]}"; do
  while read -r name _ path _; do
    [[ $name =~ $provided || $name == /* || $name == linux-vdso* ]] && continue
    if [[ ${path:-} != "$bundle/lib/"* ]]; then
      echo "gpu-bundle.sh --rehearse: $b loads $name from ${path:-nowhere}, outside the bundle" >&2
      status=1
    fi
  done < <(LD_LIBRARY_PATH=$cuda_libs ldd "$bundle/$b")
done
# 2. The Debian libraries the build linked, hidden; the bundle's programs run.
hidden=()
for name in "${!carried[@]}"; do hidden+=("$(readlink -f "${carried[$name]}")"); done
: >"$scratch/empty"
log="$dir/rehearsal.log"
if ! unshare -m bash -s "$bundle" "$scratch" "$cuda_libs" "${hidden[@]}" >"$log" 2>&1 <<'INNER'; then
set -euo pipefail
bundle=$1 scratch=$2 cuda_libs=$3
shift 3
mount --make-rprivate /
# One process binds the empty file over them all: mount(8) itself loads some of them (libpcre2,
# through libselinux), so it could not hide the rest after those.
python3 - "$scratch/empty" "$@" <<'PY'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND = 4096
for target in sys.argv[2:]:
    if libc.mount(sys.argv[1].encode(), target.encode(), None, MS_BIND, None) != 0:
        sys.exit(f"mount --bind over {target}: {os.strerror(ctypes.get_errno())}")
PY
for f in "$@"; do [[ ! -s $f ]] || { echo "$f is still readable"; exit 1; }; done
echo "hidden: $# Debian libraries (each now an empty file)"
export ZEROTH_CUDA_LIBS=$cuda_libs
"$bundle/run" zeroth report
"$bundle/run" zeroth train "$bundle/configs/gpt-fortunes-zero3-bf16.json" --set data.train="$bundle/data/fortunes" \
  --set run.steps=3 --set run.eval_interval=0 --set run.sample_tokens=0 --set run.output_dir="$scratch/run" --set run.progress=lines
INNER
  tail -n 40 "$log"
  echo "gpu-bundle.sh --rehearse: the bundle's programs did not run with the Debian libraries hidden (log $log)" >&2
  status=1
fi
if ((status == 0)); then
  grep -E '^hidden:|^done after' "$log"
  printf 'gpu-bundle.sh --rehearse: passed in %d s: ldd of %d binaries names nothing outside the bundle but glibc, the vdso, the CUDA driver, cuBLAS and NCCL; zeroth report and 3 training steps ran with %d Debian libraries hidden (log %s)\n' \
    $(($(date +%s) - t0)) "${#binaries[@]}" "${#hidden[@]}" "$log"
fi
exit $status
