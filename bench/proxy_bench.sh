#!/usr/bin/env bash
# Measures `idem proxy` with wrk against the upstream directly and through the proxy, in the
# same run, on an SQLite store (docs/proxy.md, "Figures"):
#
#   direct         wrk -> idem_test_upstream                       (the baseline)
#   pass-through   wrk -> idem proxy -> upstream, no Idempotency-Key
#   fresh keys     wrk -> idem proxy -> upstream, a new key on every request (recorded)
#   replays        wrk -> idem proxy, 100 keys answered before (never reaches the upstream)
#
# once with an upstream that answers at once and once with one that works DELAY_MS per
# request, plus `idem bench` on the same kind of store for the store's own cost of a fresh
# run (acquire + complete). Prints a Markdown table, with the CPU time the proxy and the
# upstream spent per request (from /proc, so it holds on a busy machine too).
#
# Usage: bash bench/proxy_bench.sh [BUILD_DIR]   (default build/release, built with the
#        targets idem_cli and idem_test_upstream)
# Environment: DURATION (default 10s), CONNECTIONS (default 32), DELAYS (default "0 1"),
#              PROXY_THREADS (default 2), STORE_THREADS (default 4).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
duration=${DURATION:-10s}
connections=${CONNECTIONS:-32}
delays=${DELAYS:-0 1}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }

bench=proxy-bench
source bench/proxy_common.sh

"$idem" proxy --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$up" \
  --store "sqlite://$work/proxy.db" --threads "${PROXY_THREADS:-2}" \
  --store-threads "${STORE_THREADS:-4}" 2>"$work/proxy.err" &
proxy_pid=$!
pids+=($proxy_pid)
for _ in $(seq 1 100); do grep -q "listening on" "$work/proxy.err" 2>/dev/null && break; sleep 0.05; done
px=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$work/proxy.err" | cut -d: -f2)

# CPU time (user + system) a process has used, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# Runs wrk; prints "requests/s p50 p99 proxy-cpu upstream-cpu": latencies in ms, CPU in
# microseconds per request (what each process spent, whatever else the machine runs).
measure() {
  local url=$1 script=$2
  local out p0 u0 p1 u1
  p0=$(cpu_ticks "$proxy_pid")
  u0=$(cpu_ticks "$upstream_pid")
  out=$(wrk -t1 -c"$connections" -d"$duration" --latency -s "bench/proxy/$script" "$url")
  p1=$(cpu_ticks "$proxy_pid")
  u1=$(cpu_ticks "$upstream_pid")
  local rps p50 p99 requests
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  local tick_us=$((1000000 / $(getconf CLK_TCK)))
  echo "$rps $(to_ms "$p50") $(to_ms "$p99") $(((p1 - p0) * tick_us / requests)) $(((u1 - u0) * tick_us / requests))"
}
to_ms() {
  awk -v v="$1" 'BEGIN {
    if (v ~ /us$/) { sub(/us$/, "", v); printf "%.2f", v / 1000 }
    else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.2f", v }
    else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.2f", v * 1000 }
    else printf "%s", v }'
}
row() {
  local name=$1 base_rps=$2; shift 2
  read -r rps p50 p99 proxy_cpu upstream_cpu <<<"$*"
  printf '| %s | %s | %.0f | %.2f | %s | %s | %s | %s |\n' "$DELAY_MS" "$name" "$rps" \
    "$(awk -v a="$rps" -v b="$base_rps" 'BEGIN {print a / b}')" "$p50" "$p99" "$proxy_cpu" \
    "$upstream_cpu"
}

echo "wrk -t1 -c$connections -d$duration; proxy --threads ${PROXY_THREADS:-2} --store-threads ${STORE_THREADS:-4}; SQLite store; $(nproc) cores"
echo
echo "| upstream work (ms) | path | requests/s | / direct | p50 (ms) | p99 (ms) | proxy CPU (µs/request) | upstream CPU (µs/request) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for DELAY_MS in $delays; do
  export DELAY_MS
  export RUN_ID="run$DELAY_MS-$RANDOM"
  direct=$(measure "http://127.0.0.1:$up" pass.lua)
  base=$(cut -d' ' -f1 <<<"$direct")
  row direct "$base" "$direct"
  row pass-through "$base" "$(measure "http://127.0.0.1:$px" pass.lua)"
  row "fresh keys" "$base" "$(measure "http://127.0.0.1:$px" fresh.lua)"
  # Record the hot keys first (unmeasured), then measure replays of them.
  DURATION_SAVE=$duration
  duration=1s
  measure "http://127.0.0.1:$px" replay.lua >/dev/null
  duration=$DURATION_SAVE
  row replays "$base" "$(measure "http://127.0.0.1:$px" replay.lua)"
done

echo
# The store's own cost of a fresh run and of a replay, one at a time (executor over SQLite,
# no HTTP), for comparison with what a fresh key adds to the proxy's latency.
for mode in fresh replay; do
  "$idem" bench --store "sqlite://$work/bench.db" --mode "$mode" --concurrency 1 --ops 5000 \
    --json 2>/dev/null |
    awk -v mode="$mode" '/"ops_per_s"/ {gsub(/,/, ""); rps = $2}
                         /"p50"/ {gsub(/,/, ""); p50 = $2}
                         /"p99"/ {gsub(/,/, ""); p99 = $2}
                         END {printf "- `idem bench --mode %s` (SQLite, 1 caller): %.0f/s, p50 %.3f ms, p99 %.3f ms\n", mode, rps, p50 / 1000, p99 / 1000}'
done
