#include "core/heartbeat.h"

#include <time.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace idem::detail {
namespace {

// The thread extends at most this many due leases between two looks at the heap, so a
// lease added meanwhile with an earlier deadline waits for one batch at most.
constexpr std::size_t kBatch = 256;

// A heap holding many removed leases is rebuilt once it is this much larger than twice the
// live count; removal stays lock-free and the heap's size stays proportional to the live
// leases.
constexpr std::size_t kCompactSlack = 8;

// After a failed extend the next try comes a quarter interval later, within these bounds,
// and never after the local deadline.
constexpr Duration kMinRetry{1};
constexpr Duration kMaxRetry{1000};

// Intervals at least this long are scheduled from the coarse clock.
constexpr Duration kCoarseEnough{50};

}  // namespace

SteadyClock::time_point coarse_now() noexcept {
#ifdef CLOCK_MONOTONIC_COARSE
  timespec ts{};
  if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) == 0) {
    return SteadyClock::time_point(std::chrono::duration_cast<SteadyClock::duration>(
        std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)));
  }
#endif
  return SteadyClock::now();
}

HeartbeatLease::HeartbeatLease(std::string_view scope, std::string_view key, Token token,
                               Duration lease, Duration interval,
                               SteadyClock::time_point local_deadline, Timestamp lease_expires_at)
    : token_(token),
      lease_(lease),
      interval_(interval),
      local_deadline_(local_deadline.time_since_epoch().count()),
      lease_expires_at_ms_(lease_expires_at.time_since_epoch().count()) {
  encode_record_id(id_, scope, key);
}

std::string_view HeartbeatLease::scope() const noexcept { return record_id_scope(id_); }

std::string_view HeartbeatLease::key() const noexcept { return record_id_key(id_); }

SteadyClock::time_point HeartbeatLease::local_deadline() const noexcept {
  return SteadyClock::time_point(
      SteadyClock::duration(local_deadline_.load(std::memory_order_acquire)));
}

Timestamp HeartbeatLease::lease_expires_at() const noexcept {
  return Timestamp(Duration(lease_expires_at_ms_.load(std::memory_order_acquire)));
}

void HeartbeatLease::observe(SteadyClock::time_point local_deadline,
                             Timestamp lease_expires_at) noexcept {
  local_deadline_.store(local_deadline.time_since_epoch().count(), std::memory_order_release);
  lease_expires_at_ms_.store(lease_expires_at.time_since_epoch().count(),
                             std::memory_order_release);
}

Heartbeat::Heartbeat(Store& store, ErrorHandler on_error)
    : store_(store), on_error_(std::move(on_error)) {}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Heartbeat::started() const {
  std::lock_guard lock(mu_);
  return thread_.joinable();
}

void Heartbeat::add(std::shared_ptr<HeartbeatLease> lease) {
  const auto now = SteadyClock::now();
  const auto due = std::min(now + lease->interval_, lease->local_deadline());
  active_.fetch_add(1, std::memory_order_relaxed);
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    if (heap_.size() >= kCompactSlack && heap_.size() > 2 * active()) compact();
    heap_.push_back(Item{due, std::move(lease)});
    std::push_heap(heap_.begin(), heap_.end(), Later{});
    if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { loop(); });
    wake = due < wake_at_;
    if (wake) wake_at_ = due;
  }
  if (wake) cv_.notify_one();
}

void Heartbeat::remove(HeartbeatLease& lease) noexcept {
  // The heap keeps its reference until the thread or a compaction drops it; nothing here
  // waits for the thread, which may be inside a store call for any lease.
  if (!lease.removed_.exchange(true, std::memory_order_acq_rel)) {
    active_.fetch_sub(1, std::memory_order_relaxed);
  }
}

void Heartbeat::compact() {
  std::erase_if(
      heap_, [](const Item& item) { return item.lease->removed_.load(std::memory_order_acquire); });
  std::make_heap(heap_.begin(), heap_.end(), Later{});
}

