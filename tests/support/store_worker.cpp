// A worker process for the multi-process tests of the shared stores (SQLite, PostgreSQL,
// Redis), driven through support/worker_process.h. It opens the store from a URL and runs
// keys through idem::Executor (or calls the store directly), reporting what it saw one line
// per event, so the test can check the processes together.
//
//   race URL WORKER KEYS START_MS OUT_FILE
//       Runs keys k0..k<KEYS-1> (starting at k<WORKER*7 % KEYS>, so workers overlap) after
//       the wall clock reaches START_MS; writes "ran KEY PAYLOAD" or "replay KEY PAYLOAD"
//       per key, or "error KEY MESSAGE", to OUT_FILE.
//   hold URL KEY LEASE_MS
//       Runs KEY with an action that prints "acquired TOKEN ATTEMPT" and then waits for a
//       line on standard input before returning "old-owner"; then prints "completed",
//       "lease-lost" or "error MESSAGE".
//   run URL KEY PAYLOAD LEASE_MS MAX_WAIT_MS
//       Runs KEY once, waiting up to MAX_WAIT_MS for a busy key; prints
//       "ran stolen=S attempt=N token=T", "replay PAYLOAD" or "error MESSAGE".
//   hammer URL THREADS
//       THREADS threads run fresh keys hammer-T-N as fast as they can; prints "running" once
//       the first has completed, and when a line arrives on standard input stops and prints
//       "done RUNS ERRORS", then the first error's message if there was one.
//   acquire URL KEY LEASE_MS TTL_MS
//       Prints "clock MS" (this process's wall clock, which a test may have shifted), then
//       calls Store::acquire once and prints "acquired TOKEN ATTEMPT STOLEN REMAINING_MS",
//       "busy REMAINING_MS" or "replay PAYLOAD".
//   complete URL KEY TOKEN PAYLOAD TTL_MS
//       Calls Store::complete once; prints "done" or "fenced".
//   wait URL KEY BACKOFF_MS [BUSY [WATCHED_MS]]
//       Runs KEY, waiting up to an hour for a busy key and polling every BACKOFF_MS (every
//       WATCHED_MS once the store's notification watches the key; BACKOFF_MS by default); prints
//       "waiting" once the store answered busy BUSY times (2 by default: the executor
//       watches the record by then, on a store that can notify; 3 on PostgreSQL, whose
//       listener wakes every watch once when it starts listening), then
//       "replay PAYLOAD acquires=N" or "ran acquires=N" (N: the store's acquire calls), or
//       "error MESSAGE".

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "idem/error.h"
#include "idem/executor.h"
#include "idem/open_store.h"
#include "idem/store_wrapper.h"

