#!/usr/bin/env bash
# The main job: builds the `idem` tool, then runs a command twice under one key on the
# default embedded SQLite store, showing the second run replay the first.
#
# The demo needs the tool on SQLite and nothing else, so it is built in a directory of its
# own, build/run (build/release, the full build of scripts/test.sh, is left alone), with
# the SQLite store only: no PostgreSQL or Redis store, no `idem proxy`, no Python package,
# tests, benchmarks or examples; and only the packages that build needs are installed
# (IDEM_RUN_PACKAGES in scripts/deps.sh). README.md says how long the first build takes.
# Usage: bash scripts/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
idem_install_deps "${IDEM_RUN_PACKAGES[@]}"

build=build/run
echo "== configuring $build: the idem tool on the SQLite store alone"
# -O2 without debug information: the quickest optimised build (GCC 12 at -O3 also warns,
# wrongly, about a string copy in src/core/url.cpp).
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DIDEM_WITH_SQLITE=ON -DIDEM_WITH_POSTGRES=OFF -DIDEM_WITH_REDIS=OFF \
  -DIDEM_BUILD_PROXY=OFF -DIDEM_BUILD_PYTHON=OFF -DIDEM_WITH_TESTING=OFF \
  -DIDEM_BUILD_TESTS=OFF -DIDEM_BUILD_BENCH=OFF -DIDEM_BUILD_EXAMPLES=OFF >/dev/null
echo "== building $build/cli/idem: the first time compiles 43 files (README.md: about 1.5 min"
echo "   on 2 cores); later runs rebuild nothing"
cmake --build "$build" -j "$(nproc)" --target idem_cli
idem=$build/cli/idem

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
