// The executor on the in-memory store, measured beside the raw store calls it makes for the
// same work, in the same process (docs/benchmarks.md):
//   fresh key: Executor::run (without and with the event hook counting into
//              ExecutorMetrics), and begin + AttemptHandle::complete  vs  MemoryStore
//              acquire + complete
//   replay:    Executor::run (the same two ways), and begin  vs  MemoryStore acquire
// and the heartbeat's cost per lease.
//
//   build/release/bench/executor_bench --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true
//       --benchmark_report_aggregates_only=true   (one command line)

#include <benchmark/benchmark.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/heartbeat.h"
#include "idem/executor.h"
#include "idem/metrics.h"
#include "idem/stores/memory_store.h"

namespace {

using namespace std::chrono_literals;

constexpr int kReplayKeys = 1024;
// Fresh keys are never reused, so a fresh run grows the store; a fixed iteration count per
// thread keeps its memory bounded.
constexpr benchmark::IterationCount kFreshIterations = 100000;

const std::string kPayload(32, 'p');

// Shared by the threads of one benchmark run; made by thread 0 before the timed loop (the
// loop starts with a barrier) and dropped after it.
std::shared_ptr<idem::MemoryStore> g_store;
std::unique_ptr<idem::Executor> g_executor;
// The counters behind the event hook, for the *Events benchmarks.
idem::ExecutorMetrics g_metrics;

void set_up(const benchmark::State& state, bool with_executor, bool with_replays,
            bool with_events = false) {
  if (state.thread_index() != 0) return;
  g_store = std::make_shared<idem::MemoryStore>();
  if (with_executor) {
    idem::ExecutorOptions options;
    if (with_events) options.on_event = g_metrics.hook();
    g_executor = std::make_unique<idem::Executor>(g_store, std::move(options));
  }
  if (with_replays) {
    for (int i = 0; i < kReplayKeys; ++i) {
      const std::string key = "replay-" + std::to_string(i);
      auto a = std::get<idem::Acquired>(g_store->acquire("bench", key, 30s, 24h));
      (void)g_store->complete("bench", key, a.lease.token, kPayload, 24h);
    }
  }
}

void tear_down(const benchmark::State& state) {
  if (state.thread_index() != 0) return;
  g_executor.reset();
  g_store.reset();
}

// Keys unique to the thread and the run, built the same way for both sides.
class FreshKeys {
 public:
  explicit FreshKeys(const benchmark::State& state)
      : prefix_("t" + std::to_string(state.thread_index()) + "-") {}
  const std::string& next() {
    key_.assign(prefix_);
    key_.append(std::to_string(n_++));
    return key_;
  }

