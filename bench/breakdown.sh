#!/usr/bin/env bash
# Where a call's time goes (issue 25, docs/benchmarks.md "Where the time goes"): for each
# store URL, fresh keys and replays, 1 and 32 callers, runs bench/call_cost twice:
#  - as it is: calls/s, this process's CPU per call (every thread) and context switches per
#    call (getrusage around the measured calls);
#  - under callgrind (fewer calls): the instructions per call in each object, summed from
#    the dump of the measured calls alone (bench/callgrind_objects.py). Instruction counts
#    do not depend on the machine's load; the times do.
# Usage: bench/breakdown.sh BUILD_DIR URL...
#   OPS (default 5000) calls per plain run, CG_OPS (default 1000) per callgrind run,
#   CALLERS (default "1 32").
set -euo pipefail
build=$1
shift
cost=$build/bench/call_cost
here=$(cd "$(dirname "$0")" && pwd)
ops=${OPS:-5000}
cg_ops=${CG_OPS:-1000}
out=$(mktemp -d /tmp/idem-breakdown.XXXXXX)
trap 'rm -rf "$out"' EXIT
for url in "$@"; do
  for mode in fresh replay; do
    for callers in ${CALLERS:-1 32}; do
      plain=$("$cost" "$url" "$mode" "$callers" "$ops")
      valgrind --tool=callgrind --dump-instr=no --callgrind-out-file="$out/cg.%p" \
        "$cost" "$url" "$mode" "$callers" "$cg_ops" >/dev/null 2>"$out/valgrind.log"
      dump=$(ls "$out"/cg.*.1)
      echo "$plain ir/call: $(/usr/bin/python3 "$here/callgrind_objects.py" "$dump" "$cg_ops")"
      rm -f "$out"/cg.*
    done
  done
done
