#include "child.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "common.h"

extern char** environ;

namespace idem::cli {
namespace {

// The signals idem passes on to its child, and the child-exit notification.
constexpr int kCaught[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

// The queue's encoding: one byte per event. 0 wakes the loop to look at the stop token;
// otherwise the low 7 bits are the signal number and bit 7 says the kernel sent it (a
// terminal's Ctrl-C, which already reached the child: it is in our process group).
constexpr unsigned char kWakeByte = 0;
constexpr unsigned char kFromKernelBit = 0x80;

std::atomic<int> g_queue_fd{-1};
std::atomic<bool> g_forward{false};
struct sigaction g_previous[std::size(kCaught)];

static_assert(std::atomic<int>::is_always_lock_free, "used from a signal handler");
static_assert(std::atomic<bool>::is_always_lock_free, "used from a signal handler");

void on_signal(int sig, siginfo_t* info, void*) {
  int saved_errno = errno;
  if (sig != SIGCHLD && !g_forward.load()) {
    // Not forwarding yet: give the signal its default effect (end the process). The signal
    // is blocked while this handler runs, so the raise lands when the handler returns.
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    errno = saved_errno;
    return;
  }
  auto byte = static_cast<unsigned char>(sig);
  if (info != nullptr && info->si_code == SI_KERNEL) byte |= kFromKernelBit;
  int fd = g_queue_fd.load();
  // A full queue drops the byte; the loop also polls waitpid, so no exit is missed.
  if (fd >= 0) (void)!::write(fd, &byte, 1);
  errno = saved_errno;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// The child's environment: ours without the variables we set, then ours.
std::vector<std::string> child_environment(
    const std::vector<std::pair<std::string, std::string>>& extra) {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    std::string_view name = entry.substr(0, entry.find('='));
    bool replaced =
        std::any_of(extra.begin(), extra.end(), [&](const auto& kv) { return kv.first == name; });
    if (!replaced) out.emplace_back(entry);
  }
  for (const auto& [name, value] : extra) out.push_back(name + "=" + value);
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Owns the posix_spawn attribute and file-action objects.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
};

}  // namespace

SignalGuard::SignalGuard() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::system_error(errno, std::generic_category(), "pipe for signals");
  }
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  g_forward.store(false);
  g_queue_fd.store(write_fd_);
  struct sigaction sa {};
  sa.sa_sigaction = on_signal;
  sigemptyset(&sa.sa_mask);
  for (std::size_t i = 0; i < std::size(kCaught); ++i) {
    // SA_RESTART keeps other threads' blocking calls (the heartbeat's store I/O) going.
    sa.sa_flags = SA_SIGINFO | SA_RESTART | (kCaught[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    ::sigaction(kCaught[i], &sa, &g_previous[i]);
  }
}

SignalGuard::~SignalGuard() {
  for (std::size_t i = 0; i < std::size(kCaught); ++i) {
    ::sigaction(kCaught[i], &g_previous[i], nullptr);
  }
  g_queue_fd.store(-1);
  g_forward.store(false);
  close_fd(read_fd_);
  close_fd(write_fd_);
}

void SignalGuard::forward() { g_forward.store(true); }

SpawnError::SpawnError(const std::string& command, int error)
    : std::runtime_error(fmt::format("cannot run '{}': {}", command, std::strerror(error))),
      error_(error) {}

int SpawnError::status() const noexcept { return error_ == ENOENT ? 127 : 126; }

ChildOutcome run_child(const ChildOptions& options, SignalGuard& signals) {
  if (options.argv.empty()) throw SpawnError("", ENOENT);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "pipe for the command's output");
  }
  int out_read = out[0];
  int out_write = out[1];
  ::fcntl(out_read, F_SETFL, ::fcntl(out_read, F_GETFL) | O_NONBLOCK);

  std::vector<std::string> argv_strings = options.argv;
  std::vector<std::string> env_strings = child_environment(options.env);
  std::vector<char*> argv = c_strings(argv_strings);
  std::vector<char*> envp = c_strings(env_strings);

