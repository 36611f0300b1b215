#include "child.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>

#include "common.h"

extern char** environ;

namespace idem::cli {
namespace {

using SteadyClock = std::chrono::steady_clock;

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// ---- The guard -------------------------------------------------------------------------

// The guard's whole life, in a child forked from idem. idem may have other threads, so
// only async-signal-safe calls are made here.
[[noreturn]] void guard_main(int watch_fd, pid_t idem_pgrp) {
  ::setpgid(0, 0);
  // Ignore whatever may be sent to the group (a forwarded SIGTERM, the terminal's keys
  // once the group has the terminal), except faults and what cannot be caught.
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sigemptyset(&sa.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    switch (sig) {
      case SIGKILL:
      case SIGSTOP:
      case SIGSEGV:
      case SIGBUS:
      case SIGFPE:
      case SIGILL:
      case SIGABRT:
      case SIGSYS:
      case SIGTRAP:
        continue;
      case SIGCHLD:
      case SIGCONT:
      case SIGWINCH:
      case SIGURG:
        sa.sa_handler = SIG_DFL;
        break;
      default:
        sa.sa_handler = SIG_IGN;
    }
    ::sigaction(sig, &sa, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Keep only the watch pipe (as descriptor 3), so the guard holds nothing of idem's open:
  // not the command's output pipe, not idem's standard output, not the store.
  if (watch_fd != 3) {
    ::dup2(watch_fd, 3);
    ::close(watch_fd);
  }
  if (::close_range(4, ~0U, 0) != 0) {
    struct rlimit limit {};
    const rlim_t max_fd = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                              ? limit.rlim_cur
                              : 65536;
    for (rlim_t fd = 4; fd < max_fd; ++fd) ::close(static_cast<int>(fd));
  }
  const int null_fd = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd <= 2 && null_fd >= 0; ++fd) ::dup2(null_fd, fd);
  if (null_fd > 2) ::close(null_fd);
  (void)!::chdir("/");
  // Only idem holds the write end (close-on-exec): end of file means idem is gone.
  char byte = 0;
  for (;;) {
    const ssize_t n = ::read(3, &byte, 1);
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  // Give the terminal back to idem's group if the command's group had it, so a script
  // that ran idem can use the terminal again.
  const int tty = ::open("/dev/tty", O_RDWR | O_NOCTTY);
  if (tty >= 0) {
    if (::tcgetpgrp(tty) == ::getpgrp()) ::tcsetpgrp(tty, idem_pgrp);
    ::close(tty);
  }
  ::kill(0, SIGKILL);
  ::_exit(0);
}

// Whether a process of group `pgid` is still running (neither gone nor a zombie), by the
// process table in /proc. Without /proc, the SIGKILL already sent has to do.
bool group_has_live_members(pid_t pgid) {
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return false;
  bool live = false;
  std::string line;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] < '1' || entry->d_name[0] > '9') continue;
    std::ifstream stat(std::string("/proc/") + entry->d_name + "/stat");
    if (!std::getline(stat, line)) continue;
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    const std::size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    char state = 0;
    long ppid = 0;
    long pgrp = 0;
    if (!(rest >> state >> ppid >> pgrp)) continue;
    if (pgrp == pgid && state != 'Z' && state != 'X' && state != 'x') {
      live = true;
      break;
    }
  }
  ::closedir(dir);
  return live;
}

// Blocks SIGTTOU in this thread while it lives: tcsetpgrp from a background group would
// otherwise stop idem.
class TtouBlocked {
 public:
  TtouBlocked() {
    sigset_t ttou;
    sigemptyset(&ttou);
    sigaddset(&ttou, SIGTTOU);
    ::pthread_sigmask(SIG_BLOCK, &ttou, &old_);
  }
  ~TtouBlocked() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  TtouBlocked(const TtouBlocked&) = delete;
  TtouBlocked& operator=(const TtouBlocked&) = delete;

