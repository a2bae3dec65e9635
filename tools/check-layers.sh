#!/usr/bin/env bash
# The source tree's house rules, as a check (tools/dev.sh test runs it after the tests):
#   - layering: a file includes only from its own folder and the folders its row below allows
#     (docs/ARCHITECTURE.md, "Layers"); the engine's rooms have rows of their own;
#   - size: no source file over 500 lines (split it by concern; a file's name says its one job), and
#     no function of the project's sources (tests/ aside) over 80 lines without a "// Long:" comment
#     above it saying why.
# Prints every violation with the file, line and include, and exits 1 when there is one.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
max_lines=${MAX_LINES:-500}

# Most specific prefix first: a file takes the first row whose prefix it starts with. A row's
# allowed entries are path prefixes ("engine/plan/"), whole files ("models/block_api.h") or a
# folder's own files without its subfolders ("train/*").

rules=(
  "engine/checkpoint/staging.h|core/ offload/"
  "engine/checkpoint/format.|core/ offload/ models/block_api.h engine/checkpoint/format.h engine/checkpoint/staging.h"
  "engine/checkpoint/reader.|core/ engine/checkpoint/format.h"
  "engine/config/|core/ optim/ models/block_api.h engine/config/"
  "engine/plan/|core/ optim/ models/block_api.h engine/config/ engine/plan/ engine/checkpoint/staging.h"
  "engine/executor/|core/ comm/ optim/ offload/ models/block_api.h engine/config/ engine/plan/ engine/executor/"
  "engine/pipeline/|core/ comm/ engine/plan/ engine/pipeline/"
  "engine/|core/ comm/ optim/ offload/ models/block_api.h engine/"
  "core/|core/"
  "comm/|core/ comm/"
  "optim/|core/ optim/"
  "offload/|core/ offload/"
  "models/kernels/|core/ models/block_api.h models/kernels/"
  "models/moe/|core/ comm/ models/block_api.h models/decoder/gpt.h models/decoder/dims.h models/decoder/layers.h models/kernels/ models/moe/"
  "models/decoder/|core/ comm/ models/block_api.h models/kernels/ models/moe/ models/decoder/"
  "models/|core/ comm/ models/"
  "planner/|core/ engine/config/ engine/pipeline/schedule.h planner/"
  "train/text/|core/ train/text/"
  "train/corpus/|core/ train/text/ train/corpus/"
  "train/hf/|core/ comm/ optim/ offload/ models/ engine/ train/hf/"
  "train/config/|core/ optim/ models/ engine/config/ engine/pipeline/schedule.h engine/checkpoint/format.h train/hf/model_config.h train/text/ train/corpus/ train/config/"
  "train/report/|core/ comm/ optim/ offload/ models/ engine/ train/* train/config/ train/report/"
  "train/|core/ comm/ optim/ offload/ models/ engine/ train/text/ train/corpus/ train/hf/ train/config/ train/*"
  "tools/launch/|core/ comm/ tools/launch/"
  "tools/bench/|core/ comm/ optim/ offload/ models/ engine/ planner/ train/ tools/launch/ tools/cli/options.h tools/bench/"
  "tools/cli/|core/ comm/ optim/ offload/ models/ engine/ planner/ train/ tools/launch/ tools/bench/bench.h tools/cli/"
  "tests/|"
)

# Tracked files and new ones git does not ignore; outside a git checkout (an unpacked tarball, or
# one git refuses to read) every source file but those in build folders.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -co --exclude-standard -- '*.h' '*.cc' '*.cu' '*.cuh' '*.inc')
else
  mapfile -t files < <(find . -path './build*' -prune -o -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' -o -name '*.inc' \) -print | sed 's|^\./||' | sort)
fi
# The project's own folders: an include of one of them, in quotes or brackets, is checked.
project='(core|comm|optim|offload|models|engine|planner|train|tools|tests)/'

bad=0
for f in "${files[@]}"; do
  [[ -f $f ]] || continue
  n=$(wc -l <"$f")
  if ((n > max_lines)); then
    echo "size: $f has $n lines (more than $max_lines): split it along its concerns"
    bad=1
  fi
  allowed=""
  matched=0
  for rule in "${rules[@]}"; do
    prefix=${rule%%|*}
    if [[ $f == "$prefix"* ]]; then
      allowed=${rule#*|}
      matched=1
      break
    fi
  done
  ((matched)) || continue
  [[ $f == tests/* ]] && continue
  while IFS=: read -r line target; do
    ok=0
    for a in $allowed; do
      if [[ $a == *'*' ]]; then
        # The folder's own files: the rest of the path holds no further folder.
        rest=${target#"${a%\*}"}
        if [[ $target == "${a%\*}"* && $rest != */* ]]; then
          ok=1
          break
        fi
      elif [[ $target == "$a"* ]]; then
        ok=1
        break
      fi
    done
    if ((!ok)); then
      echo "layering: $f:$line includes \"$target\", which its folder may not (allowed: $allowed)"
      bad=1
    fi
  done < <(grep -noE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<][^">]+[">]' "$f" |
    sed -E 's/^([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([^">]+)[">]/\1:\2/' | grep -E "^[0-9]+:$project" || true)
done

# Functions over 80 lines, in the sources (a test's case may run longer: it reads as a table). The
# heuristic fits clang-format's layout: a definition starts at the left margin.
long_functions=$(for f in "${files[@]}"; do if [[ -f $f && $f != tests/* ]]; then echo "$f"; fi; done | xargs awk -v limit=80 "$(cat <<'AWK'
# Functions defined at the left margin whose body runs past `limit` lines without a comment line
# starting "// Long:" in the comment block right above them. A signature starts at column 0 with a
# "(" and ends at the first line ending in "{"; the body ends at the next line that is "}".
function report() {
  if (start > 0 && NR - start + 1 > limit && !reason) printf "%s:%d: %s runs %d lines (over %d): split it, or say why in a \"// Long:\" comment above it\n", FILENAME, start, name, NR - start + 1, limit
}
FNR == 1 { state = 0; comment = ""; reason_above = 0 }
state == 0 {
  if ($0 ~ /^\/\//) { if ($0 ~ /^\/\/ Long:/) reason_above = 1; next }
  if ($0 ~ /^[A-Za-z~][^;]*\(/ && $0 !~ /^(namespace|struct|class|enum|union|extern|template|using|typedef|return|static_assert)\b/ && $0 !~ /;[[:space:]]*$/ && $0 !~ /}[[:space:]]*$/) {
    start = FNR; name = $0; sub(/\(.*/, "", name); n = split(name, w, /[ *&:]+/); name = w[n]; reason = reason_above
    state = ($0 ~ /\{[[:space:]]*$/) ? 2 : 1
    reason_above = 0
    next
  }
  reason_above = 0
  next
}
state == 1 {  # a signature over several lines
  if ($0 ~ /;[[:space:]]*$/) { state = 0; next }
  if ($0 ~ /\{[[:space:]]*$/) state = 2
  next
}
state == 2 {
  if ($0 == "}") { NR_save = NR; NR = FNR; report(); NR = NR_save; state = 0 }
  next
}
AWK
)")
if [[ -n $long_functions ]]; then
  echo "$long_functions"
  bad=1
fi

if ((bad)); then
  echo "check-layers: violations above (rules in tools/check-layers.sh, reasons in docs/ARCHITECTURE.md)" >&2
  exit 1
fi
echo "check-layers: ${#files[@]} files, includes within their layers, none over $max_lines lines, no long function without its reason"
