#pragma once

// A ready set of counters on the executor's event hook (ExecutorOptions::on_event),
// rendered in the Prometheus text format, so a service can expose /metrics:
//
//   idem::ExecutorMetrics metrics;
//   idem::Executor executor(store, idem::ExecutorOptions{.on_event = metrics.hook()});
//   ...
//   http.get("/metrics", [&] { return metrics.prometheus(); });  // text/plain; version=0.0.4
//
// Thread-safe: the hook counts with relaxed atomic additions and may be called from every
// thread at once; prometheus() and count() read while calls go on. One set may serve
// several executors; it must outlive every executor whose hook points at it.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "idem/executor.h"

namespace idem {

class ExecutorMetrics {
 public:
  ExecutorMetrics() = default;
  ExecutorMetrics(const ExecutorMetrics&) = delete;
  ExecutorMetrics& operator=(const ExecutorMetrics&) = delete;

  // The hook to set as ExecutorOptions::on_event. With `next`, each event is counted and
  // then passed on (to a logger, say).
  EventHook hook();
  EventHook hook(EventHook next);

  // Counts one event (what the hook does).
  void record(const Event& event) noexcept;

  // Events of `kind` counted so far.
  std::uint64_t count(EventKind kind) const noexcept;
  // Seconds from begin to a recorded result, summed over the kRan events.
  double action_seconds_sum() const noexcept;

  // Every counter in the Prometheus text exposition format (version 0.0.4), metric names
  // starting with `prefix` (letters, digits and underscores):
  //   idem_calls_total{outcome="ran|replayed|followed|in_progress"}
  //   idem_leases_total{event="stolen|released|lost|abandoned"}
  //   idem_heartbeat_errors_total
  //   idem_action_seconds_sum, idem_action_seconds_count
  std::string prometheus(std::string_view prefix = "idem") const;

 private:
  static constexpr std::size_t kKinds = static_cast<std::size_t>(EventKind::kAbandoned) + 1;
  std::array<std::atomic<std::uint64_t>, kKinds> counts_{};
  std::atomic<std::uint64_t> ran_micros_{0};
};

}  // namespace idem
