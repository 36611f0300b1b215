#!/usr/bin/env bash
# Builds and runs every test: a release build (tests, examples, benchmark smoke runs, the
# install test), then the tests again under AddressSanitizer + UndefinedBehaviorSanitizer
# and under ThreadSanitizer. IDEM_TSAN=0 skips the ThreadSanitizer build.
# Usage: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
idem_install_deps

jobs=$(nproc)
started=$SECONDS

build_and_test() {
  local dir=$1; shift
  echo "== configure $dir $*"
  cmake -S . -B "$dir" -G Ninja -DIDEM_WITH_SQLITE=ON "$@" >/dev/null
  echo "== build $dir"
  cmake --build "$dir" -j "$jobs"
  echo "== test $dir"
  ctest --test-dir "$dir" -j "$jobs" --output-on-failure --timeout 600
}

build_and_test build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo
build_and_test build/asan -DCMAKE_BUILD_TYPE=Debug -DIDEM_SANITIZE=address,undefined \
  -DIDEM_BUILD_BENCH=OFF -DIDEM_BUILD_EXAMPLES=OFF
if [[ "${IDEM_TSAN:-1}" != 0 ]]; then
  # A data race fails the test that shows it, not only a line in the log.
  export TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}"
  build_and_test build/tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIDEM_SANITIZE=thread \
    -DIDEM_BUILD_BENCH=OFF -DIDEM_BUILD_EXAMPLES=OFF
fi
echo "== all tests passed in $((SECONDS - started)) s"
