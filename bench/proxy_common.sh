# Sourced by the proxy benches (proxy_bench.sh, proxy_breakdown.sh, proxy_wake.sh) after
# they set `build` (a build directory) and `bench` (a name for the temporary directory):
# checks the two binaries, makes `work` (removed on exit with every process in `pids`), and
# starts the do-nothing upstream, setting `idem`, `upstream_bin`, `upstream_pid` and `up`
# (its port).
idem=$build/cli/idem
upstream_bin=$build/tests/proxy/idem_test_upstream
for f in "$idem" "$upstream_bin"; do
  [[ -x $f ]] || { echo "missing $f: cmake --build $build --target idem_cli idem_test_upstream" >&2; exit 1; }
done

work=$(mktemp -d "/tmp/idem-$bench.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$upstream_bin" --port-file "$work/upstream.port" &
upstream_pid=$!
pids+=($upstream_pid)
for _ in $(seq 1 100); do [[ -s $work/upstream.port ]] && break; sleep 0.05; done
up=$(cat "$work/upstream.port")