  pid_t pid = -1;
  {
    SpawnSetup setup;
    // dup2 clears close-on-exec on the new descriptor 1 only; every other descriptor of
    // ours is close-on-exec.
    posix_spawn_file_actions_adddup2(&setup.actions, out_write, STDOUT_FILENO);
    // The child starts with no signal blocked and default handling of the signals idem
    // catches or ignores (SIGPIPE is ignored by idem, and an ignored signal survives exec).
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&setup.attr, &none);
    sigset_t defaults;
    sigemptyset(&defaults);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE, SIGQUIT}) {
      sigaddset(&defaults, sig);
    }
    posix_spawnattr_setsigdefault(&setup.attr, &defaults);
    posix_spawnattr_setflags(&setup.attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    int rc = ::posix_spawnp(&pid, argv[0], &setup.actions, &setup.attr, argv.data(), envp.data());
    close_fd(out_write);
    if (rc != 0) {
      close_fd(out_read);
      throw SpawnError(options.argv[0], rc);
    }
  }

  std::stop_callback wake(options.stop, [fd = signals.write_fd()] {
    unsigned char byte = kWakeByte;
    (void)!::write(fd, &byte, 1);
  });

  ChildOutcome outcome;
  int pass_fd = options.pass_through_fd;
  std::string chunk(64 * 1024, '\0');
  // Reads what the pipe holds now. Returns false at end of file.
  auto read_output = [&]() -> bool {
    for (;;) {
      ssize_t n = ::read(out_read, chunk.data(), chunk.size());
      if (n == 0) return false;
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      std::string_view data(chunk.data(), static_cast<std::size_t>(n));
      outcome.output_bytes += data.size();
      if (outcome.output.size() < options.capture_limit) {
        outcome.output.append(data.substr(0, options.capture_limit - outcome.output.size()));
      }
      // A reader that went away (EPIPE) stops the pass-through, not the capture.
      if (pass_fd >= 0 && !write_all(pass_fd, data)) pass_fd = -1;
    }
  };

  int wait_status = 0;
  bool reaped = false;
  bool terminating = false;
  bool killed = false;
  auto kill_at = std::chrono::steady_clock::time_point::max();
  while (!reaped) {
    if (options.stop.stop_requested() && !terminating) {
      ::kill(pid, SIGTERM);
      terminating = true;
      outcome.stopped = true;
      kill_at = std::chrono::steady_clock::now() + options.grace;
    }
    // Poll at least every 250 ms as a safety net for a lost child-exit byte.
    int timeout_ms = 250;
    if (terminating && !killed) {
      auto left =
          std::chrono::ceil<std::chrono::milliseconds>(kill_at - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        ::kill(pid, SIGKILL);
        killed = true;
      } else {
        timeout_ms = static_cast<int>(std::min<std::int64_t>(left.count(), timeout_ms));
      }
    }
    pollfd fds[2] = {{signals.read_fd(), POLLIN, 0}, {out_read, POLLIN, 0}};
    int nfds = out_read >= 0 ? 2 : 1;
    int ready = ::poll(fds, static_cast<nfds_t>(nfds), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      throw std::system_error(errno, std::generic_category(), "poll");
    }
    if (ready > 0 && nfds == 2 && fds[1].revents != 0) {
      if (!read_output()) close_fd(out_read);
    }
    if (ready > 0 && fds[0].revents != 0) {
      unsigned char bytes[64];
      ssize_t n = 0;
      while ((n = ::read(signals.read_fd(), bytes, sizeof bytes)) > 0) {
        for (ssize_t i = 0; i < n; ++i) {
          int sig = bytes[i] & ~kFromKernelBit;
          if (bytes[i] == kWakeByte || sig == SIGCHLD) continue;
          if (outcome.interrupted_by == 0) outcome.interrupted_by = sig;
          // A terminal's signal already reached the child through the process group.
          if ((bytes[i] & kFromKernelBit) == 0) ::kill(pid, sig);
        }
      }
    }
    pid_t r = ::waitpid(pid, &wait_status, WNOHANG);
    if (r == pid) reaped = true;
  }
  // Everything the child wrote before it exited is in the pipe now; take it, and leave
  // whatever processes it left behind write after it to a closed pipe.
  if (out_read >= 0) {
    (void)read_output();
    close_fd(out_read);
  }
  if (WIFEXITED(wait_status)) {
    outcome.exit_code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    outcome.term_signal = WTERMSIG(wait_status);
  }
  return outcome;
}

}  // namespace idem::cli