 private:
  sigset_t old_;
};

// The command's process group: the guard (its leader) and, once spawned, the command.
// Ending it (destructor or end()) SIGKILLs the group, waits until none of it runs, gives
// the terminal back if the group had it, and reaps the guard and the command.
class ProcessGroup {
 public:
  ProcessGroup() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      throw std::system_error(errno, std::generic_category(), "pipe for the guard process");
    }
    // The guard must not run idem's handlers before it has replaced them.
    sigset_t all;
    sigset_t old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    const pid_t idem_pgrp = ::getpgrp();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[1]);
      guard_main(fds[0], idem_pgrp);
    }
    const int error = errno;
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    ::close(fds[0]);
    if (pid < 0) {
      ::close(fds[1]);
      throw SpawnError("cannot start a process", error);
    }
    // Also from this side, so the group exists before the command is asked to join it.
    ::setpgid(pid, pid);
    guard_ = pid;
    watch_fd_ = fds[1];
  }
  ~ProcessGroup() { end(); }
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  pid_t id() const noexcept { return guard_; }
  void signal(int sig) const noexcept {
    if (guard_ > 0) ::kill(-guard_, sig);
  }
  // The command, once spawned; end() reaps it unless the caller did.
  void adopt(pid_t child) noexcept { child_ = child; }
  void reaped() noexcept { child_ = -1; }

  // Whether the guard is still alive (it stays unreaped, so the group id stays ours).
  bool guard_alive() const noexcept {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(guard_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      return false;
    }
    return info.si_pid == 0;
  }

  // Gives the terminal to the group when idem is in its terminal's foreground. Returns
  // whether the group has it now.
  bool give_terminal() {
    if (tty_fd_ < 0) tty_fd_ = ::open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (tty_fd_ < 0) return false;
    if (::tcgetpgrp(tty_fd_) == guard_) return true;
    if (::tcgetpgrp(tty_fd_) != ::getpgrp()) return false;
    TtouBlocked blocked;
    if (::tcsetpgrp(tty_fd_, guard_) != 0) return false;
    gave_terminal_ = true;
    return true;
  }

  void end() noexcept {
    if (guard_ <= 0) return;
    ::kill(-guard_, SIGKILL);
    // Processes in uninterruptible sleep die when it ends; do not wait forever for them.
    const auto give_up = SteadyClock::now() + std::chrono::seconds(5);
    auto pause = std::chrono::microseconds(200);
    while (group_has_live_members(guard_) && SteadyClock::now() < give_up) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20'000));
    }
    if (gave_terminal_ && ::tcgetpgrp(tty_fd_) == guard_) {
      TtouBlocked blocked;
      ::tcsetpgrp(tty_fd_, ::getpgrp());
    }
    close_fd(tty_fd_);
    int status = 0;
    if (child_ > 0) {
      while (::waitpid(child_, &status, 0) < 0 && errno == EINTR) {
      }
      child_ = -1;
    }
    while (::waitpid(guard_, &status, 0) < 0 && errno == EINTR) {
    }
    guard_ = -1;
    close_fd(watch_fd_);
  }

 private:
  pid_t guard_ = -1;
  pid_t child_ = -1;
  int watch_fd_ = -1;
  int tty_fd_ = -1;
  bool gave_terminal_ = false;
};

// ---- Starting the command --------------------------------------------------------------

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

// The file execvp would have run for `file`: itself when it holds a '/', else the first
// executable regular file of that name in $PATH.
std::string find_in_path(const std::string& file) {
  if (file.find('/') != std::string::npos) return file;
  const char* env_path = std::getenv("PATH");
  const std::string path = env_path != nullptr ? env_path : "/bin:/usr/bin";
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = path.find(':', start);
    std::string dir =
        path.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + file;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    if (end == std::string::npos) return {};
    start = end + 1;
  }
}

