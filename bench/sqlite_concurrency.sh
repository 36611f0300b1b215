#!/usr/bin/env bash
# The SQLite store under concurrency (figures in docs/stores/sqlite.md): `idem bench` runs
# fresh keys through Executor::run at 1, 8 and 32 threads, with synchronous=normal and full,
# each run on a new file. Several `idem` binaries (say, one built from main and one from a
# branch) take turns run by run, so they share the machine's conditions. Prints a markdown
# table of medians over the repetitions (failed runs: the count in each repetition).
#
# Usage: bench/sqlite_concurrency.sh [-r REPS] [-d DIR] IDEM [IDEM...]
#   REPS  repetitions of every configuration (default 3)
#   DIR   where the database files go (default: a new temporary directory, removed at exit)
set -euo pipefail

reps=3
dir=""
while getopts "r:d:" opt; do
  case $opt in
    r) reps=$OPTARG ;;
    d) dir=$OPTARG ;;
    *) echo "usage: $0 [-r REPS] [-d DIR] IDEM [IDEM...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
(($# > 0)) || { echo "usage: $0 [-r REPS] [-d DIR] IDEM [IDEM...]" >&2; exit 2; }
results=$(mktemp)
tmpdir=""
if [[ -z $dir ]]; then
  tmpdir=$(mktemp -d)
  dir=$tmpdir
fi
cleanup() {
  rm -f "$results"
  if [[ -n $tmpdir ]]; then rm -rf "$tmpdir"; fi
}
trap cleanup EXIT

# Operations per run: enough for a couple of seconds each. One thread with
# synchronous=full pays an fsync per write, so it runs fewer.
ops_for() {
  if [[ $1 == full && $2 == 1 ]]; then echo 3000; else echo 20000; fi
}

for ((rep = 1; rep <= reps; rep++)); do
  for sync in normal full; do
    for threads in 1 8 32; do
      for idem in "$@"; do
        db="$dir/bench.db"
        rm -f "$db" "$db-wal" "$db-shm"
        # A run with failed operations (say, a lock held past the busy timeout) still prints
        # its figures, and the count of failures.
        out=$("$idem" bench --store "sqlite://$db?synchronous=$sync" \
          --ops "$(ops_for $sync $threads)" --concurrency "$threads" 2>&1) || true
        # throughput  9386 ops/s
        # latency     p50 69.5 us   p99 186.7 us   p99.9 5377.0 us   max 11125.9 us
        # idem bench: 33 of 20000 operations failed; the first:
        echo "$out" | awk -v b="$idem" -v s="$sync" -v t="$threads" '
          BEGIN { failed = 0 }
          /^throughput/ { rate = $2 }
          /^latency/ { p50 = $3; p99 = $6; max = $12 }
          /operations failed/ { failed = $3 }
          END { print b, s, t, rate, p50, p99, max, failed }' >>"$results"
      done
    done
  done
done
rm -f "$dir/bench.db" "$dir/bench.db-wal" "$dir/bench.db-shm"

# The disk's rate of synced writes, one at a time: what a write that waits for its own
# fsync can reach (a fresh run makes two writes).
dd if=/dev/zero of="$dir/sync.test" bs=4k count=2000 oflag=dsync 2>&1 |
  awk '/copied/ { for (i = 1; i <= NF; i++) if ($i == "s,") printf "synced 4 KiB writes, one at a time (dd oflag=dsync): %d/s\n\n", 2000 / $(i - 1) }'
rm -f "$dir/sync.test"

echo "| idem | synchronous | threads | runs/s | p50 | p99 | max | failed runs |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
sort -k1,1 -k2,2r -k3,3n -s "$results" | awk '
  function median(list,   n, a, i, j, x) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j > 0 && a[j] + 0 > x + 0; j--) a[j + 1] = a[j]; a[j + 1] = x }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function ms(us) { return sprintf("%.2f ms", us / 1000) }
  function flush() {
    if (key == "") return
    printf "| %s | %s | %s | %d | %s | %s | %s | %s |\n", b, s, t, median(rate), ms(median(p50)),
           ms(median(p99)), ms(median(max)), substr(failed, 2)
  }
  {
    k = $1 " " $2 " " $3
    if (k != key) { flush(); key = k; b = $1; s = $2; t = $3; rate = p50 = p99 = max = failed = "" }
    rate = rate " " $4; p50 = p50 " " $5; p99 = p99 " " $6; max = max " " $7; failed = failed " " $8
  }
  END { flush() }'
