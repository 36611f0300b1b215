// A crash-soak worker (docs/RELIABILITY.md, "Crash soak"), driven by soak_test.cpp through
// support/worker_process.h. It runs a mixed workload through idem::Executor over a small key
// space until a line "stop" (or the end) arrives on standard input, then exits 0; the test
// kills, pauses and resumes it at random meanwhile. Every event is appended to LOG_FILE
// before the call that produced it returns (soak_log.h gives the format).
//
//   idem_soak_worker URL LOG_FILE SEED EXPIRING_TTL_MS DURABLE_TTL_MS
//
// The workload, per thread (kThreads of them, so duplicates also meet inside the process):
//  - keys "d<G>-<i>" (a new generation G every kGenerationMs, kDurableKeys per generation,
//    the durable TTL) and "e<i>" (kExpiringKeys, the short TTL: they expire and run again);
//  - actions that take a few milliseconds (so a kill often lands while one runs), that run
//    past their lease (the heartbeat must keep it), or that throw (the record is released);
//    payloads from a few bytes to 200 KiB;
//  - duplicates that fail at once or wait; run() or begin() + complete();
//  - now and then a purge; a pause of up to kPauseMs between calls, so that replays do not
//    spin.

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.h"
#include "idem/executor.h"
#include "idem/open_store.h"
#include "soak/soak_log.h"

namespace {

using namespace std::chrono_literals;
using idem::soak::digest;
using idem::soak::wall_ms;

constexpr std::string_view kScope = "soak";
constexpr int kThreads = 2;
constexpr int kDurableKeys = 4;
constexpr int kExpiringKeys = 4;
constexpr std::int64_t kGenerationMs = 500;
constexpr int kPauseMs = 10;
constexpr auto kLease = 400ms;

std::atomic<bool> stopping{false};

// The action's deliberate failure: run() releases the record and rethrows it.
struct Deliberate : std::exception {};

class Log {
 public:
  explicit Log(const std::string& path)
      : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
    if (fd_ < 0) fail(path);
  }
  ~Log() { ::close(fd_); }
  Log(const Log&) = delete;
  Log& operator=(const Log&) = delete;

  // One write per line, so lines from both threads never interleave and a kill leaves at
  // most the line being written cut short.
  void line(std::string text) {
    text += '\n';
    if (::write(fd_, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
      fail("write");
    }
  }

 private:
  [[noreturn]] static void fail(const std::string& what) {
    std::cerr << "soak worker: " << what << ": " << std::strerror(errno) << "\n";
    std::_Exit(3);
  }
  int fd_;
};

std::string ms_or_dash(const std::optional<idem::Timestamp>& t) {
  return t ? std::to_string(t->time_since_epoch().count()) : std::string("-");
}

void work(idem::Executor& exec, Log& log, std::uint64_t seed, std::int64_t expiring_ttl,
          std::int64_t durable_ttl) {
  std::mt19937_64 rng(seed);
  auto pct = [&] { return static_cast<int>(rng() % 100); };
  for (std::uint64_t n = 0; !stopping.load(); ++n) {
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % (kPauseMs + 1)));
    if (pct() < 3) {
      try {
        log.line("purge " + std::to_string(exec.store().purge(50)));
      } catch (const idem::StoreUnavailable&) {
      }
      continue;
    }
    std::string key;
    std::int64_t ttl = durable_ttl;
    if (pct() < 70) {
      key = "d" + std::to_string(wall_ms() / kGenerationMs) + "-" +
            std::to_string(rng() % kDurableKeys);
    } else {
      key = "e" + std::to_string(rng() % kExpiringKeys);
      ttl = expiring_ttl;
    }
    const int behaviour = pct();
    const int size_roll = pct();
    const std::size_t filler = size_roll < 90   ? rng() % 300
                               : size_roll < 99 ? 1024 + rng() % (15 * 1024)
                                                : 200 * 1024;
    // Most actions take up to 30 ms; one in ten runs past its lease (400 ms) by up to 3x.
    const auto work_for =
        std::chrono::milliseconds(behaviour / 10 == 1 ? 300 + rng() % 1000 : rng() % 31);
    idem::CallOptions call;
    call.ttl = std::chrono::milliseconds(ttl);
    if (pct() < 50)
      call.wait =
          idem::WaitPolicy{.max_wait = 1500ms, .initial_backoff = 5ms, .max_backoff = 100ms};