// Starts the command in group `pgid` with its standard output on `out_fd`.
pid_t spawn(const ChildOptions& options, pid_t pgid, int out_fd) {
  std::vector<std::string> argv_strings = options.argv;
  std::vector<std::string> env_strings = child_environment(options.env);
  std::vector<char*> argv = c_strings(argv_strings);
  std::vector<char*> envp = c_strings(env_strings);

  SpawnSetup setup;
  // dup2 clears close-on-exec on the new descriptor 1 only; every other descriptor of
  // ours is close-on-exec.
  posix_spawn_file_actions_adddup2(&setup.actions, out_fd, STDOUT_FILENO);
  posix_spawnattr_setpgroup(&setup.attr, pgid);
  // The command starts with idem's own signal mask as idem found it, and with what idem
  // found ignored still ignored (caught signals are reset by exec). SIGPIPE, which idem
  // ignores for itself, gets its default back unless it was ignored already.
  posix_spawnattr_setsigmask(&setup.attr, &signal_mask_at_start());
  sigset_t defaults;
  sigemptyset(&defaults);
  if (!ignored_at_start(SIGPIPE)) sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigdefault(&setup.attr, &defaults);
  posix_spawnattr_setflags(&setup.attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, argv[0], &setup.actions, &setup.attr, argv.data(), envp.data());
  if (rc == ENOEXEC) {
    // As execvp: a file without a #! line is a script for /bin/sh.
    const std::string file = find_in_path(options.argv[0]);
    if (!file.empty()) {
      std::vector<std::string> sh_strings = {"/bin/sh", file};
      sh_strings.insert(sh_strings.end(), options.argv.begin() + 1, options.argv.end());
      std::vector<char*> sh_argv = c_strings(sh_strings);
      rc = ::posix_spawn(&pid, "/bin/sh", &setup.actions, &setup.attr, sh_argv.data(), envp.data());
    }
  }
  if (rc != 0) throw SpawnError(fmt::format("cannot run '{}'", printable(options.argv[0])), rc);
  return pid;
}

}  // namespace

// ---- Errors ----------------------------------------------------------------------------

SpawnError::SpawnError(const std::string& what, int error)
    : std::runtime_error(fmt::format("{}: {}{}", what, std::strerror(error),
                                     error == EAGAIN || error == ENOMEM
                                         ? " (out of processes or memory; try again later)"
                                         : "")),
      error_(error) {}

int SpawnError::status() const noexcept {
  if (error_ == ENOENT) return 127;
  if (error_ == EAGAIN || error_ == ENOMEM) return kExitOsError;
  return 126;
}

// ---- Running the command ---------------------------------------------------------------

