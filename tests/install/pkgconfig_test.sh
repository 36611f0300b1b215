#!/usr/bin/env bash
# Builds the consumer with pkg-config alone (no CMake) against an installed idem.
set -euo pipefail
prefix=$1 src=$2 out=$3
export PKG_CONFIG_PATH="$(dirname "$(find "$prefix" -name idem.pc | head -n 1)")"
# shellcheck disable=SC2046
c++ -std=c++20 "$src/main.cpp" -o "$out/consumer-pc" $(pkg-config --cflags --libs --static idem)
"$out/consumer-pc" "$out/consumer-pc.db"
