#pragma once

// Runs a test's private-server script (e.g. tests/stores/postgres/private_server.sh), for
// the tests that stop, restart or reconfigure a server of their own.

#include <gtest/gtest.h>
#include <stdio.h>

#include <string>

namespace idem::testing {

// Runs `bash SCRIPT COMMAND DIR` and returns its standard output without the trailing
// newlines; a failing script is a test failure.
inline std::string run_server_script(const std::string& script, const std::string& command,
                                     const std::string& dir) {
  const std::string line = "bash '" + script + "' " + command + " '" + dir + "'";
  FILE* p = ::popen(line.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "cannot run " << line;
    return {};
  }
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = ::pclose(p);
  EXPECT_EQ(status, 0) << line << " failed";
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace idem::testing
