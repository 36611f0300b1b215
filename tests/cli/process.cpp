#include "process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string_view>

extern char** environ;

namespace idem::cli::test {
namespace {

int decode_status(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

std::vector<std::string> environment(const EnvChanges& changes) {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    std::string name(entry.substr(0, entry.find('=')));
    if (changes.count(name) == 0) out.emplace_back(entry);
  }
  for (const auto& [name, value] : changes) {
    if (value) out.push_back(name + "=" + *value);
  }
  return out;
}

}  // namespace

Process::Process(const std::vector<std::string>& argv, const EnvChanges& env,
                 ProcessOptions options) {
  int out[2];
  int err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  std::vector<std::string> args = argv;
  std::vector<std::string> envs = environment(env);
  std::vector<char*> c_args;
  for (auto& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  std::vector<char*> c_env;
  for (auto& e : envs) c_env.push_back(e.data());
  c_env.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  // The test process may run with signals blocked or ignored (ctest, gtest death tests);
  // the tool must start as a shell would start it.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (options.own_group) {
    posix_spawnattr_setpgroup(&attr, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  posix_spawnattr_setflags(&attr, flags);
  int rc = ::posix_spawn(&pid_, c_args[0], &actions, &attr, c_args.data(), c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  ::close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
  if (rc != 0) {
    ::close(out_fd_);
    ::close(err_fd_);
    throw std::runtime_error(std::string("posix_spawn ") + argv[0] + ": " + std::strerror(rc));
  }
}

Process::~Process() {
  if (!wait_status_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (err_fd_ >= 0) ::close(err_fd_);
}

void Process::kill(int sig) const { ::kill(pid_, sig); }

bool Process::exited() {
  if (wait_status_) return true;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) wait_status_ = status;
  return wait_status_.has_value();
}

ProcessResult Process::finish(std::chrono::seconds bound) {
  ProcessResult result;
  auto deadline = std::chrono::steady_clock::now() + bound;
  bool killed = false;
  char buffer[65536];
  // Reads what a pipe holds now; closes it at end of file.
  auto drain = [&](int& fd, std::string& into) {
    while (fd >= 0) {
      ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n > 0) {
        into.append(buffer, static_cast<std::size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
          ::close(fd);
          fd = -1;
        }
        return;
      }
    }
  };
  for (int fd : {out_fd_, err_fd_}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  // Read both pipes while the process runs, so a chatty process never blocks. Once it has
  // exited, everything it wrote is in the pipes: take that and stop, even if processes it
  // left behind still hold the pipes open.
  while (out_fd_ >= 0 || err_fd_ >= 0) {
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    int ready = ::poll(fds, 2, 20);
    if (ready < 0 && errno != EINTR) break;
    drain(out_fd_, result.out);
    drain(err_fd_, result.err);
    if (exited()) {
      drain(out_fd_, result.out);
      drain(err_fd_, result.err);
      break;
    }
    if (!killed && std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      killed = true;
    }
  }
  if (!wait_status_) {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    wait_status_ = status;
  }
  result.status = decode_status(*wait_status_);
  if (killed) result.err += "\n[test harness: killed after the time bound]\n";
  return result;
}

ProcessResult run_process(const std::vector<std::string>& argv, const EnvChanges& env,
                          std::chrono::seconds bound) {
  Process p(argv, env);
  return p.finish(bound);
}

bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const std::size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  const char state = line[close + 2];
  return state != 'Z' && state != 'X' && state != 'x';
}

}  // namespace idem::cli::test
