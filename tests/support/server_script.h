#pragma once

// Runs a test's private-server script (e.g. tests/stores/postgres/private_server.sh), for
// the tests that stop, restart or reconfigure a server of their own.

#include <gtest/gtest.h>
#include <stdio.h>

#include <string>
#include <vector>

namespace idem::testing {

// Runs `bash SCRIPT COMMAND DIR ARGS...` and returns its standard output without the
// trailing newlines; a failing script is a test failure. Arguments are quoted as given (no
// single quotes in them).
inline std::string run_server_script(const std::string& script, const std::string& command,
                                     const std::string& dir,
                                     const std::vector<std::string>& args = {}) {
  std::string line = "bash '" + script + "' " + command + " '" + dir + "'";
  for (const std::string& a : args) line += " '" + a + "'";
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
