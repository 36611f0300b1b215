#!/usr/bin/env bash
# The main job: builds the library and the `idem` tool, then runs a command twice under one
# key on the default embedded SQLite store, showing the second run replay the first.
# Usage: bash scripts/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
idem_install_deps

cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIDEM_WITH_SQLITE=ON >/dev/null
cmake --build build/release -j "$(nproc)" --target idem_cli
idem=build/release/cli/idem

key="demo-$(date +%s)-$$"
echo
echo "== first run: the command runs and its output is recorded (key $key)"
"$idem" run --scope demo --key "$key" -- sh -c 'echo "charged card at $(date +%T.%N), fencing token $IDEM_TOKEN"'
echo
echo "== second run, same key: nothing runs, the stored output is replayed"
"$idem" run --scope demo --key "$key" -- sh -c 'echo "this must not print"'
echo
echo "== the record"
"$idem" show --scope demo --key "$key"