namespace {

using namespace std::chrono_literals;

constexpr std::string_view kScope = "mp";

int race(const std::string& url, int worker, int keys, long long start_ms,
         const std::string& out_file) {
  idem::Executor exec(
      idem::open_store(url),
      idem::ExecutorOptions{
          .lease = 10s,
          .wait = idem::WaitPolicy{.max_wait = 30s, .initial_backoff = 2ms, .max_backoff = 50ms},
          .on_heartbeat_error = nullptr});
  // Start together, so the workers really overlap; bounded in case the start is far off.
  const auto start = std::chrono::system_clock::time_point(std::chrono::milliseconds(start_ms));
  const auto limit = std::chrono::system_clock::now() + 10s;
  std::this_thread::sleep_until(std::min(start, limit));

  std::ofstream out(out_file);
  const std::string name = "worker" + std::to_string(worker);
  for (int i = 0; i < keys; ++i) {
    const std::string key = "k" + std::to_string((i + worker * 7) % keys);
    try {
      auto r = exec.run(kScope, key, [&](const idem::Attempt&) {
        // Long enough that the other workers find the key busy and wait for it.
        std::this_thread::sleep_for(3ms);
        return name + ":" + key;
      });
      out << (r.replayed ? "replay " : "ran ") << key << " " << r.value << "\n";
    } catch (const std::exception& e) {
      out << "error " << key << " " << e.what() << "\n";
    }
  }
  return out.good() ? 0 : 1;
}

int hold(const std::string& url, const std::string& key, int lease_ms) {
  try {
    idem::Executor exec(idem::open_store(url),
                        idem::ExecutorOptions{.lease = std::chrono::milliseconds(lease_ms),
                                              .on_heartbeat_error = nullptr});
    auto r = exec.run(kScope, key, [](const idem::Attempt& a) {
      std::cout << "acquired " << a.token() << " " << a.number() << std::endl;
      std::string line;
      std::getline(std::cin, line);
      return std::string("old-owner");
    });
    std::cout << (r.replayed ? "replayed" : "completed") << std::endl;
  } catch (const idem::LeaseLost&) {
    std::cout << "lease-lost" << std::endl;
  } catch (const std::exception& e) {
    std::cout << "error " << e.what() << std::endl;
  }
  return 0;
}

int run_once(const std::string& url, const std::string& key, const std::string& payload,
             int lease_ms, int max_wait_ms) {
  try {
    idem::Executor exec(
        idem::open_store(url),
        idem::ExecutorOptions{
            .lease = std::chrono::milliseconds(lease_ms),
            .wait = idem::WaitPolicy{.max_wait = std::chrono::milliseconds(max_wait_ms)},
            .on_heartbeat_error = nullptr});
    std::string seen;
    auto r = exec.run(kScope, key, [&](const idem::Attempt& a) {
      seen = "ran stolen=" + std::to_string(a.stolen() ? 1 : 0) +
             " attempt=" + std::to_string(a.number()) + " token=" + std::to_string(a.token());
      return payload;
    });
    std::cout << (r.replayed ? "replay " + r.value : seen) << std::endl;
  } catch (const std::exception& e) {
    std::cout << "error " << e.what() << std::endl;
  }
  return 0;
}

// Counts acquires, and says "waiting" at the busy_lines-th busy answer.
class CountingAcquires final : public idem::StoreWrapper {
 public:
  CountingAcquires(std::shared_ptr<idem::Store> store, int busy_lines)
      : StoreWrapper(std::move(store)), busy_lines_(busy_lines) {}
  int acquires() const { return acquires_.load(); }

 protected:
  idem::AcquireResult do_acquire(std::string_view scope, std::string_view key, idem::Duration lease,
                                 idem::Duration ttl,
                                 std::optional<std::string_view> fingerprint) override {
    idem::AcquireResult r = StoreWrapper::do_acquire(scope, key, lease, ttl, fingerprint);
    const int n = ++acquires_;
    if (n == busy_lines_ && std::holds_alternative<idem::Busy>(r)) {
      std::cout << "waiting" << std::endl;
    }
    return r;
  }

