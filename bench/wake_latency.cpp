// SPEC §7: how soon a duplicate waiting in another process returns after the owner's
// complete returns, with the waiters polling alone (the store URL with notify=off) and with
// the store's notifications (notify=on; on SQLite the same-machine signal,
// stores/sqlite/sqlite_wake.h, on PostgreSQL LISTEN/NOTIFY, stores/postgres/
// postgres_listener.h). docs/benchmarks.md quotes it.
//
//   wake_latency STORE_URL [SAMPLES] [HOLD_MS]
//
// Any store whose URL takes `notify=on|off`. The keys are fresh per run (scope "wake" and a
// random prefix), so runs against a shared server do not meet.
//
// Per sample: the owner (this process) takes a fresh key, a waiter process starts
// idem::Executor::run on it under the default waiting policy (10 ms growing to 1 s), the
// owner holds the key HOLD_MS more and completes; the latency is from the complete's return
// to the waiter's run() returning, both read on CLOCK_MONOTONIC. The two modes take turns,
// sample by sample, so load on the machine falls on both alike.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "idem/executor.h"
#include "idem/open_store.h"
#include "percentile.h"

namespace {

using namespace std::chrono_literals;

long long monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool read_all(int fd, void* data, std::size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

bool write_all(int fd, const void* data, std::size_t n) {
  return ::write(fd, data, n) == static_cast<ssize_t>(n);
}

// The waiter: for each sample index read from `in`, waits on key k<index> and writes the
// instant its run() returned to `out`.
std::string with_notify(const std::string& url, bool notify) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") +
         (notify ? "notify=on" : "notify=off");
}

std::string key_of(const std::string& prefix, bool notify, int index) {
  return prefix + (notify ? "signal-" : "poll-") + std::to_string(index);
}

[[noreturn]] void waiter(const std::string& url, const std::string& prefix, bool notify, int in,
                         int out) {
  idem::Executor exec(idem::open_store(with_notify(url, notify)),
                      idem::ExecutorOptions{.wait = idem::WaitPolicy{.max_wait = 30s}});
  int index = 0;
  while (read_all(in, &index, sizeof index)) {
    const std::string key = key_of(prefix, notify, index);
    (void)exec.run("wake", key, [](const idem::Attempt&) { return std::string("waiter"); });
    const long long t = monotonic_ns();
    if (!write_all(out, &t, sizeof t)) break;
  }
  std::_Exit(0);
}

struct Mode {
  bool notify;
  std::vector<double> ms;
  pid_t pid = -1;
  int to = -1, from = -1;
};

void start(Mode& m, const std::string& url, const std::string& prefix) {
  int down[2], up[2];
  if (::pipe(down) != 0 || ::pipe(up) != 0) std::exit(1);
  m.pid = ::fork();
  if (m.pid == 0) {
    ::close(down[1]);
    ::close(up[0]);
    waiter(url, prefix, m.notify, down[0], up[1]);
  }
  ::close(down[0]);
  ::close(up[1]);
  m.to = down[1];
  m.from = up[0];
}

using idem::bench::percentile;

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: wake_latency STORE_URL [SAMPLES] [HOLD_MS]\n");
    return 2;
  }
  const std::string url = argv[1];
  const int samples = argc > 2 ? std::atoi(argv[2]) : 200;
  const int hold_ms = argc > 3 ? std::atoi(argv[3]) : 30;
  const std::string prefix = std::to_string(std::random_device{}()) + "-";
  Mode modes[2] = {Mode{.notify = false, .ms = {}}, Mode{.notify = true, .ms = {}}};
  // Fork before this process starts any thread of its own.
  for (Mode& m : modes) start(m, url, prefix);
  // The owner sends notifications in both modes (a store where they are off by default,
  // PostgreSQL, sends none otherwise); only the waiters differ.
  const std::shared_ptr<idem::Store> owner = idem::open_store(with_notify(url, true));
  idem::Store& store = *owner;
  for (int i = 0; i < samples; ++i) {
    for (Mode& m : modes) {
      const std::string key = key_of(prefix, m.notify, i);
      auto r = store.acquire("wake", key, 30s, 1h);
      const idem::Token token = std::get<idem::Acquired>(r).lease.token;
      if (!write_all(m.to, &i, sizeof i)) return 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
      if (store.complete("wake", key, token, "owner", 1h) != idem::WriteResult::kDone) return 1;
      const long long done = monotonic_ns();
      long long returned = 0;
      if (!read_all(m.from, &returned, sizeof returned)) return 1;
      m.ms.push_back(static_cast<double>(returned - done) / 1e6);
    }
  }
  // Every pipe end first: the second waiter inherited the first one's.
  for (Mode& m : modes) ::close(m.to);
  for (Mode& m : modes) {
    ::waitpid(m.pid, nullptr, 0);
    std::printf("%-22s samples=%zu p50=%.2f ms p99=%.2f ms max=%.2f ms\n",
                m.notify ? "signal (notify on)" : "polling (notify off)", m.ms.size(),
                percentile(m.ms, 0.5), percentile(m.ms, 0.99), percentile(m.ms, 1.0));
  }
  for (Mode& m : modes) {
    for (int i = 0; i < samples; ++i) (void)store.forget("wake", key_of(prefix, m.notify, i));
  }
  return 0;
}
