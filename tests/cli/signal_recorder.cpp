// A command for the tool's end-to-end tests that records every signal it receives, with its
// sender, so a test can tell a signal idem passed on from one that reached the command
// directly.
//
//   signal_recorder DIR [exit-on-signal]
//
// Blocks SIGINT, SIGTERM, SIGHUP and SIGQUIT and takes them with sigtimedwait, appending
// "SIGNAL SENDER_PID" lines to DIR/signals. Writes its pid to DIR/started (complete when it
// appears), then runs until DIR/go exists or DIR is gone (exit 0), or until the first
// signal with exit-on-signal (exit 0 as well).

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::filesystem::path dir = argv[1];
  const bool exit_on_signal = argc > 2 && std::string(argv[2]) == "exit-on-signal";
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&set, sig);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  {
    std::ofstream(dir / "started.tmp") << getpid() << "\n";
    std::filesystem::rename(dir / "started.tmp", dir / "started");
  }
  const timespec tick{0, 10'000'000};
  while (std::filesystem::exists(dir) && !std::filesystem::exists(dir / "go")) {
    siginfo_t info{};
    const int sig = sigtimedwait(&set, &info, &tick);
    if (sig <= 0) continue;
    std::ofstream(dir / "signals", std::ios::app) << sig << " " << info.si_pid << "\n";
    if (exit_on_signal) return 0;
  }
  return 0;
}
