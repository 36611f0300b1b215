#include "core/heartbeat.h"

#include <time.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace idem::detail {
namespace {

// The thread extends at most this many due leases in one batch (one Store::extend_many call)
// between two looks at the heap, so a lease added meanwhile with an earlier deadline waits
// for one batch at most.
constexpr std::size_t kBatch = 1024;

// A lease joins the batch when it is due within 1/kEarlyFraction of its interval.
constexpr int kEarlyFraction = 16;

// After a failed extend the next try comes a quarter interval later, within these bounds,
// and never after the local deadline.
constexpr Duration kMinRetry{1};
constexpr Duration kMaxRetry{1000};

// Intervals at least this long are scheduled from the coarse clock.
constexpr Duration kCoarseEnough{50};

// The heap is 4-ary: half the depth of a binary heap, so a sift moves (and re-indexes)
// half as many leases, each a likely cache miss, while the children compared sit together.
constexpr std::size_t kArity = 4;

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

void HeartbeatLease::lose() noexcept {
  lost_.store(true, std::memory_order_release);
  stop_.request_stop();
}

Heartbeat::Heartbeat(Store& store, ErrorHandler on_error, LeaseHandler on_lease)
    : store_(store), on_error_(std::move(on_error)), on_lease_(std::move(on_lease)) {}

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
  // The coarse clock serves long intervals: it is never ahead of the precise
  // one, so the first extend can only come early.
  const auto now = lease->interval_ >= kCoarseEnough ? coarse_now() : SteadyClock::now();
  const auto due = std::min(now + lease->interval_, lease->local_deadline());
  active_.fetch_add(1, std::memory_order_relaxed);
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    push(Item{due, std::move(lease)});
    if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { loop(); });
    wake = due < wake_at_;
    if (wake) wake_at_ = due;
  }
  if (wake) cv_.notify_one();
}

bool Heartbeat::remove(HeartbeatLease& lease) noexcept {
  Item taken{};
  {
    std::lock_guard lock(mu_);
    if (lease.removed_.load(std::memory_order_relaxed)) return false;
    lease.removed_.store(true, std::memory_order_release);
    active_.fetch_sub(1, std::memory_order_relaxed);
    // A lease in the heap leaves it now. One being extended is not in the heap: the thread
    // drops it when its store call returns, so nothing here waits on the store.
    if (lease.slot_ < heap_.size()) taken = take(lease.slot_);
  }
  // `taken` drops the heap's reference here, outside the lock; the owner usually still
  // holds its own, so the lease is freed on the owner's thread.
  return true;
}

bool Heartbeat::suspend(HeartbeatLease& lease) noexcept {
  Item taken{};
  {
    std::lock_guard lock(mu_);
    if (lease.removed_.load(std::memory_order_relaxed) ||
        lease.suspended_.load(std::memory_order_relaxed)) {
      return false;
    }
    lease.suspended_.store(true, std::memory_order_release);
    // As remove(): one being extended is dropped from the schedule when its call returns.
    if (lease.slot_ < heap_.size()) taken = take(lease.slot_);
  }
  return true;
}

bool Heartbeat::resume(const std::shared_ptr<HeartbeatLease>& held) {
  HeartbeatLease& lease = *held;
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    if (lease.removed_.load(std::memory_order_relaxed) ||
        !lease.suspended_.load(std::memory_order_relaxed)) {
      return false;
    }
    lease.suspended_.store(false, std::memory_order_release);
    // A lease still being extended goes back on the schedule when its call returns (the
    // thread sees it no longer suspended); one off the schedule is put back, due now.
    if (lease.slot_ == HeartbeatLease::kOff) {
      const auto due = SteadyClock::now();
      push(Item{due, held});
      wake = due < wake_at_;
      if (wake) wake_at_ = due;
    }
  }
  if (wake) cv_.notify_one();
  return true;
}

void Heartbeat::place(std::size_t slot, Item item) noexcept {
  item.lease->slot_ = slot;
  heap_[slot] = std::move(item);
}

void Heartbeat::sift_up(std::size_t slot, Item item) noexcept {
  while (slot > 0) {
    const std::size_t parent = (slot - 1) / kArity;
    if (!(item.due < heap_[parent].due)) break;
    place(slot, std::move(heap_[parent]));
    slot = parent;
  }
  place(slot, std::move(item));
}

void Heartbeat::sift_down(std::size_t slot, Item item) noexcept {
  const std::size_t n = heap_.size();
  for (;;) {
    const std::size_t first = kArity * slot + 1;
    if (first >= n) break;
    std::size_t child = first;
    for (std::size_t c = first + 1; c < std::min(first + kArity, n); ++c) {
      if (heap_[c].due < heap_[child].due) child = c;
    }
    if (!(heap_[child].due < item.due)) break;
    place(slot, std::move(heap_[child]));
    slot = child;
  }
  place(slot, std::move(item));
}

void Heartbeat::push(Item item) {
  heap_.emplace_back();
  sift_up(heap_.size() - 1, std::move(item));
}

