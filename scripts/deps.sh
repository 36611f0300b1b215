#!/usr/bin/env bash
# Installs, with apt-get, whatever of the build and test dependencies is missing.
# Sourced by scripts/run.sh, scripts/test.sh and scripts/soak.sh.
set -euo pipefail

# What scripts/run.sh's build needs: the `idem` tool on the SQLite store alone (no other
# store, no `idem proxy`, no Python package, tests, benchmarks or examples).
IDEM_RUN_PACKAGES=(
  build-essential cmake ninja-build
  libsqlite3-dev libcli11-dev libfmt-dev nlohmann-json3-dev
)

# Everything: the full build and every test (scripts/test.sh).
IDEM_PACKAGES=(
  "${IDEM_RUN_PACKAGES[@]}"
  pkg-config git sqlite3 libhiredis-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  postgresql-15 postgresql-client-15 libpq-dev faketime redis-server redis-tools
  pgbouncer  # in front of the test PostgreSQL in both pooling modes (scripts/servers.sh)
  libboost-dev libssl-dev curl wrk
  openssl  # certificates for the Redis TLS tests (scripts/servers.sh, idem_make_tls_certs)
  libsystemd-dev systemd python3-yaml  # idem proxy: sd_notify; its deployment examples' tests
  util-linux bsdutils  # setpriv and script, for the idem tool's tests
  clang-14 libfuzzer-14-dev  # the ASan+UBSan build (scripts/test.sh) and the fuzzers (scripts/fuzz.sh)
  clang-format-14 clang-tidy-14  # scripts/check_format.sh, scripts/tidy.sh
  # the Python package (python/, docs/python.md) and its tests
  python3-dev pybind11-dev python3-pybind11 python3-setuptools python3-wheel python3-pip
  python3-venv python3-pytest python3-redis python3-psycopg python3-starlette python3-uvicorn
  python3-httpx ccache  # ccache: python/setup.py compiles through it when it is there
)

# idem_install_deps [PACKAGE...]: the packages given (by default IDEM_PACKAGES).
idem_install_deps() {
  local wanted=("$@") missing=()
  ((${#wanted[@]})) || wanted=("${IDEM_PACKAGES[@]}")
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "== installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}
