// SPEC §7: how soon a duplicate waiting in the same process returns after the owner's
// complete returns: a blocking run() on a thread of its own, and Executor::begin_async
// (an event loop's wait, answered on the executor's waiting thread). Both follow the
// owner in memory (the same mechanism, docs/api.md) and take its result from there.
// docs/benchmarks.md quotes it.
//
//   wake_in_process STORE_URL [SAMPLES] [HOLD_MS]
//
// Per sample: the owner takes a fresh key with Executor::begin, the waiter starts waiting
// on it (under a policy whose polls come an hour apart, so only the wake can end it), the
// owner holds the key HOLD_MS more and completes; the latency is from the complete's return
// to the waiter's answer, both read on CLOCK_MONOTONIC. The two kinds of waiter take turns,
// sample by sample, so load on the machine falls on both alike.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "idem/executor.h"
#include "idem/open_store.h"
#include "percentile.h"

namespace {

using namespace std::chrono_literals;

using idem::bench::percentile;

const idem::WaitPolicy kOnlyAWake{.max_wait = 1h, .initial_backoff = 1h, .max_backoff = 1h};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: wake_in_process STORE_URL [SAMPLES] [HOLD_MS]\n");
    return 2;
  }
  const std::string url = argv[1];
  const int samples = argc > 2 ? std::atoi(argv[2]) : 200;
  const int hold_ms = argc > 3 ? std::atoi(argv[3]) : 10;
  const std::string prefix = std::to_string(std::random_device{}()) + "-";
  idem::Executor exec(idem::open_store(url));
  std::vector<double> blocking_ms, async_ms;
  std::vector<std::string> keys;
  for (int i = 0; i < samples; ++i) {
    for (const bool async : {false, true}) {
      const std::string key = prefix + (async ? "async-" : "blocking-") + std::to_string(i);
      keys.push_back(key);
      idem::BeginResult<> owner = exec.begin("wake", key);
      if (owner.handle() == nullptr) return 1;
      std::promise<long long> returned;
      std::thread blocking;
      if (async) {
        const auto now = exec.begin_async(
            "wake", key, idem::CallOptions{.wait = kOnlyAWake}, [&returned](idem::BeginAnswer a) {
              const long long t = std::chrono::steady_clock::now().time_since_epoch().count();
              (void)std::move(a).get();
              returned.set_value(t);
            });
        if (now) return 1;
      } else {
        blocking = std::thread([&] {
          (void)exec.run(
              "wake", key, [](const idem::Attempt&) { return std::string("waiter"); },
              idem::CallOptions{.wait = kOnlyAWake});
          returned.set_value(std::chrono::steady_clock::now().time_since_epoch().count());
        });
      }
      // The waiter follows the owner in memory before the owner completes.
      while (exec.waiting_duplicates() == 0) std::this_thread::sleep_for(100us);
      std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
      (void)owner.handle()->complete("owner");
      const long long done = std::chrono::steady_clock::now().time_since_epoch().count();
      const long long t = returned.get_future().get();
      if (blocking.joinable()) blocking.join();
      (async ? async_ms : blocking_ms).push_back(static_cast<double>(t - done) / 1e6);
    }
  }
  for (const bool async : {false, true}) {
    const auto& ms = async ? async_ms : blocking_ms;
    std::printf("%-26s samples=%zu p50=%.3f ms p99=%.3f ms max=%.3f ms\n",
                async ? "begin_async (event loop)" : "blocking run (a thread)", ms.size(),
                percentile(ms, 0.5), percentile(ms, 0.99), percentile(ms, 1.0));
  }
  for (const auto& key : keys) (void)exec.store().forget("wake", key);
  return 0;
}
