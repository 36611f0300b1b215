#pragma once

// Runs the command of `idem run` as a child process: its standard output comes through a
// pipe, is written through to ours as it arrives and captured; its standard error and
// standard input are inherited. SIGINT, SIGTERM and SIGHUP sent to idem are passed on to
// the child, and a stop request (the lease was lost) terminates it: SIGTERM, then SIGKILL
// after a grace period.

#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "idem/types.h"

namespace idem::cli {

// Catches SIGINT, SIGTERM, SIGHUP and SIGCHLD for as long as it lives, and restores the
// previous handlers when destroyed. At most one exists at a time.
//
// Until forward() is called, SIGINT, SIGTERM and SIGHUP keep their default effect (idem
// ends at once): nothing is held then that needs cleaning up, and a waiting duplicate must
// stay interruptible. From forward() on they are queued for run_child, which passes them
// to the child; a signal arriving after the child ended is recorded and otherwise ignored.
class SignalGuard {
 public:
  SignalGuard();
  ~SignalGuard();
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

  // From now on, queue SIGINT, SIGTERM and SIGHUP instead of ending the process.
  void forward();
  // The read end of the queue: one byte per signal (see child.cpp for the encoding).
  int read_fd() const noexcept { return read_fd_; }
  // The write end; the stop callback writes a wake-up byte into it.
  int write_fd() const noexcept { return write_fd_; }

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
};

struct ChildOptions {
  // The command and its arguments; argv[0] is looked up in PATH.
  std::vector<std::string> argv;
  // Environment variables to set for the child, on top of (and replacing) ours.
  std::vector<std::pair<std::string, std::string>> env;
  // Where the child's output is written through as it arrives; -1: nowhere.
  int pass_through_fd = 1;
  // Capture at most this many bytes of output; output beyond it is still counted (and
  // passed through) so the caller can report the full size without holding it in memory.
  std::size_t capture_limit = 0;
  // How long the child has between SIGTERM and SIGKILL after a stop request.
  Duration grace = std::chrono::seconds(10);
  // Requested when the child must be stopped (the lease was lost).
  std::stop_token stop;
};

struct ChildOutcome {
  // The child's exit code when it exited, else -1.
  int exit_code = -1;
  // The signal that killed the child, else 0.
  int term_signal = 0;
  // The captured output (at most capture_limit bytes).
  std::string output;
  // How many bytes the child wrote to its standard output in all.
  std::size_t output_bytes = 0;
  // The first of SIGINT/SIGTERM/SIGHUP that idem received while the child ran, else 0.
  int interrupted_by = 0;
  // True when the child was terminated because of a stop request.
  bool stopped = false;

  // The status a shell reports: the exit code, or 128 + the signal number.
  int status() const noexcept { return term_signal != 0 ? 128 + term_signal : exit_code; }
};

// The command could not be started (not found, not executable). `status()` is what a shell
// reports then: 127 for a command that does not exist, 126 otherwise.
class SpawnError : public std::runtime_error {
 public:
  SpawnError(const std::string& command, int error);
  int error() const noexcept { return error_; }
  int status() const noexcept;

 private:
  int error_;
};

// Starts the command and runs it to its end. REQUIRES: `signals` is alive (it carries the
// child-exit notifications and idem's own signals). Throws SpawnError when the command
// cannot be started and std::system_error when a pipe cannot be made.
ChildOutcome run_child(const ChildOptions& options, SignalGuard& signals);

}  // namespace idem::cli
