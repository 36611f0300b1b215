#include "idem/metrics.h"

#include <cstdio>
#include <utility>

namespace idem {

EventHook ExecutorMetrics::hook() {
  return [this](const Event& event) { record(event); };
}

EventHook ExecutorMetrics::hook(EventHook next) {
  if (!next) return hook();
  return [this, next = std::move(next)](const Event& event) {
    record(event);
    next(event);
  };
}

void ExecutorMetrics::record(const Event& event) noexcept {
  const auto i = static_cast<std::size_t>(event.kind);
  if (i >= kKinds) return;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  if (event.kind == EventKind::kRan && event.elapsed.count() > 0) {
    ran_micros_.fetch_add(static_cast<std::uint64_t>(event.elapsed.count()),
                          std::memory_order_relaxed);
  }
}

std::uint64_t ExecutorMetrics::count(EventKind kind) const noexcept {
  const auto i = static_cast<std::size_t>(kind);
  return i < kKinds ? counts_[i].load(std::memory_order_relaxed) : 0;
}

double ExecutorMetrics::action_seconds_sum() const noexcept {
  return static_cast<double>(ran_micros_.load(std::memory_order_relaxed)) / 1e6;
}

std::string ExecutorMetrics::prometheus(std::string_view prefix) const {
  const std::string p(prefix);
  std::string out;
  auto line = [&](const std::string& name, const char* labels, std::uint64_t value) {
    out += name;
    out += labels;
    out += ' ';
    out += std::to_string(value);
    out += '\n';
  };
  out += "# HELP " + p +
         "_calls_total Executor calls by outcome: ran (the action ran and its result was "
         "recorded), replayed (a stored result from the store), followed (an in-process "
         "owner's result, in memory), in_progress (the key was busy).\n";
  out += "# TYPE " + p + "_calls_total counter\n";
  line(p + "_calls_total", "{outcome=\"ran\"}", count(EventKind::kRan));
  line(p + "_calls_total", "{outcome=\"replayed\"}", count(EventKind::kReplayed));
  line(p + "_calls_total", "{outcome=\"followed\"}", count(EventKind::kFollowed));
  line(p + "_calls_total", "{outcome=\"in_progress\"}", count(EventKind::kInProgress));
  out +=
      "# HELP " + p +
      "_leases_total Lease events: stolen (an abandoned lease taken over), released (given "
      "up without a result), lost (fenced, or not extended before its deadline), abandoned (left "
      "to run out unreleased after an outcome the caller could not know).\n";
  out += "# TYPE " + p + "_leases_total counter\n";
  line(p + "_leases_total", "{event=\"stolen\"}", count(EventKind::kStolen));
  line(p + "_leases_total", "{event=\"released\"}", count(EventKind::kReleased));
  line(p + "_leases_total", "{event=\"lost\"}", count(EventKind::kLeaseLost));
  line(p + "_leases_total", "{event=\"abandoned\"}", count(EventKind::kAbandoned));
  out += "# HELP " + p + "_heartbeat_errors_total Extends that failed with a store error.\n";
  out += "# TYPE " + p + "_heartbeat_errors_total counter\n";
  line(p + "_heartbeat_errors_total", "", count(EventKind::kHeartbeatError));
  out += "# HELP " + p + "_action_seconds Time from begin to a recorded result.\n";
  out += "# TYPE " + p + "_action_seconds summary\n";
  char sum[64];
  std::snprintf(sum, sizeof sum, "%.6f", action_seconds_sum());
  out += p + "_action_seconds_sum " + sum + "\n";
  line(p + "_action_seconds_count", "", count(EventKind::kRan));
  return out;
}

}  // namespace idem
