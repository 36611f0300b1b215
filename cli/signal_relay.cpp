#include "signal_relay.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <iterator>
#include <system_error>
#include <thread>

namespace idem::cli {
namespace {

// The signals idem passes on to the command's group.
constexpr int kRelayed[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

std::atomic<int> g_queue_fd{-1};
std::atomic<bool> g_holding{false};
std::atomic<int> g_first{0};
// Handlers running right now; hold() waits for them, so a handler that saw "not holding"
// ends the process before the caller goes on to ask for the key.
std::atomic<int> g_in_handler{0};

static_assert(std::atomic<int>::is_always_lock_free, "used from a signal handler");
static_assert(std::atomic<bool>::is_always_lock_free, "used from a signal handler");

void on_signal(int sig) {
  g_in_handler.fetch_add(1);
  const int saved_errno = errno;
  if (is_relayed(sig)) {
    if (!g_holding.load()) {
      // Not holding: the default effect (end the process). The signal is blocked while this
      // handler runs, so the raise lands when the handler returns.
      ::signal(sig, SIG_DFL);
      ::raise(sig);
      errno = saved_errno;
      g_in_handler.fetch_sub(1);
      return;
    }
    int none = 0;
    g_first.compare_exchange_strong(none, sig);
  }
  const auto byte = static_cast<unsigned char>(sig);
  const int fd = g_queue_fd.load();
  // A full queue drops the byte; the loop also polls waitpid, and g_first keeps the first.
  if (fd >= 0) (void)!::write(fd, &byte, 1);
  errno = saved_errno;
  g_in_handler.fetch_sub(1);
}

struct StartState {
  sigset_t ignored;
  sigset_t mask;
};

const StartState& start_state() {
  static const StartState state = [] {
    StartState s;
    sigemptyset(&s.ignored);
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction sa {};
      if (::sigaction(sig, nullptr, &sa) == 0 && (sa.sa_flags & SA_SIGINFO) == 0 &&
          sa.sa_handler == SIG_IGN) {
        sigaddset(&s.ignored, sig);
      }
    }
    ::pthread_sigmask(SIG_BLOCK, nullptr, &s.mask);
    return s;
  }();
  return state;
}

struct sigaction g_previous[std::size(kRelayed)];
bool g_installed[std::size(kRelayed)] = {};
struct sigaction g_previous_chld;
struct sigaction g_previous_tstp;
bool g_tstp_installed = false;

void install(int sig, struct sigaction* previous) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  // SA_RESTART keeps other threads' blocking calls (the heartbeat's store I/O) going.
  sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
  ::sigaction(sig, &sa, previous);
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

bool is_relayed(int sig) {
  return std::find(std::begin(kRelayed), std::end(kRelayed), sig) != std::end(kRelayed);
}

const sigset_t& signal_mask_at_start() { return start_state().mask; }

void note_signals_at_start() { (void)start_state(); }

bool ignored_at_start(int sig) { return sigismember(&start_state().ignored, sig) == 1; }

SignalRelay::SignalRelay() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::system_error(errno, std::generic_category(), "pipe for signals");
  }
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  g_holding.store(false);
  g_first.store(0);
  g_queue_fd.store(write_fd_);
  for (std::size_t i = 0; i < std::size(kRelayed); ++i) {
    // A signal ignored when idem started stays ignored, as a shell leaves it (`nohup`).
    g_installed[i] = !ignored_at_start(kRelayed[i]);
    if (g_installed[i]) install(kRelayed[i], &g_previous[i]);
  }
  install(SIGCHLD, &g_previous_chld);
}

SignalRelay::~SignalRelay() {
  (void)stop_holding();
  for (std::size_t i = 0; i < std::size(kRelayed); ++i) {
    if (g_installed[i]) ::sigaction(kRelayed[i], &g_previous[i], nullptr);
  }
  ::sigaction(SIGCHLD, &g_previous_chld, nullptr);
  g_queue_fd.store(-1);
  close_fd(read_fd_);
  close_fd(write_fd_);
}

void SignalRelay::hold(bool refuse_suspend) {
  g_first.store(0);
  g_holding.store(true);
  // A handler that saw "not holding" is ending the process; let it.
  while (g_in_handler.load() != 0) std::this_thread::yield();
  if (refuse_suspend && !g_tstp_installed && !ignored_at_start(SIGTSTP)) {
    install(SIGTSTP, &g_previous_tstp);
    g_tstp_installed = true;
  }
}

int SignalRelay::stop_holding() {
  g_holding.store(false);
  if (g_tstp_installed) {
    ::sigaction(SIGTSTP, &g_previous_tstp, nullptr);
    g_tstp_installed = false;
  }
  return g_first.exchange(0);
}

void SignalRelay::let_go() {
  const int sig = stop_holding();
  if (sig == 0) return;
  ::signal(sig, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(sig);
}

int SignalRelay::first() const noexcept { return g_first.load(); }

}  // namespace idem::cli
