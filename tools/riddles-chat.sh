#!/usr/bin/env bash
# Conversations from Debian's fortune riddles (the fortunes package's `riddles` file) as JSON Lines
# of {"messages": [...]}, the data of a chat fine-tuning example: each fortune's "Q:" and "A:"
# blocks in order become alternating user and assistant turns (the first block is the user's, so
# the "great answers" that give the answer first ask for the question), a block's indented lines
# joined to it with a space. Fortunes without both are left out.
#   tools/riddles-chat.sh [OUT]   (default runs/data/riddles-chat.jsonl)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root/runs/data/riddles-chat.jsonl}
riddles=/usr/share/games/fortunes/riddles
[[ -f $riddles ]] || { echo "riddles-chat: $riddles is missing (tools/install-deps.sh installs the fortunes package)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
awk '
  function esc(s) {
    gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); gsub(/\t/, " ", s)
    return s
  }
  function flush_block() {
    if (text != "") { turns[n++] = text }
    text = ""
  }
  function flush_fortune(  k, line) {
    flush_block()
    if (n >= 2 && saw_q && saw_a) {
      line = "{\"messages\": ["
      for (k = 0; k < n; k++) line = line (k ? ", " : "") "{\"role\": \"" (k % 2 ? "assistant" : "user") "\", \"content\": \"" esc(turns[k]) "\"}"
      print line "]}"
      written++
    }
    n = 0; saw_q = 0; saw_a = 0; text = ""; in_block = 0
  }
  /^%$/ { flush_fortune(); next }
  /^[QA]:/ {
    flush_block()
    if ($0 ~ /^Q:/) saw_q = 1; else saw_a = 1
    text = $0; sub(/^[QA]:[ \t]*/, "", text); in_block = 1; next
  }
  in_block && /^[ \t]/ { line = $0; sub(/^[ \t]+/, "", line); text = text " " line; next }
  { flush_block(); in_block = 0 }
  END { flush_fortune(); printf "riddles-chat: %d conversations\n", written > "/dev/stderr" }
' "$riddles" > "$out.tmp"
mv "$out.tmp" "$out"
echo "riddles-chat: $out"