Heartbeat::Item Heartbeat::take(std::size_t slot) noexcept {
  Item out = std::move(heap_[slot]);
  Item last = std::move(heap_.back());
  heap_.pop_back();
  if (slot < heap_.size()) {
    // The last item fills the hole and moves whichever way restores the order.
    if (slot > 0 && last.due < heap_[(slot - 1) / kArity].due) {
      sift_up(slot, std::move(last));
    } else {
      sift_down(slot, std::move(last));
    }
  }
  out.lease->slot_ = HeartbeatLease::kOff;
  return out;
}

void Heartbeat::report(const std::exception& e) noexcept {
  if (!on_error_) return;
  try {
    on_error_(e);
  } catch (...) {
    // The callback must not throw; if it does, the thread carries on regardless.
  }
}

void Heartbeat::report(const HeartbeatLease& lease, const std::exception* error) noexcept {
  if (!on_lease_) return;
  try {
    on_lease_(lease, error);
  } catch (...) {
    // As above: the thread carries on regardless.
  }
}

void Heartbeat::lose(HeartbeatLease& lease) noexcept {
  lease.lose();
  report(lease, nullptr);
}

void Heartbeat::beat(std::vector<Item>& batch, std::vector<ExtendRequest>& requests,
                     std::vector<std::size_t>& sent_for) {
  // Leases removed while they waited in the batch are not extended.
  requests.clear();
  sent_for.clear();
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const HeartbeatLease& lease = *batch[i].lease;
    if (lease.off_schedule()) continue;
    requests.push_back(ExtendRequest{lease.scope(), lease.key(), lease.token_, lease.lease_});
    sent_for.push_back(i);
  }
  if (requests.empty()) return;
  // SPEC §6: each new local deadline counts from when the extend was sent, plus the time
  // left that the store reports by its own clock.
  const auto sent = SteadyClock::now();
  std::vector<ExtendResult> results;
  try {
    // One call for every due lease: a store with a batched form (PostgreSQL, Redis) pays
    // one round trip for the batch instead of one per lease.
    results = store_.extend_many(requests);
  } catch (const std::exception& e) {
    report(e);
    if (on_lease_) {
      for (const std::size_t i : sent_for) report(*batch[i].lease, &e);
    }
  } catch (...) {
    const std::runtime_error e("the store threw an exception that is not a std::exception");
    report(e);
    if (on_lease_) {
      for (const std::size_t i : sent_for) report(*batch[i].lease, &e);
    }
  }
  if (results.empty()) {
    for (const std::size_t i : sent_for) retry_after_error(batch[i]);
    return;
  }
  for (std::size_t n = 0; n < sent_for.size(); ++n) {
    Item& item = batch[sent_for[n]];
    HeartbeatLease& lease = *item.lease;
    if (lease.off_schedule()) continue;
    const ExtendResult& r = results[n];
    if (!r.done()) {
      // Fenced: somebody stole or deleted the record; the action should stop.
      lose(lease);
      continue;
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
  }
}

void Heartbeat::retry_after_error(Item& item) {
  HeartbeatLease& lease = *item.lease;
  if (lease.off_schedule()) return;
  // SPEC §6: extends that keep failing until the local deadline has passed lose the lease.
  const auto now = SteadyClock::now();
  const auto deadline = lease.local_deadline();
  if (now >= deadline) {
    lose(lease);
    return;
  }
  const Duration retry = std::clamp(lease.interval_ / 4, kMinRetry, kMaxRetry);
  item.due = std::min(now + retry, deadline);
}

void Heartbeat::loop() {
  std::vector<Item> batch;
  batch.reserve(kBatch);
  std::vector<ExtendRequest> requests;
  requests.reserve(kBatch);
  std::vector<std::size_t> sent_for;
  sent_for.reserve(kBatch);
  std::unique_lock lock(mu_);
  while (!stopping_) {
    const auto now = SteadyClock::now();
    // Leases due within a small fraction of their interval go out with the ones already
    // due: an extend that comes a little early costs nothing, and the batch saves a round
    // trip each on a networked store.
    while (!heap_.empty() && batch.size() < kBatch &&
           heap_.front().due <= now + heap_.front().lease->interval_ / kEarlyFraction) {
      Item item = take(0);
      item.lease->slot_ = HeartbeatLease::kExtending;
      batch.push_back(std::move(item));
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
    // Leases removed or lost meanwhile are checked again below, under the lock, since
    // remove() may come at any moment.
    beat(batch, requests, sent_for);
    lock.lock();
    bool dropped = false;
    for (Item& item : batch) {
      HeartbeatLease& lease = *item.lease;
      if (lease.off_schedule() || lease.lost()) {
        lease.slot_ = HeartbeatLease::kOff;
        dropped = true;
        continue;
      }
      push(std::move(item));
    }
    if (dropped) {
      // The references to leases that left the schedule are dropped without the lock.
      lock.unlock();
      batch.clear();
      lock.lock();
    } else {
      batch.clear();
    }
  }
}

}  // namespace idem::detail
