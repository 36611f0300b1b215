#!/usr/bin/env bash
# The store's load from duplicates waiting on one busy key (issue 23): WAITERS separate
# `idem run --wait` processes (default 100) wait while an owner holds the key for BUSY
# seconds (default 10) after they all found it busy, once with the store's notification
# off (the waiters only poll: 10 ms doubling to 1 s, SPEC §7) and once with it on (woken when
# the owner ends; the polls are the fallback, every WaitPolicy::watched_backoff, 5 s).
# Prints what the server saw per second during that time (Redis: every command, INFO's
# total_commands_processed, and the acquire script's calls, EVALSHA; PostgreSQL:
# transactions, pg_stat_database), and how long after the owner was let go the last
# waiter answered (the owner's own complete included).
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

# The server's count of calls so far: every command (Redis), every transaction (PostgreSQL),
# then, for Redis, the acquire script's calls alone (EVALSHA).
redis_count() {
  redis-cli -u "$1" INFO all | tr -d '\r' | awk -F'[:=,]' '
    $1 == "total_commands_processed" { total = $2 }
    $1 == "cmdstat_evalsha" { evalsha = $3 }
    END { print total + 0, evalsha + 0 }'
}

postgres_count() {
  # Statistics reach pg_stat_database within a second of a transaction's end.
  echo "$(psql "$1" -Atc "SELECT xact_commit + xact_rollback FROM pg_stat_database
                          WHERE datname = current_database()") -"
}

now_ms() { date +%s%3N; }

# measure KIND URL COUNT_URL LABEL: one line of the table.
measure() {
  local kind=$1 url=$2 count_url=$3 label=$4 tag=$5
  local key="waiters-$tag-$RANDOM$RANDOM"
  # The owner holds the key until this script lets it go.
  "$idem" run --store "$url" --key "$key" --lease 60s -- \
    sh -c "while [ ! -e '$tmp/release.$tag' ]; do sleep 0.02; done" >/dev/null &
  local owner=$!
  sleep 1
  local pids=()
  for ((i = 0; i < waiters; i++)); do
    ( "$idem" run --store "$url" --key "$key" --wait 60s -- true >/dev/null
      now_ms >"$tmp/done.$tag.$i" ) &
    pids+=($!)
  done
  sleep 2  # every waiter has found the key busy and settled into its wait
  local c0 c1
  read -r -a c0 <<<"$("${kind}_count" "$count_url")"
  sleep "$busy"
  read -r -a c1 <<<"$("${kind}_count" "$count_url")"
  local released
  released=$(now_ms)
  touch "$tmp/release.$tag"
  wait "$owner"
  wait "${pids[@]}"
  local answers=() p50 last
  mapfile -t answers < <(cat "$tmp"/done."$tag".* | sort -n)
  p50=$((answers[${#answers[@]} / 2] - released))
  last=$((answers[${#answers[@]} - 1] - released))
  local scripts="-"
  if [[ ${c0[1]} != - ]]; then scripts=$(printf '%.1f' "$(echo "(${c1[1]} - ${c0[1]}) / $busy" | bc -l)"); fi
  printf '| %-8s | %-18s | %7d | %13.1f | %10s | %6d / %6d |\n' "$kind" "$label" "$waiters" \
    "$(echo "(${c1[0]} - ${c0[0]}) / $busy" | bc -l)" "$scripts" "$p50" "$last"
}

echo "| store    | notification       | waiters | calls/s (all) | acquires/s | answered after the owner let go, p50 / last (ms) |"
echo "| -------- | ------------------ | ------: | ------------: | ---------: | ---------------: |"
for kind in redis postgres; do
  var="IDEM_TEST_${kind^^}_URL"
  url=${!var:-}
  [[ -n $url ]] || continue
  measure "$kind" "$(with_param "$url" notify=off)" "$url" "off (polling only)" "$kind-off"
  measure "$kind" "$(with_param "$url" notify=on)" "$url" "on (watched)" "$kind-on"
done
