#pragma once

// How a test that needs a server (or a program a server test runs) behaves when it is
// missing: it skips, so that a developer without PostgreSQL or Redis can run the rest; under
// IDEM_REQUIRE_SERVERS=1 (scripts/test.sh, CI) it fails instead, so that a server the
// script should have started cannot pass as a row of skips.

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>

namespace idem::testing {

// Whether IDEM_REQUIRE_SERVERS=1.
inline bool servers_required() {
  const char* v = std::getenv("IDEM_REQUIRE_SERVERS");
  return v != nullptr && std::string(v) == "1";
}

// Skips the test when `present` is false, naming `what` is missing; fails it instead under
// IDEM_REQUIRE_SERVERS=1. For a TEST body or a fixture's SetUp (it returns from either).
#define IDEM_SKIP_OR_FAIL_UNLESS(present, what)            \
  do {                                                     \
    if (!(present)) {                                      \
      if (::idem::testing::servers_required()) {           \
        FAIL() << "IDEM_REQUIRE_SERVERS=1 but " << (what); \
      }                                                    \
      GTEST_SKIP() << (what);                              \
    }                                                      \
  } while (0)

// A global environment for an executable whose every test needs the server whose URL is in
// the environment variable `variable`: without it every test skips, or, under
// IDEM_REQUIRE_SERVERS=1, the executable exits 1 before any test runs. Not a FAIL(): after a
// fatal failure in a global SetUp GoogleTest prints every test as "[  SKIPPED ]", which
// ctest (gtest_discover_tests' SKIP_REGULAR_EXPRESSION) counts as skipped, not failed.
class ServerEnvironment : public ::testing::Environment {
 public:
  ServerEnvironment(std::string variable, std::string hint)
      : variable_(std::move(variable)), hint_(std::move(hint)) {}

  void SetUp() override {
    const char* value = std::getenv(variable_.c_str());
    if (value != nullptr && *value != '\0') return;
    if (servers_required()) {
      std::cerr << "IDEM_REQUIRE_SERVERS=1 but " << variable_ << " is not set (" << hint_ << ")\n";
      std::exit(1);
    }
    GTEST_SKIP() << variable_ << " is not set (" << hint_ << ")";
  }

 private:
  std::string variable_;
  std::string hint_;
};

}  // namespace idem::testing
