#!/usr/bin/env bash
# Builds and runs every test: a release build (tests, examples, benchmark smoke runs, the
# install test, and the store suites against real PostgreSQL (directly and behind PgBouncer)
# and Redis servers that this script starts on loopback and stops at the end), the crash
# soak on every store (release only, one store after another, under a minute each), then
# the tests again under AddressSanitizer + UndefinedBehaviorSanitizer (clang) and under
# ThreadSanitizer (GCC), then the libFuzzer fuzzers for a bounded time (scripts/fuzz.sh;
# built at the lowest priority beside the stages before). Hygiene is part of it: every C++
# file is clang-format clean (scripts/check_format.sh), the builds treat warnings in idem's
# own code as errors (IDEM_WERROR), and clang-tidy's checks (.clang-tidy, scripts/tidy.sh)
# run over the release build's sources, beside its tests. Prints the time each stage took.
# IDEM_TSAN=0 skips the ThreadSanitizer build; IDEM_FUZZ_SECONDS sets the time per fuzzer
# (default 20 in this script; 0 skips fuzzing).
# Usage: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
source scripts/servers.sh

started=$SECONDS
stage_started=$SECONDS
stages=()
stage_done() {
  local took=$((SECONDS - stage_started))
  stages+=("$(printf '%-44s %5d s' "$1" "$took")")
  echo "== $1: ${took} s"
  stage_started=$SECONDS
}
report_stages() {
  local rc=$?
  echo "== stage times"
  for s in "${stages[@]}"; do echo "   $s"; done
  echo "== total $((SECONDS - started)) s (exit $rc)"
  idem_stop_servers
}
trap report_stages EXIT

idem_install_deps
stage_done "install dependencies"

bash scripts/check_format.sh
stage_done "format check"

jobs=$(nproc)

# Store tests fail, not skip, when a server they need is missing.
export IDEM_REQUIRE_SERVERS=1
idem_start_postgres
# PgBouncer in front of it, default settings, in both pooling modes: the PostgreSQL suites,
# the crash soak and the tool's tests also run through them (label pgbouncer, release only).
idem_start_pgbouncer transaction
idem_start_pgbouncer session
idem_start_redis
# Redis over TLS, behind Sentinel, and as a 3-primary cluster (label redis_topology, release
# only): about 10 s to start, and their tests add about a minute of ctest time.
idem_start_redis_tls
idem_start_redis_sentinel
idem_start_redis_cluster
stage_done "start PostgreSQL, PgBouncer and Redis"

# Work at the lowest priority beside the test stages (clang-tidy, the fuzzers' build): the
# tests spend much of their time waiting on servers and timers, and take the CPU back
# whenever they want it. Each is waited for where its result is needed; what it still had
# to do then is reported as a stage of its own.
declare -A beside_pid beside_log
beside_start() {
  local name=$1 log=$2; shift 2
  (
    t0=$SECONDS
    if nice -n 19 "$@" >"$log" 2>&1; then rc=0; else rc=$?; fi
    echo "$name ran for $((SECONDS - t0)) s beside the other stages" >>"$log"
    exit "$rc"
  ) &
  beside_pid[$name]=$!
  beside_log[$name]=$log
}
beside_wait() {
  local name=$1 rc=0
  wait "${beside_pid[$name]}" || rc=$?
  cat "${beside_log[$name]}"
  stage_done "$name (its rest, waited for)"
  return "$rc"
}

