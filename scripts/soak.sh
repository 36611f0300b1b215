#!/usr/bin/env bash
# A longer crash soak (docs/RELIABILITY.md, "Crash soak"): builds the soak in build/release
# and runs it on every store built, SECONDS (default 600) per store. Must run as root (the
# PostgreSQL soak starts a private server as the `postgres` user). Extra arguments go to
# the test binary, e.g. --gtest_filter=CrashSoak.Redis.
#
#   bash scripts/soak.sh [SECONDS] [gtest arguments...]
#
# IDEM_SOAK_WORKERS (default 4) sets the number of worker processes; IDEM_SOAK_SEED replays
# the controller's choice of faults (not the machine's timing).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
idem_install_deps
seconds=${1:-600}
shift || true
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIDEM_WITH_SQLITE=ON \
  -DIDEM_WITH_POSTGRES=ON -DIDEM_WITH_REDIS=ON >/dev/null
cmake --build build/release -j "$(nproc)" --target soak_test idem_soak_worker
IDEM_REQUIRE_SERVERS=1 IDEM_SOAK_SECONDS=$seconds build/release/tests/soak/soak_test "$@"