 private:
  std::atomic<int> acquires_{0};
  int busy_lines_;
};

int wait_once(const std::string& url, const std::string& key, int backoff_ms, int busy_lines,
              int watched_ms) {
  try {
    auto store = std::make_shared<CountingAcquires>(idem::open_store(url), busy_lines);
    const auto backoff = std::chrono::milliseconds(backoff_ms);
    idem::Executor exec(
        store,
        idem::ExecutorOptions{
            .wait = idem::WaitPolicy{.max_wait = 1h,
                                     .initial_backoff = backoff,
                                     .max_backoff = backoff,
                                     .watched_backoff = std::chrono::milliseconds(watched_ms)},
            .on_heartbeat_error = nullptr});
    auto r = exec.run(kScope, key, [](const idem::Attempt&) { return std::string("mine"); });
    const std::string acquires = "acquires=" + std::to_string(store->acquires());
    std::cout << (r.replayed ? "replay " + r.value + " " + acquires : "ran " + acquires)
              << std::endl;
  } catch (const std::exception& e) {
    std::cout << "error " << e.what() << std::endl;
  }
  return 0;
}

int hammer(const std::string& url, int threads) {
  idem::Executor exec(idem::open_store(url),
                      idem::ExecutorOptions{.lease = 30s, .on_heartbeat_error = nullptr});
  std::atomic<bool> stop{false};
  std::atomic<long> runs{0};
  std::atomic<long> errors{0};
  std::mutex mu;
  std::string first_error;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (long i = 0; !stop; ++i) {
        const std::string key = "hammer-" + std::to_string(t) + "-" + std::to_string(i);
        try {
          (void)exec.run(kScope, key, [](const idem::Attempt&) { return std::string(64, 'h'); });
          if (runs.fetch_add(1) == 0) std::cout << "running" << std::endl;
        } catch (const std::exception& e) {
          errors.fetch_add(1);
          std::lock_guard lock(mu);
          if (first_error.empty()) first_error = e.what();
        }
      }
    });
  }
  std::string line;
  std::getline(std::cin, line);
  stop = true;
  for (std::thread& w : workers) w.join();
  std::cout << "done " << runs << " " << errors << std::endl;
  if (!first_error.empty()) std::cout << first_error << std::endl;
  return 0;
}

int acquire_once(const std::string& url, const std::string& key, int lease_ms, int ttl_ms) {
  std::cout << "clock "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()
            << std::endl;
  auto store = idem::open_store(url);
  const idem::AcquireResult r = store->acquire(kScope, key, std::chrono::milliseconds(lease_ms),
                                               std::chrono::milliseconds(ttl_ms));
  if (const auto* a = std::get_if<idem::Acquired>(&r)) {
    std::cout << "acquired " << a->lease.token << " " << a->lease.attempt << " "
              << (a->stolen ? 1 : 0) << " " << a->lease.lease_remaining.count() << std::endl;
  } else if (const auto* b = std::get_if<idem::Busy>(&r)) {
    std::cout << "busy " << b->lease_remaining.count() << std::endl;
  } else {
    std::cout << "replay " << std::get<idem::Replay>(r).payload << std::endl;
  }
  return 0;
}

int complete_once(const std::string& url, const std::string& key, idem::Token token,
                  const std::string& payload, int ttl_ms) {
  auto store = idem::open_store(url);
  const idem::WriteResult r =
      store->complete(kScope, key, token, payload, std::chrono::milliseconds(ttl_ms));
  std::cout << (r == idem::WriteResult::kDone ? "done" : "fenced") << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "race" && argc == 7) {
      return race(argv[2], std::stoi(argv[3]), std::stoi(argv[4]), std::stoll(argv[5]), argv[6]);
    }
    if (mode == "hold" && argc == 5) return hold(argv[2], argv[3], std::stoi(argv[4]));
    if (mode == "hammer" && argc == 4) return hammer(argv[2], std::stoi(argv[3]));
    if (mode == "acquire" && argc == 6) {
      return acquire_once(argv[2], argv[3], std::stoi(argv[4]), std::stoi(argv[5]));
    }
    if (mode == "complete" && argc == 7) {
      return complete_once(argv[2], argv[3], std::stoull(argv[4]), argv[5], std::stoi(argv[6]));
    }
    if (mode == "wait" && argc >= 5 && argc <= 7) {
      return wait_once(argv[2], argv[3], std::stoi(argv[4]), argc >= 6 ? std::stoi(argv[5]) : 2,
                       argc == 7 ? std::stoi(argv[6]) : std::stoi(argv[4]));
    }
    if (mode == "run" && argc == 7) {
      return run_once(argv[2], argv[3], argv[4], std::stoi(argv[5]), std::stoi(argv[6]));
    }
  } catch (const std::exception& e) {
    std::cerr << "worker: " << e.what() << "\n";
    return 2;
  }
  std::cerr << "usage: see the comment at the top of tests/support/store_worker.cpp\n";
  return 2;
}
