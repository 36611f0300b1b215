#!/usr/bin/env bash
# Builds the consumer with pkg-config alone (no CMake) against an installed idem.
set -euo pipefail
prefix=$1 src=$2 out=$3
export PKG_CONFIG_PATH="$(dirname "$(find "$prefix" -name idem.pc | head -n 1)")"
# The plain form, as most consumers write it (no --static), must link: the libraries are
# static, so their dependencies must be in what plain --libs prints.
# shellcheck disable=SC2046
c++ -std=c++20 "$src/main.cpp" -o "$out/consumer-pc" $(pkg-config --cflags --libs idem)
"$out/consumer-pc" "$out/consumer-pc.db"
# And the --static form too.
# shellcheck disable=SC2046
c++ -std=c++20 "$src/main.cpp" -o "$out/consumer-pc-static" $(pkg-config --cflags --libs --static idem)
"$out/consumer-pc-static" "$out/consumer-pc-static.db"
# The testing kit: the conformance suite and FaultStore through idem-testing alone.
# shellcheck disable=SC2046
c++ -std=c++20 "$src/testing/consumer_test.cpp" -o "$out/consumer-testing-pc" \
  $(pkg-config --cflags --libs idem-testing)
"$out/consumer-testing-pc" --gtest_brief=1
