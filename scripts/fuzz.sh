#!/usr/bin/env bash
# Builds the libFuzzer fuzzers (fuzz/, docs/RELIABILITY.md "Fuzzing") with clang-14 in
# build/fuzz, then runs each for a bounded time on its committed seed corpus
# (fuzz/corpus/<name>/, read only) plus a working corpus in build/fuzz/corpus/<name>/
# (new inputs go there and carry over to the next run in the same tree). Two fuzzers run at
# once (IDEM_FUZZ_JOBS). Prints each fuzzer's executions; a crash, a hang (an input taking
# more than 10 s) or a leak fails the script and leaves the input in build/fuzz/artifacts/.
# Replay one with: build/fuzz/fuzz/<fuzzer> build/fuzz/artifacts/<fuzzer>-crash-...
# Usage: bash scripts/fuzz.sh [seconds per fuzzer, default 30 | --build-only]
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-30}
build_only=0
[[ "$seconds" == --build-only ]] && build_only=1
jobs=${IDEM_FUZZ_JOBS:-2}
dir=build/fuzz

echo "== configure $dir"
# The compiler is given on the first configure only: naming it again, however spelled, can
# make CMake drop the cache and rebuild everything.
compiler=()
[[ -f "$dir/CMakeCache.txt" ]] || compiler=(-DCMAKE_CXX_COMPILER=clang++-14)
cmake -S . -B "$dir" -G Ninja "${compiler[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DIDEM_BUILD_FUZZERS=ON -DIDEM_BUILD_TESTS=OFF -DIDEM_BUILD_BENCH=OFF \
  -DIDEM_BUILD_EXAMPLES=OFF -DIDEM_BUILD_PROXY=OFF -DIDEM_WITH_SQLITE=ON -DIDEM_WITH_POSTGRES=ON \
  -DIDEM_WITH_REDIS=ON >/dev/null
echo "== build $dir"
cmake --build "$dir" --target fuzzers -j "$(nproc)"
((build_only)) && exit 0

mkdir -p "$dir/artifacts" "$dir/logs"
fuzzers=()
for seeds in fuzz/corpus/*/; do
  name=$(basename "$seeds")
  [[ -x "$dir/fuzz/$name" ]] || { echo "== $name: not built in this configuration" >&2; exit 1; }
  fuzzers+=("$name")
done

run_one() {
  local name=$1
  mkdir -p "$dir/corpus/$name"
  # -timeout: an input that takes 10 s is a hang; -rss_limit_mb: a runaway allocation.
  "$dir/fuzz/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$dir/artifacts/$name-" \
    "$dir/corpus/$name" "fuzz/corpus/$name" >"$dir/logs/$name.log" 2>&1
}

echo "== fuzzing ${#fuzzers[@]} fuzzers, $seconds s each, $jobs at a time"
declare -A pids
for name in "${fuzzers[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do sleep 1; done
  run_one "$name" &
  pids[$name]=$!
done

failed=0
for name in "${fuzzers[@]}"; do
  if wait "${pids[$name]}"; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/logs/$name.log")
    printf '   %-20s %12s executions in %s s, corpus %s inputs\n' "$name" "${execs:-?}" "$seconds" \
      "$(find "$dir/corpus/$name" -type f | wc -l)"
  else
    failed=1
    echo "== $name FAILED (log: $dir/logs/$name.log):"
    grep -v '^#\|^INFO\|^MS:' "$dir/logs/$name.log" | tail -40
    ls "$dir/artifacts/$name-"* 2>/dev/null || true
  fi
done
exit $failed