    // The action: logs "ran" after making its payload and before returning it.
    auto action = [&](const idem::Attempt& a) -> std::string {
      std::this_thread::sleep_for(work_for);
      if (behaviour < 10) throw Deliberate{};
      std::string payload = idem::soak::make_payload(
          a.token(), key, std::string(filler, static_cast<char>('a' + n % 26)));
      log.line("ran " + key + " " + std::to_string(a.token()) + " " + std::to_string(a.number()) +
               " " + (a.stolen() ? "1" : "0") + " " + std::to_string(wall_ms()) + " " +
               digest(payload));
      return payload;
    };
    auto replayed = [&](const idem::Result<std::string>& r, std::int64_t call_wall) {
      std::optional<idem::Token> t = idem::soak::payload_token(r.value);
      if (!t) {
        log.line("error " + key + " a replay of a payload no soak action made");
        return;
      }
      log.line("replay " + key + " " + std::to_string(*t) + " " + digest(r.value) + " " +
               std::to_string(call_wall) + " " + ms_or_dash(r.completed_at) + " " +
               ms_or_dash(r.expires_at));
    };

    const std::int64_t call_wall = wall_ms();
    try {
      idem::Result<std::string> r;
      if (pct() < 15) {
        idem::BeginResult<std::string> b = exec.begin(kScope, key, call);
        if (b.kind() == idem::BeginKind::kBusy) {
          log.line("busy " + key);
          continue;
        }
        if (b.kind() == idem::BeginKind::kReplay) {
          r = std::move(*b.replay());
        } else {
          // A throwing action leaves the handle to release the record as it goes.
          r = b.handle()->complete(action(b.handle()->attempt()));
        }
      } else {
        r = exec.run(kScope, key, action, call);
      }
      if (r.replayed) {
        replayed(r, call_wall);
      } else {
        log.line("done " + key + " " + std::to_string(r.token.value_or(0)) + " " + digest(r.value));
      }
    } catch (const Deliberate&) {
      log.line("fail " + key + " -");
    } catch (const idem::InProgress&) {
      log.line("busy " + key);
    } catch (const idem::LeaseLost&) {
      log.line("lost " + key);
    } catch (const idem::StoreUnavailable&) {
      log.line("unavailable " + key);
      std::this_thread::sleep_for(20ms);  // the server may be restarting
    } catch (const std::exception& e) {
      std::string what = e.what();
      for (char& c : what) {
        if (c == '\n') c = ' ';
      }
      log.line("error " + key + " " + what);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: idem_soak_worker URL LOG_FILE SEED EXPIRING_TTL_MS DURABLE_TTL_MS\n";
    return 2;
  }
  const std::string url = argv[1];
  Log log(argv[2]);
  const std::uint64_t seed = std::stoull(argv[3]);
  const std::int64_t expiring_ttl = std::stoll(argv[4]);
  const std::int64_t durable_ttl = std::stoll(argv[5]);

  std::thread reader([] {
    std::string line;
    while (std::getline(std::cin, line) && line != "stop") {
    }
    stopping = true;
  });

  // The server may be down (being restarted) when this worker starts: keep trying.
  std::shared_ptr<idem::Store> store;
  while (!stopping && store == nullptr) {
    try {
      store = idem::open_store(url);
    } catch (const idem::StoreUnavailable&) {
      std::this_thread::sleep_for(50ms);
    }
  }
  if (store != nullptr) {
    idem::Executor exec(store,
                        idem::ExecutorOptions{.lease = kLease, .on_heartbeat_error = nullptr});
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back(work, std::ref(exec), std::ref(log), seed * kThreads + t, expiring_ttl,
                           durable_ttl);
    }
    for (std::thread& t : threads) t.join();
  }
  reader.join();
  return 0;
}
