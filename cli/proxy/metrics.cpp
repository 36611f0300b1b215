#include "metrics.h"

#include <algorithm>
#include <cstdio>

namespace idem::proxy {

namespace {

using Clock = std::chrono::steady_clock;

// Times one store call into `h`, whether it returns or throws.
template <typename F>
auto timed(Histogram& h, F&& f) -> decltype(f()) {
  struct Stop {
    Histogram& h;
    Clock::time_point start = Clock::now();
    ~Stop() { h.observe(Clock::now() - start); }
  } stop{h};
  return f();
}

std::string seconds(std::uint64_t ns) {
  char out[32];
  std::snprintf(out, sizeof out, "%.6f", static_cast<double>(ns) / 1e9);
  return out;
}

}  // namespace

void Histogram::observe(std::chrono::nanoseconds took) noexcept {
  const double s = std::chrono::duration<double>(took).count();
  // Buckets are stored as counts of their own range; render() adds them up.
  const auto at = std::lower_bound(kBounds.begin(), kBounds.end(), s) - kBounds.begin();
  if (static_cast<std::size_t>(at) < kBounds.size()) {
    buckets_[static_cast<std::size_t>(at)].fetch_add(1, std::memory_order_relaxed);
  }
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<std::uint64_t>(std::max<std::int64_t>(0, took.count())),
                    std::memory_order_relaxed);
}

void Histogram::render(std::string& out, std::string_view name, std::string_view labels) const {
  const std::string sep = labels.empty() ? "" : ",";
  std::uint64_t cumulative = 0;
  char bound[32];
  for (std::size_t i = 0; i < kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    std::snprintf(bound, sizeof bound, "%g", kBounds[i]);
    out += std::string(name) + "_bucket{" + std::string(labels) + sep + "le=\"" + bound + "\"} " +
           std::to_string(cumulative) + "\n";
  }
  const std::string braces = labels.empty() ? "" : "{" + std::string(labels) + "}";
  out += std::string(name) + "_bucket{" + std::string(labels) + sep + "le=\"+Inf\"} " +
         std::to_string(count()) + "\n";
  out += std::string(name) + "_sum" + braces + " " +
         seconds(sum_ns_.load(std::memory_order_relaxed)) + "\n";
  out += std::string(name) + "_count" + braces + " " + std::to_string(count()) + "\n";
}

void ProxyMetrics::count(std::string_view outcome) noexcept {
  std::size_t i = 0;
  while (i + 1 < kOutcomes.size() && kOutcomes[i] != outcome) ++i;
  outcomes_[i].fetch_add(1, std::memory_order_relaxed);
}

std::uint64_t ProxyMetrics::count_of(std::string_view outcome) const noexcept {
  for (std::size_t i = 0; i < kOutcomes.size(); ++i) {
    if (kOutcomes[i] == outcome) return outcomes_[i].load(std::memory_order_relaxed);
  }
  return 0;
}

std::string ProxyMetrics::prometheus(std::size_t connections, std::size_t reading_alone,
                                     std::size_t active_leases) const {
  std::string out;
  out +=
      "# HELP idem_proxy_requests_total Requests answered, by outcome (docs/proxy.md, \"Every "
      "answer\"): recorded (ran), replayed, in-progress (409), key-reuse (422), released, held "
      "(the key kept after an uncertain outcome), passed (no key), ...\n";
  out += "# TYPE idem_proxy_requests_total counter\n";
  for (std::size_t i = 0; i < kOutcomes.size(); ++i) {
    out += "idem_proxy_requests_total{outcome=\"" + std::string(kOutcomes[i]) + "\"} " +
           std::to_string(outcomes_[i].load(std::memory_order_relaxed)) + "\n";
  }
  out += "# HELP idem_proxy_store_seconds Store calls, by operation.\n";
  out += "# TYPE idem_proxy_store_seconds histogram\n";
  static constexpr const char* kOps[] = {"acquire", "complete", "release", "extend",
                                         "get",     "purge",    "forget"};
  for (std::size_t i = 0; i < store_.size(); ++i) {
    store_[i].render(out, "idem_proxy_store_seconds", std::string("op=\"") + kOps[i] + "\"");
  }
  out +=
      "# HELP idem_proxy_upstream_seconds From asking the upstream (queueing for a connection "
      "included) to its answer's header.\n";
  out += "# TYPE idem_proxy_upstream_seconds histogram\n";
  upstream.render(out, "idem_proxy_upstream_seconds", "");
  out += "# HELP idem_proxy_connections Client connections open.\n";
  out += "# TYPE idem_proxy_connections gauge\n";
  out += "idem_proxy_connections " + std::to_string(connections) + "\n";
  out +=
      "# HELP idem_proxy_reading_alone Keyed answers read on in the background (late, or whose "
      "client went away).\n";
  out += "# TYPE idem_proxy_reading_alone gauge\n";
  out += "idem_proxy_reading_alone " + std::to_string(reading_alone) + "\n";
  out += "# HELP idem_leases_active Leases the heartbeat keeps alive.\n";
  out += "# TYPE idem_leases_active gauge\n";
  out += "idem_leases_active " + std::to_string(active_leases) + "\n";
  return out;
}

// ---- TimedStore ----

using Op = ProxyMetrics::StoreOp;

AcquireResult TimedStore::do_acquire(std::string_view scope, std::string_view key, Duration lease,
                                     Duration ttl, std::optional<std::string_view> fingerprint) {
  return timed(metrics_.store(Op::kAcquire),
               [&] { return StoreWrapper::do_acquire(scope, key, lease, ttl, fingerprint); });
}

WriteResult TimedStore::do_complete(std::string_view scope, std::string_view key, Token token,
                                    std::string_view payload, Duration ttl) {
  return timed(metrics_.store(Op::kComplete),
               [&] { return StoreWrapper::do_complete(scope, key, token, payload, ttl); });
}

WriteResult TimedStore::do_release(std::string_view scope, std::string_view key, Token token) {
  return timed(metrics_.store(Op::kRelease),
               [&] { return StoreWrapper::do_release(scope, key, token); });
}

ExtendResult TimedStore::do_extend(std::string_view scope, std::string_view key, Token token,
                                   Duration lease) {
  return timed(metrics_.store(Op::kExtend),
               [&] { return StoreWrapper::do_extend(scope, key, token, lease); });
}

std::vector<ExtendResult> TimedStore::do_extend_many(std::span<const ExtendRequest> requests) {
  // One batch, one round trip: timed as one extend.
  return timed(metrics_.store(Op::kExtend), [&] { return StoreWrapper::do_extend_many(requests); });
}

std::size_t TimedStore::do_purge(std::size_t limit) {
  return timed(metrics_.store(Op::kPurge), [&] { return StoreWrapper::do_purge(limit); });
}

std::optional<Record> TimedStore::do_get(std::string_view scope, std::string_view key) {
  return timed(metrics_.store(Op::kGet), [&] { return StoreWrapper::do_get(scope, key); });
}

bool TimedStore::do_forget(std::string_view scope, std::string_view key) {
  return timed(metrics_.store(Op::kForget), [&] { return StoreWrapper::do_forget(scope, key); });
}

}  // namespace idem::proxy
