#!/usr/bin/env bash
# Installs the Debian packages zeroth builds against, and any named as arguments, skipping what
# is present.
# Works as root on a fresh Debian 12 machine; uses sudo when run as another user.
set -euo pipefail

# Two tiers: `run` (the default) is what building zeroth and running it need; `test` adds what the
# test suite and the benchmarks' references need (PyTorch, Chromium, Node, fio: most of the
# download). Usage: tools/install-deps.sh [run|test] [EXTRA_PACKAGES...]
tier=run
if [[ ${1:-} == run || ${1:-} == test ]]; then
  tier=$1
  shift
fi

packages=(
  build-essential cmake ninja-build pkg-config ccache
  libtbb-dev liburing-dev nlohmann-json3-dev
  libgloo-dev libopenblas-dev libcli11-dev libfmt-dev libxxhash-dev
  libdnnl-dev  # oneDNN: the CPU matrix products (core/cpu/gemm.h), OpenBLAS their fallback
  ocl-icd-opencl-dev  # Debian's oneDNN is built for OpenCL GPUs too: its CMake config requires OpenCL
  fortunes  # English text for the example training runs in configs/ (/usr/share/games/fortunes)
  libsentencepiece-dev  # SentencePiece tokenizers (data.tokenizer: Llama 2, Mistral, TinyLlama)
  libpcre2-dev  # the split patterns of Hugging Face byte-level BPE tokenizers (tokenizer.json: GPT-2, Llama 3, Qwen)
  libutf8proc-dev  # their NFC normalizer (Qwen2's)
  zlib1g-dev  # .jsonl.gz training records (train/corpus)
  sentencepiece  # spm_train: the vocabulary of configs/llama-fortunes-zero3.json (tools/fortunes-vocab.sh)
)
test_packages=(
  libgtest-dev libgmock-dev  # the test suites (GoogleTest)
  clang-format  # tools/format.sh, the layout check of tools/dev.sh test
  fio  # the reference beside `zeroth bench offload`
  nodejs  # runs tokenizers.js, the byte-level BPE tokenizer tests' reference (installed below)
  python3-torch  # PyTorch (/usr/bin/python3), the reference that reads the saved weights in the tests
  python3-jinja2  # Jinja2, the reference the chat templates are rendered against (tests/reference/jinja_render.py)
  iproute2  # ip netns: tools/cluster.sh, the multi-node tests' nodes
  python3-protobuf python3-crcmod  # the tests' own reader of TensorBoard event files (tests/reference/tfevents_read.py)
  chromium  # opens the run reports headless in the tests (tests/tools/report_test.cc)
)
[[ $tier == test ]] && packages+=("${test_packages[@]}")

# Extra packages a caller names (tools/fuzz.sh: clang and libFuzzer).
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  sudo_cmd=(sudo)
fi
apt_install() {
  if [[ ${#sudo_cmd[@]} -gt 0 ]] && ! command -v sudo >/dev/null; then
    echo "install-deps: need root or sudo to install: $*" >&2
    exit 1
  fi
  echo "install-deps: installing $*"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "$@"
}

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages of the $tier tier present"
else
  apt_install "${missing[@]}"
fi

# Hugging Face's tokenizers.js, the reference of the byte-level BPE tokenizer tests, in the
# checkout's ignored .cache/node (node's own npm; Debian's where node came without one).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ $tier == test && ! -f $root/.cache/node/node_modules/@huggingface/tokenizers/package.json ]]; then
  command -v npm >/dev/null || apt_install npm
  # Only tests need it: without the registry, building and training go on, and those tests say so.
  npm install --prefix "$root/.cache/node" --no-audit --no-fund --loglevel=error @huggingface/tokenizers@0.2.0 ||
    echo "install-deps: npm could not install @huggingface/tokenizers; the byte-level BPE tokenizer tests fail until it does" >&2
fi
