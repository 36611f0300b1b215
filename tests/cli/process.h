#pragma once

// Runs the built `idem` binary the way a user's shell would, with its standard output and
// standard error captured, for the end-to-end tests of the tool.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "support/eventually.h"

namespace idem::cli::test {

struct ProcessResult {
  // The exit code, or 128 + the signal that ended the process (a shell's $?).
  int status = -1;
  std::string out;
  std::string err;
};

// Environment changes for a process: a value sets the variable, nullopt removes it.
using EnvChanges = std::map<std::string, std::optional<std::string>>;

// How a process is started, beyond its arguments and environment.
struct ProcessOptions {
  // Start it as the leader of a process group of its own (as a shell with job control
  // starts a job), so the test can signal that group.
  bool own_group = false;
};

// A process started in the background; its output is collected when it is finished.
class Process {
 public:
  Process(const std::vector<std::string>& argv, const EnvChanges& env, ProcessOptions options = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void kill(int sig) const;
  // Reads the output until the process ends and returns everything. If it has not ended
  // within `bound` it is killed with SIGKILL and the status reports that (a test then
  // fails on the status rather than hanging).
  ProcessResult finish(std::chrono::seconds bound = std::chrono::seconds(60));
  // Whether the process has ended (reaps it when it has).
  bool exited();

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::optional<int> wait_status_;
};

// Runs the process to its end (bounded as Process::finish).
ProcessResult run_process(const std::vector<std::string>& argv, const EnvChanges& env,
                          std::chrono::seconds bound = std::chrono::seconds(60));

// Whether process `pid` exists and is not a zombie (by /proc/PID/stat), whoever its
// parent is.
bool running(pid_t pid);

using idem::testing::eventually;

}  // namespace idem::cli::test
