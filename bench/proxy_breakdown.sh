#!/usr/bin/env bash
# Where `idem proxy` spends a request's instructions (issue 25, docs/benchmarks.md "Where the
# time goes"): the proxy runs under callgrind in front of idem_test_upstream (not under
# callgrind), and for each kind of request (pass-through, fresh key, replay) wrk sends
# requests for DURATION after a warm-up; the counters are zeroed before and dumped after, and
# bench/callgrind_objects.py --parts divides the dump by the requests wrk saw answered.
# Instruction counts do not depend on the machine's load (the requests per second under
# callgrind mean nothing and are not printed).
#
# Usage: bash bench/proxy_breakdown.sh [BUILD_DIR] [STORE_URL]
#   BUILD_DIR: default build/release, with the targets idem_cli and idem_test_upstream;
#   STORE_URL: default an SQLite database in a temporary directory.
# Environment: DURATION (default 10s), CONNECTIONS (default 4), PROXY_THREADS (default 2),
#              STORE_THREADS (default 4), KEEP (a directory: the dumps are copied there as
#              KIND.callgrind, for callgrind_annotate).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
duration=${DURATION:-10s}
connections=${CONNECTIONS:-4}
for p in wrk valgrind callgrind_control; do
  command -v "$p" >/dev/null || { echo "$p is not installed" >&2; exit 1; }
done

bench=proxy-breakdown
source bench/proxy_common.sh
store=${2:-sqlite://$work/proxy.db}

valgrind --tool=callgrind --dump-instr=no --callgrind-out-file="$work/cg.%p" \
  "$idem" proxy --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$up" --store "$store" \
  --threads "${PROXY_THREADS:-2}" --store-threads "${STORE_THREADS:-4}" 2>"$work/proxy.err" &
proxy_pid=$!
pids+=($proxy_pid)
for _ in $(seq 1 600); do grep -q "listening on" "$work/proxy.err" 2>/dev/null && break; sleep 0.1; done
px=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$work/proxy.err" | cut -d: -f2)
[[ -n $px ]] || { cat "$work/proxy.err" >&2; exit 1; }

# Runs wrk for `duration` with a script; prints the number of requests answered.
requests() {
  local script=$1 d=$2 out
  out=$(wrk -t1 -c"$connections" -d"$d" --timeout 30s -s "bench/proxy/$script" "http://127.0.0.1:$px")
  awk '/requests in/ {print $1}' <<<"$out"
}

# The dumps callgrind_control has asked for so far, oldest first (cg.PID.1, cg.PID.2, ...).
dumps() { find "$work" -name 'cg.*.*' | sort -t. -k3 -n; }

export DELAY_MS=0 RUN_ID="breakdown-$RANDOM"
echo "idem proxy under callgrind, store $store; wrk -t1 -c$connections -d$duration per kind"
echo
for kind in pass-through fresh replay; do
  case $kind in
    pass-through) script=pass.lua ;;
    fresh) script=fresh.lua ;;
    replay) script=replay.lua ;;
  esac
  # Warm-up, unmeasured (for replays: records the hot keys).
  requests "$script" 3s >/dev/null
  callgrind_control -z "$proxy_pid" >/dev/null 2>&1
  n=$(requests "$script" "$duration")
  before=$(dumps | wc -l)
  callgrind_control -d "$kind" "$proxy_pid" >/dev/null 2>&1
  for _ in $(seq 1 100); do
    (($(dumps | wc -l) > before)) && break
    sleep 0.1
  done
  dump=$(dumps | tail -1)
  [[ -n ${KEEP:-} ]] && cp "$dump" "$KEEP/$kind.callgrind"
  echo "$kind: $n requests; instructions per request: $(/usr/bin/python3 bench/callgrind_objects.py --parts "$dump" "$n")"
done
