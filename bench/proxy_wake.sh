#!/usr/bin/env bash
# How soon `idem proxy --wait` answers a duplicate once the first request's answer is
# recorded (issue 23, docs/benchmarks.md "Waiting without polling"): the first request takes
# HOLD_MS at the upstream; its duplicate arrives 20 ms later and waits. The figure is the
# time from the first answer reaching its client to the duplicate's answer reaching its
# client, SAMPLES times, p50 and p99, for a duplicate sent to the same proxy (the owner is
# in its memory) and to a second proxy on the same store (the store's notification).
#
# Usage: bash bench/proxy_wake.sh [BUILD_DIR] [STORE_URL]
#   BUILD_DIR: default build/release (targets idem_cli and idem_test_upstream);
#   STORE_URL: default an SQLite database in a temporary directory.
# Environment: SAMPLES (default 50), HOLD_MS (default 100).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
samples=${SAMPLES:-50}
hold=${HOLD_MS:-100}

bench=proxy-wake
source bench/proxy_common.sh
store=${2:-sqlite://$work/proxy.db}

# Starts a proxy on the store; sets `port` to the port it listens on.
start_proxy() {
  local name=$1
  "$idem" proxy --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$up" --store "$store" \
    --wait 10s 2>"$work/$name.err" &
  pids+=($!)
  for _ in $(seq 1 100); do grep -q "listening on" "$work/$name.err" 2>/dev/null && break; sleep 0.05; done
  port=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$work/$name.err" | cut -d: -f2)
}
start_proxy first
first=$port
start_proxy second
second=$port

# One POST with a key (one Host header for both proxies: the host is part of the scope);
# prints the wall-clock time (s, ns resolution) its answer arrived.
post() {
  local port=$1 key=$2
  curl -s -o /dev/null -X POST -H "Host: api.example" -H "Idempotency-Key: $key" \
    -H "X-Test-Delay-Ms: $hold" \
    -H 'Content-Type: application/json' --data '{"amount":10}' "http://127.0.0.1:$port/pay"
  date +%s.%N
}

# p50 and p99 of the numbers on standard input, in ms.
percentiles() {
  sort -n | awk '{v[NR] = $1} END {
    p50 = v[int((NR - 1) * 0.50) + 1]; p99 = v[int((NR - 1) * 0.99) + 1]
    printf "p50 %.2f ms, p99 %.2f ms (%d samples)", p50, p99, NR }'
}

for where in "same proxy" "another proxy"; do
  dup_port=$first
  [[ $where == "another proxy" ]] && dup_port=$second
  for i in $(seq 1 "$samples"); do
    key="wake-$RANDOM-$i"
    post "$first" "$key" >"$work/a" &
    a=$!
    sleep 0.02
    b_done=$(post "$dup_port" "$key")
    wait "$a"
    awk -v a="$(cat "$work/a")" -v b="$b_done" 'BEGIN {printf "%.3f\n", (b - a) * 1000}'
  done >"$work/gaps"
  echo "$where: $(percentiles <"$work/gaps")"
done
