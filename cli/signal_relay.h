#pragma once

// The signals of `idem run` (docs/cli.md, "What holds when idem ends"): which ones were
// ignored when idem started, and the relay that queues SIGINT, SIGTERM, SIGHUP and SIGQUIT
// while idem holds a lease, for run_child (child.h) to pass on to the command's group.

#include <signal.h>

namespace idem::cli {

// Records which signals were ignored when idem started, and its signal mask. main() calls it
// before changing any disposition; otherwise the first use records them.
void note_signals_at_start();
// Whether `sig` was ignored (SIG_IGN) when idem started.
bool ignored_at_start(int sig);

// Catches SIGINT, SIGTERM, SIGHUP, SIGQUIT (each unless ignored at start) and SIGCHLD for
// as long as it lives, and restores the previous handlers when destroyed. At most one
// exists at a time.
//
// Not holding (the default), the four terminating signals keep their default effect: idem
// ends at once. That is right while nothing is held that needs cleaning up (opening the
// store, waiting for another run), and keeps a waiting duplicate interruptible. While
// holding (from the moment idem asks for the key until it has finished with the record),
// they are queued instead: run_child passes them to the command's group, or the caller
// acts on them. SIGTSTP is refused while holding: a stopped idem could not keep its lease.
class SignalRelay {
 public:
  SignalRelay();
  ~SignalRelay();
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  // From now on, queue the terminating signals instead of ending the process, and (with
  // `refuse_suspend`) SIGTSTP instead of stopping it.
  void hold(bool refuse_suspend = true);
  // Back to their default effect. A signal queued since hold() ends idem now, as it would
  // have when it arrived: nothing is held any more.
  void let_go();
  // Back to their default effect, returning the first signal queued since hold() (0: none)
  // for the caller to act on.
  int stop_holding();
  // The first of SIGINT, SIGTERM, SIGHUP, SIGQUIT received since hold(), else 0.
  int first() const noexcept;

  // The read end of the queue: one byte per signal (kWakeByte below for the encoding).
  int read_fd() const noexcept { return read_fd_; }
  // The write end; the stop callback writes a wake-up byte into it.
  int write_fd() const noexcept { return write_fd_; }

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
};

// The queue's encoding: one byte per event. kWakeByte wakes the reader to look at its stop
// conditions; any other value is the number of the signal that arrived.
inline constexpr unsigned char kWakeByte = 0;

// Whether `sig` is one of the signals the relay passes on (SIGINT, SIGTERM, SIGHUP, SIGQUIT).
bool is_relayed(int sig);

// idem's signal mask when it started, for the command to start with.
const sigset_t& signal_mask_at_start();

}  // namespace idem::cli
