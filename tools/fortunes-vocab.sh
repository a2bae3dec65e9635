#!/usr/bin/env bash
# Trains the SentencePiece vocabulary of configs/llama-fortunes-zero3.json on Debian's fortunes
# (tools/install-deps.sh installs both): runs/tokenizers/fortunes-4096.model, a 4096-piece unigram
# model with byte fallback (Llama 2's kind), unless it is there already. spm_train is deterministic
# for the same text, so every machine gets the same vocabulary.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$root/runs/tokenizers/fortunes-4096"
[[ -f "$out.model" ]] && exit 0
mkdir -p "$(dirname "$out")"
# The fortunes' text files, as data.format "text" reads the folder: regular files, no symbolic
# links, none holding a NUL byte (the .dat indexes).
inputs=()
while IFS= read -r -d '' f; do
  grep -qP '\x00' "$f" || inputs+=("$f")
done < <(find /usr/share/games/fortunes -maxdepth 1 -type f -print0 | sort -z)
((${#inputs[@]} > 0)) || { echo "fortunes-vocab: no fortunes in /usr/share/games/fortunes (tools/install-deps.sh installs them)" >&2; exit 1; }
spm_train --input="$(IFS=,; echo "${inputs[*]}")" --model_prefix="$out.tmp" --vocab_size=4096 --model_type=unigram \
  --byte_fallback=true --character_coverage=1.0 --num_threads=1 --minloglevel=2
mv "$out.tmp.vocab" "$out.vocab"
mv "$out.tmp.model" "$out.model"
echo "fortunes-vocab: $out.model (4096 pieces, from ${#inputs[@]} files)"