build_and_test() {
  local name=$1 dir=$2; shift 2
  echo "== configure $dir $*"
  cmake -S . -B "$dir" -G Ninja -DIDEM_WITH_SQLITE=ON -DIDEM_WITH_POSTGRES=ON -DIDEM_WITH_REDIS=ON \
    -DIDEM_WITH_SYSTEMD=ON -DIDEM_WERROR=ON "$@" >/dev/null
  echo "== build $dir"
  cmake --build "$dir" -j "$jobs"
  stage_done "$name: build"
  if [[ $name == release ]]; then
    # clang-tidy over the release build's sources, beside its tests.
    beside_start "release: clang-tidy" "$dir/tidy.log" bash scripts/tidy.sh "$dir"
    # The fuzzers' build of their own (clang, coverage, ASan+UBSan), from here on beside
    # every later stage: 164 s of both cores as a stage of its own in the last CI run.
    if [[ "${IDEM_FUZZ_SECONDS:-20}" != 0 ]]; then
      beside_start "fuzz: build" build/fuzz-build.log bash scripts/fuzz.sh --build-only
    fi
  fi
  echo "== test $dir"
  # The crash soak (label `soak`, release build only) runs alone afterwards: it loads the
  # machine on purpose and kills servers of its own.
  ctest --test-dir "$dir" -j "$jobs" --output-on-failure --timeout 600 -LE soak
  stage_done "$name: test"
  if [[ $name == release ]]; then
    beside_wait "release: clang-tidy"
  fi
}

# Debug information is line tables only (-g1) in every build here: enough for a sanitizer's
# or a crash's stack trace, and it cuts the compile time by a quarter to a third (full -g:
# executor_test.cpp took 90 s of CPU at -O2 -g, 56 s at -O2 -g1).
# The Python package (label `python`) is built and tested in the release build only.
build_and_test release build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DIDEM_BUILD_PYTHON=ON
echo "== crash soak build/release"
# --verbose: the figures each soak prints go into the log (docs/RELIABILITY.md quotes them).
# 20 s of faults per store here (IDEM_SOAK_SECONDS; 30 by default), to keep the whole run
# within its budget; scripts/soak.sh runs longer ones.
IDEM_SOAK_SECONDS=${IDEM_SOAK_SECONDS:-20} ctest --test-dir build/release -L soak --verbose
stage_done "release: crash soak"
# The tool's own end-to-end tests (tests/cli: processes spawned by the hundred, CPU-bound
# under a sanitizer) run in the release build only; its parsers are fuzzed under
# AddressSanitizer (scripts/fuzz.sh: arguments, run payloads, store URLs, durations), and
# idem proxy's tests, which run the same binary, stay here.
# Compiled with clang-14 (installed for the fuzzers anyway), so idem's code and tests are
# built by a second compiler with warnings as errors: clang compiles this -O0 ASan build in
# about half GCC's time (Beast's and GoogleTest's templates; cli/proxy/session.cpp took 28 s
# of CPU against 43), and its instrumented tests ran in 145 s against 219. The compiler is
# given on the first configure only: naming it again can make CMake drop its cache.
asan_compiler=()
[[ -f build/asan/CMakeCache.txt ]] || asan_compiler=(-DCMAKE_CXX_COMPILER=clang++-14)
build_and_test asan+ubsan build/asan "${asan_compiler[@]}" -DCMAKE_BUILD_TYPE=Debug \
  "-DCMAKE_CXX_FLAGS_DEBUG=-O0 -g1" -DIDEM_SANITIZE=address,undefined \
  -DIDEM_BUILD_BENCH=OFF -DIDEM_BUILD_EXAMPLES=OFF -DIDEM_CLI_TESTS=OFF
if [[ "${IDEM_TSAN:-1}" != 0 ]]; then
  # A data race fails the test that shows it, not only a line in the log.
  export TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}"
  # -O1: ThreadSanitizer's instrumentation makes -O2 twice as slow to compile (executor_test.cpp:
  # 107 s of CPU at -O2 -g, 39 s at -O1 -g1); races show at -O1 as they do at -O2.
  # The tool's own tests (tests/cli) are left out here (tests/CMakeLists.txt says why).
  build_and_test tsan build/tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DIDEM_SANITIZE=thread \
    -DIDEM_BUILD_BENCH=OFF -DIDEM_BUILD_EXAMPLES=OFF -DIDEM_CLI_TESTS=OFF
fi
if [[ "${IDEM_FUZZ_SECONDS:-20}" != 0 ]]; then
  beside_wait "fuzz: build"
  bash scripts/fuzz.sh "${IDEM_FUZZ_SECONDS:-20}"
  stage_done "fuzz: run"
fi
echo "== all tests passed in $((SECONDS - started)) s"
