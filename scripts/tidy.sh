#!/usr/bin/env bash
# Runs clang-tidy 14 (.clang-tidy's checks) over src/ and cli/ in parallel, from a build's
# compile_commands.json, and fails on any finding.
#   bash scripts/tidy.sh [BUILD_DIR]     (default: build/dev; configured if missing)
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:-build/dev}
RUN_CLANG_TIDY=${RUN_CLANG_TIDY:-run-clang-tidy-14}
CLANG_TIDY=${CLANG_TIDY:-clang-tidy-14}
command -v "$RUN_CLANG_TIDY" > /dev/null || {
  echo "tidy: $RUN_CLANG_TIDY not found (apt-get install clang-tidy-14)" >&2
  exit 2
}
if [[ ! -f $build/compile_commands.json ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > /dev/null
fi
# Generated headers (version.h, the store registry) must exist before clang-tidy reads.
cmake --build "$build" --target idem > /dev/null

jobs=${IDEM_TIDY_JOBS:-$(nproc)}
start=$(date +%s)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Files under src/ and cli/ only (the regexes match compile_commands.json's absolute paths).
if ! "$RUN_CLANG_TIDY" -quiet -clang-tidy-binary "$(command -v "$CLANG_TIDY")" -p "$build" \
    -j "$jobs" "$PWD/(src|cli)/" > "$log" 2>&1; then
  grep -E 'warning:|error:' "$log" | sort -u >&2 || cat "$log" >&2
  echo "tidy: findings (above); $(($(date +%s) - start)) s" >&2
  exit 1
fi
if grep -qE '(warning|error):' "$log"; then
  grep -E 'warning:|error:' "$log" | sort -u >&2
  echo "tidy: findings (above); $(($(date +%s) - start)) s" >&2
  exit 1
fi
echo "tidy: clean, $(($(date +%s) - start)) s"
