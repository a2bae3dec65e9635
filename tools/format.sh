#!/usr/bin/env bash
# Source layout, as the root .clang-format decides it, over every tracked *.h *.cc *.cu *.inc.
#   tools/format.sh check   list the files whose layout differs (with the lines that would change);
#                           exit 1 when there is one
#   tools/format.sh fix     rewrite those files in place
# Environment: CLANG_FORMAT (default clang-format-14, else clang-format). Other major versions
# lay some constructs out differently, so the check says which version it ran.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

formatter=${CLANG_FORMAT:-}
if [[ -z $formatter ]]; then
  formatter=clang-format
  command -v clang-format-14 >/dev/null && formatter=clang-format-14
fi
if ! command -v "$formatter" >/dev/null; then
  echo "format: $formatter not found; tools/install-deps.sh installs Debian's clang-format" >&2
  exit 2
fi

# Tracked files only, so build folders and scratch files never count; outside a git checkout
# (an unpacked tarball) every source file except those in build folders.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.h' '*.cc' '*.cu' '*.inc')
else
  mapfile -t files < <(find . -path './build*' -prune -o -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.inc' \) -print | sed 's|^\./||' | sort)
fi

case "${1:-}" in
  check)
    differ=0
    lines=0
    for f in "${files[@]}"; do
      # Lines of the file that the formatter would replace or remove.
      n=$("$formatter" --style=file "$f" | diff -U0 "$f" - | tail -n +3 | grep -c '^-' || true)
      if ((n > 0)); then
        echo "$f: $n line(s) differ"
        differ=$((differ + 1))
        lines=$((lines + n))
      fi
    done
    version=$("$formatter" --version)
    if ((differ > 0)); then
      echo "format: $differ of ${#files[@]} files differ from .clang-format ($lines lines; $version); tools/format.sh fix rewrites them" >&2
      exit 1
    fi
    echo "format: all ${#files[@]} files match .clang-format ($version)"
    ;;
  fix)
    "$formatter" --style=file -i "${files[@]}"
    echo "format: ${#files[@]} files laid out by .clang-format"
    ;;
  *)
    echo "usage: tools/format.sh check | fix" >&2
    exit 2
    ;;
esac
