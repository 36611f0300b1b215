// `idem bench`: throughput and latency of Executor::run() on a store, so a user can size
// their store. Each operation is one run() call; the store is whatever --store names.

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "child.h"
#include "commands.h"
#include "common.h"
#include "idem/executor.h"
#include "json_output.h"

namespace idem::cli {
namespace {

constexpr const char* kName = "bench";
// Replay and mixed modes replay a working set of at most this many keys, run once (and not
// measured) before the clock starts.
constexpr std::size_t kMaxWarmKeys = 1000;

struct BenchArgs {
  std::string store;
  std::size_t ops = 10000;
  std::size_t concurrency = 4;
  std::string mode = "fresh";
  std::size_t payload_bytes = 64;
  bool json = false;
};

enum class Mode { kFresh, kReplay, kMixed };

std::string fresh_key(std::size_t i) { return fmt::format("fresh-{}", i); }
std::string warm_key(std::size_t i) { return fmt::format("warm-{}", i); }

// The p-th quantile (0 < p <= 1) of sorted samples, nearest rank.
std::int64_t quantile(const std::vector<std::int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

// Draws "[#####-----]  52%  5200/10000 ops" on stderr every 100 ms until stopped.
class ProgressBar {
 public:
  ProgressBar(const std::atomic<std::size_t>& done, std::size_t total)
      : done_(done), total_(total), thread_([this](std::stop_token stop) { loop(stop); }) {}
  ~ProgressBar() {
    thread_.request_stop();
    cv_.notify_all();
    thread_.join();
    (void)write_all(STDERR_FILENO, "\r\033[K");
  }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

 private:
  void loop(std::stop_token stop) {
    std::unique_lock lock(mutex_);
    while (!stop.stop_requested()) {
      std::size_t done = std::min(done_.load(), total_);
      constexpr std::size_t kWidth = 30;
      std::size_t filled = total_ == 0 ? kWidth : done * kWidth / total_;
      (void)write_all(STDERR_FILENO,
                      fmt::format("\r[{}{}] {:3}% {}/{} ops", std::string(filled, '#'),
                                  std::string(kWidth - filled, '-'),
                                  total_ == 0 ? 100 : done * 100 / total_, done, total_));
      cv_.wait_for(lock, stop, std::chrono::milliseconds(100), [] { return false; });
    }
  }

  const std::atomic<std::size_t>& done_;
  std::size_t total_;
  std::mutex mutex_;
  std::condition_variable_any cv_;
  std::jthread thread_;
};

int bench(const BenchArgs& args) {
  Mode mode = Mode::kFresh;
  if (args.mode == "replay") {
    mode = Mode::kReplay;
  } else if (args.mode == "mixed") {
    mode = Mode::kMixed;
  }
  std::shared_ptr<Store> store = open_cli_store(args.store, StoreAccess::kCreate);
  Executor executor(store);
  // A scope of its own, so the benchmark never meets a real record, and it deletes what it
  // wrote when it is done, or when it is interrupted (SIGINT, SIGTERM, SIGHUP, SIGQUIT stop
  // the measurement; a second one ends idem at once).
  const std::string scope = fmt::format(
      "idem-bench-{}-{}", ::getpid(), std::chrono::system_clock::now().time_since_epoch().count());
  const std::string result(args.payload_bytes, 'x');
  auto action = [&result](const Attempt&) { return result; };
  SignalRelay signals;
  // Ctrl-Z still suspends a benchmark: it holds no lease that would run out.
  signals.hold(/*refuse_suspend=*/false);

  std::size_t warm = 0;
  if (mode != Mode::kFresh) warm = std::clamp<std::size_t>(args.ops / 2, 1, kMaxWarmKeys);
  std::size_t warmed = 0;
  for (; warmed < warm && signals.first() == 0; ++warmed) {
    (void)executor.run(scope, warm_key(warmed), action);
  }

  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> done{0};
  std::atomic<std::size_t> fresh_count{0};
  std::mutex error_mutex;
  std::exception_ptr first_error;
  std::size_t errors = 0;
  std::vector<std::vector<std::int64_t>> latencies(args.concurrency);

  auto worker = [&](std::size_t w) {
    std::vector<std::int64_t>& mine = latencies[w];
    mine.reserve(args.ops / args.concurrency + 1);
    while (signals.first() == 0) {
      std::size_t i = next.fetch_add(1);
      if (i >= args.ops) break;
      bool fresh = mode == Mode::kFresh || (mode == Mode::kMixed && i % 2 == 0);
      std::string key = fresh ? fresh_key(i) : warm_key(i % warm);
      auto start = std::chrono::steady_clock::now();
      try {
        auto r = executor.run(scope, key, action);
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::steady_clock::now() - start);
        mine.push_back(ns.count());
        if (fresh) fresh_count.fetch_add(1);
        // Every fresh key runs, every warm key replays; anything else is a broken store.
        if (r.replayed == fresh) {
          throw std::runtime_error(fmt::format("key {} was {} but should have been {}", key,
                                               r.replayed ? "replayed" : "run",
                                               fresh ? "run" : "replayed"));
        }
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (errors++ == 0) first_error = std::current_exception();
      }
      done.fetch_add(1);
    }
  };

  auto started = std::chrono::steady_clock::now();
  {
    std::unique_ptr<ProgressBar> bar;
    if (::isatty(STDERR_FILENO) != 0) bar = std::make_unique<ProgressBar>(done, args.ops);
    std::vector<std::jthread> threads;
    for (std::size_t w = 0; w < args.concurrency; ++w) threads.emplace_back(worker, w);
  }
  double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  // Delete what the benchmark wrote; not measured. A second signal now ends idem at once.
  const int interrupted = signals.stop_holding();
  const std::size_t attempted = std::min(next.load(), args.ops);
  for (std::size_t i = 0; i < attempted; ++i) {
    if (mode == Mode::kFresh || (mode == Mode::kMixed && i % 2 == 0)) {
      (void)store->forget(scope, fresh_key(i));
    }
  }
  for (std::size_t i = 0; i < warmed; ++i) (void)store->forget(scope, warm_key(i));
  if (interrupted != 0) {
    print_error(kName, fmt::format("interrupted by {} after {} of {} operations; the records "
                                   "it wrote were deleted",
                                   signal_name(interrupted), done.load(), args.ops));
    return 128 + interrupted;
  }

  std::vector<std::int64_t> all;
  for (auto& v : latencies) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  auto us = [](std::int64_t ns) { return static_cast<double>(ns) / 1000.0; };
  double mean_ns =
      all.empty() ? 0.0
                  : static_cast<double>(std::accumulate(all.begin(), all.end(), std::int64_t{0})) /
                        static_cast<double>(all.size());
  double ops_per_s = elapsed_s > 0 ? static_cast<double>(all.size()) / elapsed_s : 0.0;

  if (args.json) {
    nlohmann::ordered_json out;
    out["store"] = store->describe();
    out["mode"] = args.mode;
    out["ops"] = args.ops;
    out["measured"] = all.size();
    out["errors"] = errors;
    out["concurrency"] = args.concurrency;
    out["payload_bytes"] = args.payload_bytes;
    out["elapsed_s"] = elapsed_s;
    out["ops_per_s"] = ops_per_s;
    out["latency_us"] = {{"mean", mean_ns / 1000.0},
                         {"p50", us(quantile(all, 0.50))},
                         {"p99", us(quantile(all, 0.99))},
                         {"p999", us(quantile(all, 0.999))},
                         {"max", us(all.empty() ? 0 : all.back())}};
    write_stdout(dump_json(out));
  } else {
    write_stdout(
        fmt::format("store       {}\n"
                    "mode        {}: {} ops, concurrency {}, {}-byte results\n"
                    "elapsed     {:.3f} s\n"
                    "throughput  {:.0f} ops/s\n"
                    "latency     p50 {:.1f} us   p99 {:.1f} us   p99.9 {:.1f} us   "
                    "max {:.1f} us\n",
                    store->describe(), args.mode, args.ops, args.concurrency, args.payload_bytes,
                    elapsed_s, ops_per_s, us(quantile(all, 0.50)), us(quantile(all, 0.99)),
                    us(quantile(all, 0.999)), us(all.empty() ? 0 : all.back())));
  }
  if (errors > 0) {
    print_error(kName, fmt::format("{} of {} operations failed; the first:", errors, args.ops));
    try {
      std::rethrow_exception(first_error);
    } catch (const std::exception& e) {
      return report_error(kName, e);
    }
  }
  return kExitOk;
}

}  // namespace

Command add_bench_command(CLI::App& parent) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* app =
      parent.add_subcommand(kName, "Measure throughput and latency of Executor::run() on a store");
  add_store_option(*app, args->store);
  app->add_option("--ops", args->ops, "How many run() calls to measure")
      ->type_name("N")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{100'000'000}));
  app->add_option("--concurrency", args->concurrency, "Threads calling run() at once")
      ->type_name("C")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1024}));
  app->add_option("--mode", args->mode,
                  "fresh: every call runs a new key; replay: every call replays a stored "
                  "result; mixed: half and half")
      ->capture_default_str()
      ->check(CLI::IsMember({"fresh", "replay", "mixed"}));
  app->add_option("--payload-bytes", args->payload_bytes, "Size of each stored result")
      ->type_name("B")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{0}, kDefaultMaxPayloadBytes));
  app->add_flag("--json", args->json, "Print the figures as JSON");
  return Command{app, [args] { return bench(*args); }};
}

}  // namespace idem::cli
