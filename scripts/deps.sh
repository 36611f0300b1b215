#!/usr/bin/env bash
# Installs, with apt-get, whatever of the build and test dependencies is missing.
# Sourced by scripts/run.sh and scripts/test.sh.
set -euo pipefail

IDEM_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libsqlite3-dev sqlite3 libhiredis-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libfmt-dev nlohmann-json3-dev
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
  python3-httpx
)

idem_install_deps() {
  local missing=()
  for p in "${IDEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "== installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}
