#!/usr/bin/env bash
# Checks every tracked C++ file (*.cpp, *.h) against the repository's .clang-format with
# clang-format 14 (Debian's clang-format-14): lists the files that drift and fails.
#   bash scripts/check_format.sh         check only (exit 1 when a file drifts)
#   bash scripts/check_format.sh --fix   reformat the files in place
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG_FORMAT=${CLANG_FORMAT:-clang-format-14}
command -v "$CLANG_FORMAT" > /dev/null || {
  echo "check_format: $CLANG_FORMAT not found (apt-get install clang-format-14)" >&2
  exit 2
}

mapfile -d '' files < <(git ls-files -z -- '*.cpp' '*.h')
if [[ ${1:-} == --fix ]]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$CLANG_FORMAT" -i --style=file
  exit 0
fi
if [[ $# -gt 0 ]]; then
  echo "usage: $0 [--fix]" >&2
  exit 2
fi

drift=()
for f in "${files[@]}"; do
  "$CLANG_FORMAT" --style=file --dry-run -Werror "$f" > /dev/null 2>&1 || drift+=("$f")
done
if ((${#drift[@]})); then
  printf 'not clang-format clean: %s\n' "${drift[@]}" >&2
  echo "check_format: ${#drift[@]} of ${#files[@]} files drift; run: bash scripts/check_format.sh --fix" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files clean"