ChildOutcome run_child(const ChildOptions& options, SignalRelay& signals) {
  if (options.argv.empty()) throw SpawnError("cannot run the command: it is empty", ENOENT);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "pipe for the command's output");
  }
  int out_read = out[0];
  int out_write = out[1];
  struct PipeCloser {
    int& read_end;
    int& write_end;
    ~PipeCloser() {
      close_fd(read_end);
      close_fd(write_end);
    }
  } pipe_closer{out_read, out_write};
  ::fcntl(out_read, F_SETFL, ::fcntl(out_read, F_GETFL) | O_NONBLOCK);

  ProcessGroup group;
  const pid_t pid = spawn(options, group.id(), out_write);
  group.adopt(pid);
  close_fd(out_write);

  std::stop_callback wake(options.stop, [fd = signals.write_fd()] {
    unsigned char byte = kWakeByte;
    (void)!::write(fd, &byte, 1);
  });

  ChildOutcome outcome;
  int pass_fd = options.pass_through_fd;
  std::string chunk(64 * 1024, '\0');
  // Reads what the pipe holds now, up to `budget` bytes. Returns false at end of file, or
  // when passing the output on failed (then the pipe is to be closed, so the command sees
  // its output go away as it would have seen ours).
  auto read_output = [&](std::size_t budget) -> bool {
    while (budget > 0) {
      ssize_t n = ::read(out_read, chunk.data(), std::min(chunk.size(), budget));
      if (n == 0) return false;
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      std::string_view data(chunk.data(), static_cast<std::size_t>(n));
      budget -= data.size();
      outcome.output_bytes += data.size();
      if (outcome.output.size() < options.capture_limit) {
        outcome.output.append(data.substr(0, options.capture_limit - outcome.output.size()));
      }
      if (pass_fd >= 0 && !write_all(pass_fd, data)) {
        outcome.output_error = errno;
        return false;
      }
    }
    return true;
  };

  int wait_status = 0;
  bool reaped = false;
  bool killed = false;
  bool waiting_for_terminal = false;
  auto kill_at = SteadyClock::time_point::max();
  auto terminate = [&](StopReason why, SteadyClock::time_point kill_time) {
    outcome.stopped = why;
    group.signal(SIGTERM);
    // A stopped process acts on SIGTERM only once it runs again.
    group.signal(SIGCONT);
    kill_at = kill_time;
  };
  // The command stopped itself or was stopped (WUNTRACED).
  auto on_stopped = [&](int sig) {
    if (sig == SIGTTIN || sig == SIGTTOU) {
      // It wants the terminal: give it, as a shell gives its foreground job the terminal,
      // once idem is in the foreground itself.
      if (group.give_terminal()) {
        group.signal(SIGCONT);
      } else if (!waiting_for_terminal) {
        waiting_for_terminal = true;
        print_error("run",
                    "the command is waiting for the terminal; bring idem to the foreground "
                    "(fg) to let it read");
      }
    } else if (sig == SIGTSTP) {
      group.signal(SIGCONT);
      print_error("run", "not suspending the command: a stopped run could not keep its lease");
    }
  };

  while (!reaped) {
    const auto now = SteadyClock::now();
    if (outcome.stopped == StopReason::kNone && options.stop.stop_requested()) {
      terminate(StopReason::kLeaseLost, now + options.grace);
    }
    int timeout_ms = 250;
    auto wake_by = [&](SteadyClock::time_point t) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(t - now).count();
      timeout_ms = static_cast<int>(std::clamp<std::int64_t>(left, 0, timeout_ms));
    };
    if (options.dead_by) {
      const auto dead_by = options.dead_by();
      if (outcome.stopped == StopReason::kNone && now >= dead_by - options.deadline_grace) {
        terminate(StopReason::kLeaseRunningOut, dead_by);
      } else if (outcome.stopped == StopReason::kNone) {
        wake_by(dead_by - options.deadline_grace);
      }
      if (outcome.stopped != StopReason::kNone) kill_at = std::min(kill_at, dead_by);
    }
    if (outcome.stopped != StopReason::kNone && !killed) {
      if (now >= kill_at) {
        group.signal(SIGKILL);
        killed = true;
      } else {
        wake_by(kill_at);
      }
    }
    if (waiting_for_terminal) {
      wake_by(now + std::chrono::milliseconds(100));
      if (group.give_terminal()) {
        group.signal(SIGCONT);
        waiting_for_terminal = false;
      }
    }
    pollfd fds[2] = {{signals.read_fd(), POLLIN, 0}, {out_read, POLLIN, 0}};
    const int nfds = out_read >= 0 ? 2 : 1;
    const int ready = ::poll(fds, static_cast<nfds_t>(nfds), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      throw std::system_error(errno, std::generic_category(), "poll");
    }
    if (ready > 0 && nfds == 2 && fds[1].revents != 0) {
      if (!read_output(chunk.size() * 16)) close_fd(out_read);
    }
    if (ready > 0 && fds[0].revents != 0) {
      unsigned char bytes[64];
      ssize_t n = 0;
      while ((n = ::read(signals.read_fd(), bytes, sizeof bytes)) > 0) {
        for (ssize_t i = 0; i < n; ++i) {
          const int sig = bytes[i];
          if (sig == SIGTSTP) {
            print_error("run", "not suspending: a stopped run could not keep its lease");
          } else if (is_relayed(sig)) {
            // Once: the group is not idem's, so it did not get the signal itself.
            group.signal(sig);
          }
        }
      }
    }
    const pid_t r = ::waitpid(pid, &wait_status, WNOHANG | WUNTRACED);
    if (r == pid) {
      if (WIFSTOPPED(wait_status)) {
        on_stopped(WSTOPSIG(wait_status));
      } else {
        reaped = true;
        group.reaped();
      }
    } else if (!killed && !group.guard_alive()) {
      // The guard died (killed with the whole group, or by itself): idem could no longer
      // promise to stop the group if it died, so the group ends now.
      group.signal(SIGKILL);
      killed = true;
    }
  }
  // Nothing of the group may run on once the command has ended (nor write to the pipe).
  group.end();
  // Everything written before the group ended is in the pipe now. A process that left the
  // group on purpose (setsid) may still hold it open: take a bounded amount.
  if (out_read >= 0) (void)read_output(4 << 20);
  outcome.interrupted_by = signals.first();
  if (WIFEXITED(wait_status)) {
    outcome.exit_code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    outcome.term_signal = WTERMSIG(wait_status);
  }
  return outcome;
}

}  // namespace idem::cli