 private:
  std::string prefix_;
  std::string key_;
  long n_ = 0;
};

void BM_RawFresh(benchmark::State& state) {
  set_up(state, false, false);
  FreshKeys keys(state);
  for (auto _ : state) {
    const std::string& key = keys.next();
    auto r = g_store->acquire("bench", key, 30s, 24h);
    auto* a = std::get_if<idem::Acquired>(&r);
    if (a == nullptr) {
      state.SkipWithError("key was not fresh");
      break;
    }
    benchmark::DoNotOptimize(g_store->complete("bench", key, a->lease.token, kPayload, 24h));
  }
  state.SetItemsProcessed(state.iterations());
  tear_down(state);
}

void executor_fresh(benchmark::State& state, bool with_events) {
  set_up(state, true, false, with_events);
  FreshKeys keys(state);
  for (auto _ : state) {
    auto r = g_executor->run("bench", keys.next(),
                             [](const idem::Attempt&) { return std::string(kPayload); });
    if (r.replayed) {
      state.SkipWithError("key was not fresh");
      break;
    }
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations());
  tear_down(state);
}

void BM_ExecutorFresh(benchmark::State& state) { executor_fresh(state, false); }
// The same with the event hook set to ExecutorMetrics: what leaving the counters on costs.
void BM_ExecutorEventsFresh(benchmark::State& state) { executor_fresh(state, true); }

// The same work as BM_ExecutorFresh through begin() and the handle it returns.
void BM_BeginFresh(benchmark::State& state) {
  set_up(state, true, false);
  FreshKeys keys(state);
  for (auto _ : state) {
    auto b = g_executor->begin("bench", keys.next());
    auto* handle = b.handle();
    if (handle == nullptr) {
      state.SkipWithError("key was not fresh");
      break;
    }
    benchmark::DoNotOptimize(handle->complete(std::string(kPayload)));
  }
  state.SetItemsProcessed(state.iterations());
  tear_down(state);
}

void BM_RawReplay(benchmark::State& state) {
  set_up(state, false, true);
  std::vector<std::string> keys;
  for (int i = 0; i < kReplayKeys; ++i) keys.push_back("replay-" + std::to_string(i));
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 97;
  for (auto _ : state) {
    auto r = g_store->acquire("bench", keys[i++ % kReplayKeys], 30s, 24h);
    if (!std::holds_alternative<idem::Replay>(r)) {
      state.SkipWithError("not a replay");
      break;
    }
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations());
  tear_down(state);
}

void executor_replay(benchmark::State& state, bool with_events) {
  set_up(state, true, true, with_events);
  std::vector<std::string> keys;
  for (int i = 0; i < kReplayKeys; ++i) keys.push_back("replay-" + std::to_string(i));
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 97;
  for (auto _ : state) {
    auto r = g_executor->run("bench", keys[i++ % kReplayKeys],
                             [](const idem::Attempt&) { return std::string(); });
    if (!r.replayed) {
      state.SkipWithError("not a replay");
      break;
    }
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations());
  tear_down(state);
}

void BM_ExecutorReplay(benchmark::State& state) { executor_replay(state, false); }
void BM_ExecutorEventsReplay(benchmark::State& state) { executor_replay(state, true); }

void BM_BeginReplay(benchmark::State& state) {
  set_up(state, true, true);
  std::vector<std::string> keys;
  for (int i = 0; i < kReplayKeys; ++i) keys.push_back("replay-" + std::to_string(i));
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 97;
  for (auto _ : state) {
    auto b = g_executor->begin("bench", keys[i++ % kReplayKeys]);
    if (b.replay() == nullptr) {
      state.SkipWithError("not a replay");
      break;
    }
    benchmark::DoNotOptimize(b);
  }
  state.SetItemsProcessed(state.iterations());
  tear_down(state);
}

BENCHMARK(BM_RawFresh)
    ->Iterations(kFreshIterations)
    ->Threads(1)
    ->Threads(2)
    ->Threads(4)
    ->UseRealTime();
BENCHMARK(BM_ExecutorFresh)
    ->Iterations(kFreshIterations)
    ->Threads(1)
    ->Threads(2)
    ->Threads(4)
    ->UseRealTime();
BENCHMARK(BM_ExecutorEventsFresh)
    ->Iterations(kFreshIterations)
    ->Threads(1)
    ->Threads(2)
    ->Threads(4)
    ->UseRealTime();
BENCHMARK(BM_BeginFresh)
    ->Iterations(kFreshIterations)
    ->Threads(1)
    ->Threads(2)
    ->Threads(4)
    ->UseRealTime();
BENCHMARK(BM_RawReplay)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();
BENCHMARK(BM_ExecutorReplay)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();
BENCHMARK(BM_ExecutorEventsReplay)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();
BENCHMARK(BM_BeginReplay)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

// --- the heartbeat ----------------------------------------------------------------------

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// N leases registered with one heartbeat, each extended every `interval_ms`. The process
// does nothing else, so its CPU time is the heartbeat's. Reports the extends per second
// the heartbeat sustained and the CPU it spent per lease per second of keeping it alive.
// With a 1 ms interval the thread cannot keep up, which measures its ceiling.
void BM_Heartbeat(benchmark::State& state) {
  const int leases = static_cast<int>(state.range(0));
  const idem::Duration interval{state.range(1)};
  const idem::Duration lease = interval * 3;
  idem::MemoryStore store;
  idem::detail::Heartbeat heartbeat(store, nullptr);
  std::vector<std::shared_ptr<idem::detail::HeartbeatLease>> held;
  for (int i = 0; i < leases; ++i) {
    const std::string key = "lease-" + std::to_string(i);
    const auto sent = idem::detail::SteadyClock::now();
    auto a = std::get<idem::Acquired>(store.acquire("bench", key, lease, 24h));
    held.push_back(std::make_shared<idem::detail::HeartbeatLease>(
        "bench", key, a.lease.token, lease, interval, sent + a.lease.lease_remaining,
        a.lease.lease_expires_at));
    heartbeat.add(held.back());
  }
  std::uint64_t extends = 0;
  double cpu = 0;
  double wall = 0;
  int lost = 0;
  for (auto _ : state) {
    std::uint64_t before = 0;
    for (const auto& l : held) before += l->extends();
    const double cpu0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(500ms);
    wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cpu += process_cpu_seconds() - cpu0;
    std::uint64_t after = 0;
    for (const auto& l : held) after += l->extends();
    extends += after - before;
  }
  for (const auto& l : held) {
    lost += l->lost() ? 1 : 0;
    heartbeat.remove(*l);
  }
  state.counters["extends_per_s"] = static_cast<double>(extends) / wall;
  state.counters["cpu_us_per_extend"] = cpu * 1e6 / static_cast<double>(extends ? extends : 1);
  state.counters["cpu_us_per_lease_s"] = cpu * 1e6 / wall / leases;
  state.counters["lost"] = lost;
}

BENCHMARK(BM_Heartbeat)
    ->ArgNames({"leases", "interval_ms"})
    ->Args({1000, 100})
    ->Args({10000, 100})
    ->Args({10000, 1})
    ->Iterations(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
