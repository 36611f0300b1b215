#!/usr/bin/env bash
# The store's load from duplicates waiting on one busy key (issue 23): WAITERS separate
# `idem run --wait` processes (default 100) wait while an owner holds the key for BUSY
# seconds (default 10), once with the store's notification off (the waiters only poll:
# 10 ms doubling to 1 s, SPEC §7) and once with it on (the polls become the fallback, every
# WaitPolicy::watched_backoff, 5 s). Prints the commands per second the server saw during
# the busy time (Redis: INFO's total_commands_processed; PostgreSQL: pg_stat_database's
# transactions), and how long the last waiter took to answer once the owner finished.
#
# Usage: bash bench/waiter_load.sh BUILD_DIR
# Stores: $IDEM_TEST_REDIS_URL and $IDEM_TEST_POSTGRES_URL, each when set (scripts/servers.sh
# starts both: `source scripts/servers.sh; idem_start_redis; idem_start_postgres`).
set -euo pipefail
build=${1:?usage: bash bench/waiter_load.sh BUILD_DIR}
idem=$build/cli/idem
waiters=${WAITERS:-100}
busy=${BUSY:-10}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

with_param() {  # URL PARAM=VALUE
  if [[ $1 == *\?* ]]; then echo "$1&$2"; else echo "$1?$2"; fi
}

redis_count() {
  redis-cli -u "$1" INFO stats | tr -d '\r' | awk -F: '$1 == "total_commands_processed" { print $2 }'
}

postgres_count() {
  # Statistics reach pg_stat_database within a second of a transaction's end.
  psql "$1" -Atc "SELECT xact_commit + xact_rollback FROM pg_stat_database
                  WHERE datname = current_database()"
}

now_ms() { date +%s%3N; }

# measure KIND URL: one line of the table.
measure() {
  local kind=$1 url=$2 label=$3
  local key
  key="waiters-$label-$RANDOM$RANDOM"
  "$idem" run --store "$url" --key "$key" --lease 60s -- sleep "$((busy + 2))" >/dev/null &
  local owner=$!
  sleep 1
  local pids=()
  for ((i = 0; i < waiters; i++)); do
    ( "$idem" run --store "$url" --key "$key" --wait 60s -- true >/dev/null
      now_ms >"$tmp/done.$label.$i" ) &
    pids+=($!)
  done
  sleep 1  # the waiters start, find the key busy and settle into their wait
  local c0 c1
  c0=$("${kind}_count" "$url")
  sleep "$busy"
  c1=$("${kind}_count" "$url")
  wait "$owner"
  local ended
  ended=$(now_ms)
  wait "${pids[@]}"
  local last
  last=$(cat "$tmp"/done."$label".* | sort -n | tail -1)
  printf '| %-10s | %-24s | %7d | %12.1f | %14d |\n' "$kind" "$label" "$waiters" \
    "$(echo "($c1 - $c0) / $busy" | bc -l)" "$((last - ended))"
}

echo "| store      | notification             | waiters | calls/s seen | last answer after the owner ended (ms) |"
echo "| ---------- | ------------------------ | ------: | -----------: | --------------: |"
for kind in redis postgres; do
  var="IDEM_TEST_${kind^^}_URL"
  url=${!var:-}
  [[ -n $url ]] || continue
  measure "$kind" "$(with_param "$url" notify=off)" "off (polling only)"
  measure "$kind" "$(with_param "$url" notify=on)" "on (watched)"
done
