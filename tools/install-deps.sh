#!/usr/bin/env bash
# Installs the Debian packages zeroth builds against, skipping what is present.
# Works as root on a fresh Debian 12 machine; uses sudo when run as another user.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache
  libtbb-dev liburing-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev libopenblas-dev libcli11-dev libfmt-dev libxxhash-dev
  clang-format  # tools/format.sh, the layout check of tools/dev.sh test
  fortunes  # English text for the example training runs in configs/ (/usr/share/games/fortunes)
  fio  # the reference beside `zeroth bench offload`
  libsentencepiece-dev  # SentencePiece tokenizers (data.tokenizer: Llama 2, Mistral, TinyLlama)
  sentencepiece  # spm_train and spm_encode: the README trains a vocabulary with it; the tokenizer tests compare with it
  python3-torch  # PyTorch (/usr/bin/python3), the reference that reads the saved weights in the tests
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
