// Where a call's time goes (issue 25, docs/benchmarks.md "Where the time goes"): what one
// idem::Executor::run costs this process, in CPU time, context switches and (under
// callgrind) instructions, on any store, for fresh keys or replays, at any number of
// callers.
//
//   call_cost STORE_URL fresh|replay CALLERS OPS
//
// Prints one line: calls per second, CPU time per call (user + system, and each apart; every
// thread of the process: the callers, the heartbeat and the store's own threads), context
// switches per call (voluntary and involuntary), all read with getrusage(RUSAGE_SELF) around
// the measured calls alone. The store server's own CPU is not in it.
//
// Under `valgrind --tool=callgrind` the counters are zeroed when the measured calls start
// and dumped (as the dump named "measured") when they end, so the dump holds their
// instructions alone; bench/breakdown.sh runs it so and sums the dump per object (idem's own
// code is in this binary, the store's client library and the C and C++ libraries in theirs).
// Outside valgrind the requests do nothing.

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS_AT(name)
#endif

#include "idem/executor.h"
#include "idem/open_store.h"

namespace {

struct Usage {
  double user_s;
  double system_s;
  long switches;
};

Usage usage_now() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return {seconds(u.ru_utime), seconds(u.ru_stime), u.ru_nvcsw + u.ru_nivcsw};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: call_cost STORE_URL fresh|replay CALLERS OPS\n");
    return 2;
  }
  const std::string url = argv[1];
  const std::string mode = argv[2];
  const int callers = std::atoi(argv[3]);
  const long ops = std::atol(argv[4]);
  if ((mode != "fresh" && mode != "replay") || callers < 1 || ops < callers) {
    std::fprintf(stderr, "call_cost: bad arguments\n");
    return 2;
  }
  const bool fresh = mode == "fresh";
  idem::Executor executor(idem::open_store(url));
  // A scope of its own per run, so runs against a shared server never meet.
  const std::string scope = "call-cost-" + std::to_string(std::random_device{}());
  const std::string payload(64, 'x');
  const auto action = [&payload](const idem::Attempt&) { return payload; };
  // Replays go round a working set of 1000 keys, run before the measurement.
  const long warm = fresh ? 0 : std::min(ops, 1000L);
  for (long i = 0; i < warm; ++i) (void)executor.run(scope, "w" + std::to_string(i), action);

  std::atomic<long> next{0};
  std::atomic<long> wrong{0};
  const auto caller = [&] {
    for (long i = next.fetch_add(1); i < ops; i = next.fetch_add(1)) {
      const std::string key = fresh ? "f" + std::to_string(i) : "w" + std::to_string(i % warm);
      if (executor.run(scope, key, action).replayed == fresh) wrong.fetch_add(1);
    }
  };
  const Usage before = usage_now();
  const auto started = std::chrono::steady_clock::now();
  CALLGRIND_ZERO_STATS;
  {
    std::vector<std::jthread> threads;
    for (int c = 0; c < callers; ++c) threads.emplace_back(caller);
  }
  CALLGRIND_DUMP_STATS_AT("measured");
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const Usage after = usage_now();

  const auto per_call = [ops](double total) { return total / static_cast<double>(ops); };
  const double user_us = per_call((after.user_s - before.user_s) * 1e6);
  const double system_us = per_call((after.system_s - before.system_s) * 1e6);
  std::printf(
      "%s %s callers=%d ops=%ld calls/s=%.0f cpu_us/call=%.1f (user %.1f, system %.1f) "
      "switches/call=%.2f\n",
      url.substr(0, url.find(':')).c_str(), mode.c_str(), callers, ops,
      static_cast<double>(ops) / elapsed, user_us + system_us, user_us, system_us,
      per_call(static_cast<double>(after.switches - before.switches)));
  // Not measured: delete what the run wrote.
  idem::Store& store = executor.store();
  for (long i = 0; fresh && i < ops; ++i) (void)store.forget(scope, "f" + std::to_string(i));
  for (long i = 0; i < warm; ++i) (void)store.forget(scope, "w" + std::to_string(i));
  if (wrong.load() != 0) {
    std::fprintf(stderr, "call_cost: %ld calls ran or replayed when they should not have\n",
                 wrong.load());
    return 1;
  }
  return 0;
}
