#pragma once

// What `idem proxy` counts for its /metrics endpoint (docs/proxy.md, "Health, metrics and
// logs"), in the Prometheus text format, beside the executor's own counters
// (idem::ExecutorMetrics): requests by outcome, and latency histograms of the store's calls
// and of the upstream's answers. Every method may be called from any thread at once: the
// counts are relaxed atomic additions.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/store_wrapper.h"

namespace idem::proxy {

// A Prometheus histogram of durations, with fixed buckets from 0.5 ms to 10 s.
class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  void observe(std::chrono::nanoseconds took) noexcept;
  std::uint64_t count() const noexcept { return count_.load(std::memory_order_relaxed); }
  // Appends the _bucket, _sum and _count lines of `name`, with `labels` ("" or `op="get"`).
  void render(std::string& out, std::string_view name, std::string_view labels) const;

 private:
  std::array<std::atomic<std::uint64_t>, kBounds.size()> buckets_{};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> sum_ns_{0};
};

class ProxyMetrics {
 public:
  // The outcomes a request is counted under (the access log's `outcome`); anything else
  // counts as "other".
  // clang-format off
  static constexpr std::array<std::string_view, 27> kOutcomes = {
      "recorded", "replayed", "in-progress", "key-reuse", "released", "too-large", "held",
      "passed", "refused", "store-unavailable", "upstream-unreachable", "upstream-timeout",
      "upstream-broken", "upstream-bad-response", "upstream-too-large", "shutting-down",
      "cookie-not-replayed", "too-large-to-replay", "foreign-record", "lease-lost",
      "cancelled", "cut-off", "client-gone", "internal-error", "too-many-connections", "error",
      "other"};
  // clang-format on

  // The store calls timed (TimedStore).
  enum class StoreOp { kAcquire, kComplete, kRelease, kExtend, kGet, kPurge, kForget, kCount };

  void count(std::string_view outcome) noexcept;
  std::uint64_t count_of(std::string_view outcome) const noexcept;
  Histogram& store(StoreOp op) { return store_[static_cast<std::size_t>(op)]; }
  // From asking the upstream (queueing for a connection included) to its answer's header.
  Histogram upstream;

  // Every metric: requests by outcome, the histograms, and the gauges given.
  std::string prometheus(std::size_t connections, std::size_t reading_alone,
                         std::size_t active_leases) const;

 private:
  std::array<std::atomic<std::uint64_t>, kOutcomes.size()> outcomes_{};
  std::array<Histogram, static_cast<std::size_t>(StoreOp::kCount)> store_{};
};

// The store as the proxy uses it: every call timed into ProxyMetrics.
class TimedStore : public StoreWrapper {
 public:
  TimedStore(std::shared_ptr<Store> target, ProxyMetrics& metrics)
      : StoreWrapper(std::move(target)), metrics_(metrics) {}

 protected:
  AcquireResult do_acquire(std::string_view scope, std::string_view key, Duration lease,
                           Duration ttl, std::optional<std::string_view> fingerprint) override;
  WriteResult do_complete(std::string_view scope, std::string_view key, Token token,
                          std::string_view payload, Duration ttl) override;
  WriteResult do_release(std::string_view scope, std::string_view key, Token token) override;
  ExtendResult do_extend(std::string_view scope, std::string_view key, Token token,
                         Duration lease) override;
  std::vector<ExtendResult> do_extend_many(std::span<const ExtendRequest> requests) override;
  std::size_t do_purge(std::size_t limit) override;
  std::optional<Record> do_get(std::string_view scope, std::string_view key) override;
  bool do_forget(std::string_view scope, std::string_view key) override;

 private:
  ProxyMetrics& metrics_;
};

}  // namespace idem::proxy