void Heartbeat::report(const std::exception& e) noexcept {
  if (!on_error_) return;
  try {
    on_error_(e);
  } catch (...) {
    // The callback must not throw; if it does, the thread carries on regardless.
  }
}

bool Heartbeat::beat(Item& item) {
  HeartbeatLease& lease = *item.lease;
  if (lease.removed_.load(std::memory_order_acquire)) return false;
  // SPEC §6: the new local deadline counts from when the extend was sent, plus the time left
  // that the store reports by its own clock. The coarse clock (a few ms behind at most) is
  // cheaper; very short intervals need the precise one, or every lease would look due.
  const auto sent = lease.interval_ >= kCoarseEnough ? coarse_now() : SteadyClock::now();
  try {
    const ExtendResult r = store_.extend(lease.scope(), lease.key(), lease.token_, lease.lease_);
    if (lease.removed_.load(std::memory_order_acquire)) return false;
    if (!r.done()) {
      // Fenced: somebody stole or deleted the record; the action should stop.
      lease.stop_.request_stop();
      return false;
    }
    const auto remaining = std::chrono::duration_cast<SteadyClock::duration>(r.lease_remaining);
    lease.local_deadline_.store((sent + remaining).time_since_epoch().count(),
                                std::memory_order_release);
    lease.lease_expires_at_ms_.store(r.lease_expires_at.time_since_epoch().count(),
                                     std::memory_order_release);
    lease.extends_.fetch_add(1, std::memory_order_relaxed);
    // A store that grants less than one interval gets extended at half its grant instead.
    item.due = r.lease_remaining > lease.interval_
                   ? sent + lease.interval_
                   : sent + std::max<SteadyClock::duration>(remaining / 2, kMinRetry);
    return true;
  } catch (const std::exception& e) {
    report(e);
  } catch (...) {
    report(std::runtime_error("the store threw an exception that is not a std::exception"));
  }
  if (lease.removed_.load(std::memory_order_acquire)) return false;
  // SPEC §6: extends that keep failing until the local deadline has passed lose the lease.
  const auto now = SteadyClock::now();
  const auto deadline = lease.local_deadline();
  if (now >= deadline) {
    lease.stop_.request_stop();
    return false;
  }
  const Duration retry = std::clamp(lease.interval_ / 4, kMinRetry, kMaxRetry);
  item.due = std::min(now + retry, deadline);
  return true;
}

void Heartbeat::loop() {
  std::vector<Item> batch;
  batch.reserve(kBatch);
  std::unique_lock lock(mu_);
  while (!stopping_) {
    const auto now = SteadyClock::now();
    while (!heap_.empty() && batch.size() < kBatch) {
      Item& top = heap_.front();
      const bool removed = top.lease->removed_.load(std::memory_order_acquire);
      if (!removed && top.due > now) break;
      std::pop_heap(heap_.begin(), heap_.end(), Later{});
      if (!removed) batch.push_back(std::move(heap_.back()));
      heap_.pop_back();
    }
    if (batch.empty()) {
      if (heap_.empty()) {
        wake_at_ = SteadyClock::time_point::max();
        cv_.wait(lock);
      } else {
        wake_at_ = heap_.front().due;
        cv_.wait_until(lock, wake_at_);
      }
      continue;
    }
    // Busy: leases added meanwhile are looked at after this batch, without a wake-up.
    wake_at_ = SteadyClock::time_point::min();
    lock.unlock();
    // Store calls happen without the lock, so add() and remove() never wait on the store.
    for (Item& item : batch) {
      if (!beat(item)) item.lease.reset();
    }
    lock.lock();
    for (Item& item : batch) {
      if (!item.lease || item.lease->removed_.load(std::memory_order_acquire)) continue;
      heap_.push_back(std::move(item));
      std::push_heap(heap_.begin(), heap_.end(), Later{});
    }
    batch.clear();
  }
}

}  // namespace idem::detail
