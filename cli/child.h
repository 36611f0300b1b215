#pragma once

// Runs the command of `idem run` as a child process in a process group of its own, so that
// nothing it starts outlives idem (docs/cli.md, "What holds when idem ends"):
//
//  - The group's leader is a small guard process forked from idem. It ignores every signal
//    the group may be sent and waits for idem to go away (a pipe only idem can write to
//    reaching end of file). However idem ends, SIGKILL included, the guard then SIGKILLs
//    the group. Being the leader, it also keeps the group's id from being reused while
//    idem may still signal it.
//  - The command joins that group. Its standard output comes through a pipe, is written
//    through to ours as it arrives and captured; its standard error and standard input are
//    inherited.
//  - SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to idem are passed on to the whole group,
//    once. A stop request (the lease was lost) or a lease about to run out terminates the
//    group: SIGTERM, then SIGKILL.
//  - When the command ends, whatever is left of its group is SIGKILLed, and run_child
//    returns only once no process of the group is left running.
//
// Signals idem found ignored when it started (`nohup`, a background job of a
// non-interactive shell) stay ignored, for idem and for the command, as a shell does.

#include <signal.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "idem/types.h"
#include "signal_relay.h"

namespace idem::cli {

// Why run_child terminated the command.
enum class StopReason {
  kNone,
  // The stop token was raised: the lease was lost (fenced, forgotten, or the heartbeat
  // gave up).
  kLeaseLost,
  // The lease was about to run out without being extended (`dead_by` came near).
  kLeaseRunningOut,
};

struct ChildOptions {
  // The command and its arguments; argv[0] is looked up in PATH as execvp does (a file
  // without a #! line is run by /bin/sh).
  std::vector<std::string> argv;
  // Environment variables to set for the child, on top of (and replacing) ours.
  std::vector<std::pair<std::string, std::string>> env;
  // Where the child's output is written through as it arrives; -1: nowhere. When a write
  // there fails, the pipe from the child is closed (its next write fails as it would
  // have on that output: EPIPE and SIGPIPE) and ChildOutcome::output_error says why.
  int pass_through_fd = 1;
  // Capture at most this many bytes of output; output beyond it is still counted (and
  // passed through) so the caller can report the full size without holding it in memory.
  std::size_t capture_limit = 0;
  // How long the group has between SIGTERM and SIGKILL after a stop request.
  Duration grace = std::chrono::seconds(10);
  // Requested when the command must be stopped (the lease was lost).
  std::stop_token stop;
  // When set: the time by which no process of the group may run any more (the lease
  // deadline less a margin, as last confirmed by the store). The group is sent SIGTERM
  // `deadline_grace` before it and SIGKILL at it. Polled, so it may move later.
  std::function<std::chrono::steady_clock::time_point()> dead_by;
  Duration deadline_grace = std::chrono::seconds(10);
};

struct ChildOutcome {
  // The child's exit code when it exited, else -1.
  int exit_code = -1;
  // The signal that killed the child, else 0.
  int term_signal = 0;
  // The captured output (at most capture_limit bytes).
  std::string output;
  // How many bytes the child wrote to its standard output in all (that idem read).
  std::size_t output_bytes = 0;
  // The first of SIGINT/SIGTERM/SIGHUP/SIGQUIT that idem received while holding, else 0.
  int interrupted_by = 0;
  // Why the group was terminated, if it was.
  StopReason stopped = StopReason::kNone;
  // errno of the first failed write to pass_through_fd, else 0.
  int output_error = 0;

  // The status a shell reports: the exit code, or 128 + the signal number.
  int status() const noexcept { return term_signal != 0 ? 128 + term_signal : exit_code; }
};

// The command, or the guard, could not be started. `status()` is what to exit with: 127
// for a command that does not exist, 71 (EX_OSERR) when the system is out of processes or
// memory (retry later), 126 otherwise (as a shell: not executable).
class SpawnError : public std::runtime_error {
 public:
  SpawnError(const std::string& what, int error);
  int error() const noexcept { return error_; }
  int status() const noexcept;

 private:
  int error_;
};

// Starts the guard and the command, and runs the command to its end. REQUIRES: `signals`
// is alive (it carries the child-exit notifications and idem's own signals). Throws
// SpawnError when a process cannot be started and std::system_error when a pipe cannot be
// made. Whatever it returns or throws, no process of the group is left running.
ChildOutcome run_child(const ChildOptions& options, SignalRelay& signals);

}  // namespace idem::cli
