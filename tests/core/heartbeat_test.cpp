// The heartbeat component on its own (SPEC §6, §7): one thread keeping many leases alive,
// losing a lease when the store fences it or stays unreachable past the local deadline,
// and never making its owners wait on a store call.

#include "core/heartbeat.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "idem/clock.h"
#include "idem/store_wrapper.h"
#include "idem/stores/memory_store.h"
#include "idem/testing/fault_store.h"
#include "idem/testing/matchers.h"
#include "support/eventually.h"

namespace {

using namespace std::chrono_literals;
using idem::Duration;
using idem::detail::Heartbeat;
using idem::detail::HeartbeatLease;
using idem::detail::SteadyClock;
using idem::testing::eventually;
using idem::testing::FaultStore;
using idem::testing::IsAcquired;
using idem::testing::kEventually;
using idem::testing::Op;

// Acquires (scope, key) and describes the lease as the executor would: the local deadline
// counts from when the acquire was sent (SPEC §6).
std::shared_ptr<HeartbeatLease> acquire(idem::Store& store, const std::string& key, Duration lease,
                                        Duration interval) {
  const auto sent = SteadyClock::now();
  auto r = store.acquire("hb", key, lease, 1h);
  const auto& a = std::get<idem::Acquired>(r);
  return std::make_shared<HeartbeatLease>("hb", key, a.lease.token, lease, interval,
                                          sent + a.lease.lease_remaining, a.lease.lease_expires_at);
}

bool live_in_store(idem::Store& store, const HeartbeatLease& lease) {
  auto r = store.get(lease.scope(), lease.key());
  return r && r->state == idem::RecordState::kInProgress && r->token == lease.token() &&
         r->lease_expires_at > r->now;
}

TEST(HeartbeatLeaseTest, KeepsScopeAndKeyApart) {
  HeartbeatLease a("a:b", "c", 1, 1s, 300ms, SteadyClock::now(), {});
  HeartbeatLease b("a", "b:c", 2, 1s, 300ms, SteadyClock::now(), {});
  EXPECT_NE(a.id(), b.id());
  EXPECT_EQ(a.scope(), "a:b");
  EXPECT_EQ(a.key(), "c");
  EXPECT_EQ(b.scope(), "a");
  EXPECT_EQ(b.key(), "b:c");
  const std::string binary("k\0y", 3);
  HeartbeatLease c(std::string(255, 's'), binary, 3, 1s, 300ms, SteadyClock::now(), {});
  EXPECT_EQ(c.scope(), std::string(255, 's'));
  EXPECT_EQ(c.key(), binary);
}

TEST(HeartbeatTest, KeepsALeaseAliveForManyLeaseDurations) {
  idem::MemoryStore store;
  Heartbeat heartbeat(store, nullptr);
  auto lease = acquire(store, "k", 150ms, 50ms);
  const auto first_deadline = lease->lease_expires_at();
  EXPECT_FALSE(heartbeat.started());
  heartbeat.add(lease);
  EXPECT_TRUE(heartbeat.started());
  EXPECT_EQ(heartbeat.active(), 1u);
  // Six lease durations; the store must find the lease live at every look.
  for (int i = 0; i < 18; ++i) {
    std::this_thread::sleep_for(50ms);
    EXPECT_TRUE(live_in_store(store, *lease)) << "look " << i;
    EXPECT_THAT(store.acquire("hb", "k", 1s, 1h), idem::testing::IsBusy());
  }
  EXPECT_FALSE(lease->lost());
  EXPECT_GE(lease->extends(), 5u);
  EXPECT_GT(lease->lease_expires_at(), first_deadline);
  heartbeat.remove(*lease);
  EXPECT_EQ(heartbeat.active(), 0u);
}

TEST(HeartbeatTest, FencedExtendRequestsStop) {
  idem::MemoryStore store;
  Heartbeat heartbeat(store, nullptr);
  auto lease = acquire(store, "k", 300ms, 20ms);
  std::atomic<bool> callback_ran{false};
  std::stop_callback on_lost(lease->stop_token(), [&] { callback_ran = true; });
  heartbeat.add(lease);
  ASSERT_TRUE(store.forget("hb", "k"));
  EXPECT_TRUE(eventually([&] { return lease->lost(); }));
  EXPECT_TRUE(eventually([&] { return callback_ran.load(); }));
  // A lost lease stays counted until its owner removes it.
  EXPECT_EQ(heartbeat.active(), 1u);
  heartbeat.remove(*lease);
  EXPECT_EQ(heartbeat.active(), 0u);
}

TEST(HeartbeatTest, ErrorsUntilTheLocalDeadlineLoseTheLease) {
  auto faults = std::make_shared<FaultStore>(std::make_shared<idem::MemoryStore>());
  std::atomic<int> errors{0};
  Heartbeat heartbeat(*faults, [&](const std::exception& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("injected fault in extend"));
    ++errors;
  });
  faults->fail_always(Op::kExtend);
  auto lease = acquire(*faults, "k", 200ms, 60ms);
  heartbeat.add(lease);
  EXPECT_TRUE(eventually([&] { return lease->lost(); }));
  // Extends were retried more often than once per interval before giving up.
  EXPECT_GE(errors.load(), 3);
  EXPECT_EQ(lease->extends(), 0u);
  heartbeat.remove(*lease);
}

TEST(HeartbeatTest, NeverComparesTheStoresClockWithItsOwn) {
  // The store's clock reads 1970 and never moves. Deadlines from it are decades "in the
  // past" by the system clock; the heartbeat must count only the time left the store
  // reports, so a failed extend now and then within the lease loses nothing.
  auto clock = std::make_shared<idem::ManualClock>(idem::Timestamp{24h});
  auto faults = std::make_shared<FaultStore>(
      std::make_shared<idem::MemoryStore>(idem::MemoryStoreOptions{.clock = clock}));
  Heartbeat heartbeat(*faults, nullptr);
  auto lease = acquire(*faults, "k", 1s, 250ms);
  heartbeat.add(lease);
  faults->fail_next(Op::kExtend, 1);
  ASSERT_TRUE(faults->wait_for_calls(Op::kExtend, 4));
  EXPECT_FALSE(lease->lost());
  EXPECT_GE(lease->extends(), 1u);
  heartbeat.remove(*lease);
}

TEST(HeartbeatTest, RemoveNeverWaitsForAStoreCall) {
  auto faults = std::make_shared<FaultStore>(std::make_shared<idem::MemoryStore>());
  Heartbeat heartbeat(*faults, nullptr);
  auto stuck = acquire(*faults, "stuck", 10s, 20ms);
  auto other = acquire(*faults, "other", 10s, 20ms);
  faults->pause(Op::kExtend);
  heartbeat.add(stuck);
  // The thread is now inside a store call that will not return until resumed.
  ASSERT_TRUE(faults->wait_for_blocked(Op::kExtend, 1));
  auto owner = std::async(std::launch::async, [&] {
    heartbeat.add(other);
    heartbeat.remove(*other);
    heartbeat.remove(*stuck);
  });
  EXPECT_EQ(owner.wait_for(kEventually), std::future_status::ready);
  EXPECT_EQ(heartbeat.active(), 0u);
  faults->resume(Op::kExtend);
}

TEST(HeartbeatTest, RemovedLeaseIsNotExtendedAgain) {
  auto faults = std::make_shared<FaultStore>(std::make_shared<idem::MemoryStore>());
  Heartbeat heartbeat(*faults, nullptr);
  auto lease = acquire(*faults, "k", 300ms, 10ms);
  heartbeat.add(lease);
  ASSERT_TRUE(faults->wait_for_calls(Op::kExtend, 2));
  heartbeat.remove(*lease);
  // An extend already in flight may finish; after that, nothing more.
  std::this_thread::sleep_for(30ms);
  const auto calls = faults->calls(Op::kExtend);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(faults->calls(Op::kExtend), calls);
  EXPECT_FALSE(lease->lost());
}

TEST(HeartbeatTest, RemoveDropsTheHeartbeatsReferenceAtOnce) {
  // A lease that is not being extended leaves the schedule in remove() itself, so its
  // owner's reference is the last one and the lease is freed on the owner's thread.
  idem::MemoryStore store;
  Heartbeat heartbeat(store, nullptr);
  auto lease = acquire(store, "k", 1h, 20min);
  heartbeat.add(lease);
  EXPECT_EQ(lease.use_count(), 2);
  heartbeat.remove(*lease);
  EXPECT_EQ(lease.use_count(), 1);
  heartbeat.remove(*lease);  // idempotent
  EXPECT_EQ(heartbeat.active(), 0u);
}

TEST(HeartbeatTest, LeaseRemovedDuringItsExtendIsDroppedWhenTheStoreReturns) {
  auto faults = std::make_shared<FaultStore>(std::make_shared<idem::MemoryStore>());
  Heartbeat heartbeat(*faults, nullptr);
  auto lease = acquire(*faults, "k", 10s, 20ms);
  faults->pause(Op::kExtend);
  heartbeat.add(lease);
  ASSERT_TRUE(faults->wait_for_blocked(Op::kExtend, 1));
  heartbeat.remove(*lease);
  EXPECT_EQ(heartbeat.active(), 0u);
  faults->resume(Op::kExtend);
  EXPECT_TRUE(eventually([&] { return lease.use_count() == 1; }));
  // Dropped, not rescheduled: no extend follows the one that was in flight.
  const auto calls = faults->calls(Op::kExtend);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(faults->calls(Op::kExtend), calls);
  EXPECT_FALSE(lease->lost());
}

// SPEC §14: while a complete waits in a caller's transaction, the lease is suspended (not
// extended, still counted), and resumed with an extend at once after a rollback.
TEST(HeartbeatTest, SuspendedLeaseIsNotExtendedUntilResumed) {
  auto faults = std::make_shared<FaultStore>(std::make_shared<idem::MemoryStore>());
  Heartbeat heartbeat(*faults, nullptr);
  auto lease = acquire(*faults, "k", 10s, 10ms);
  heartbeat.add(lease);
  ASSERT_TRUE(faults->wait_for_calls(Op::kExtend, 2));
  EXPECT_TRUE(heartbeat.suspend(*lease));
  EXPECT_FALSE(heartbeat.suspend(*lease));  // once
  EXPECT_EQ(heartbeat.active(), 1u);
  // An extend already in flight may finish; after that, nothing more.
  std::this_thread::sleep_for(30ms);
  const auto calls = faults->calls(Op::kExtend);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(faults->calls(Op::kExtend), calls);
  EXPECT_TRUE(heartbeat.resume(lease));
  EXPECT_FALSE(heartbeat.resume(lease));  // not suspended any more
  EXPECT_TRUE(faults->wait_for_calls(Op::kExtend, calls + 2));
  EXPECT_FALSE(lease->lost());
  EXPECT_TRUE(heartbeat.remove(*lease));
  EXPECT_FALSE(heartbeat.resume(lease));  // removed
}

// A lease suspended while its extend is in flight ignores that extend's outcome (a fenced
// one included: the caller's commit made the record COMPLETE), and resumed meanwhile goes
// back on the schedule when the call returns.
TEST(HeartbeatTest, SuspendedDuringItsExtendIgnoresTheOutcome) {
  auto faults = std::make_shared<FaultStore>(std::make_shared<idem::MemoryStore>());
  Heartbeat heartbeat(*faults, nullptr);
  auto lease = acquire(*faults, "k", 10s, 20ms);
  faults->pause(Op::kExtend);
  heartbeat.add(lease);
  ASSERT_TRUE(faults->wait_for_blocked(Op::kExtend, 1));
  EXPECT_TRUE(heartbeat.suspend(*lease));
  // The record completes behind the extend's back: the extend will be fenced.
  ASSERT_EQ(faults->complete("hb", "k", lease->token(), "done", 1h), idem::WriteResult::kDone);
  faults->resume(Op::kExtend);
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(lease->lost());
  EXPECT_TRUE(heartbeat.remove(*lease));
}

TEST(HeartbeatTest, RemovingLeasesInAnyOrderKeepsTheOthersScheduled) {
  // Leases leave the schedule from every position of the heap; those left keep their
  // places: the short-interval ones keep being extended and none is lost.
  idem::MemoryStore store;
  Heartbeat heartbeat(store, nullptr);
  std::vector<std::shared_ptr<HeartbeatLease>> kept;
  std::vector<std::shared_ptr<HeartbeatLease>> gone;
  for (int i = 0; i < 300; ++i) {
    // Intervals from 30 ms to several minutes interleave short and long deadlines.
    const Duration interval = i % 3 == 0 ? Duration(30 + i % 7) : Duration(60000 + 997 * i);
    auto lease = acquire(store, "k" + std::to_string(i), interval * 3, interval);
    heartbeat.add(lease);
    (i % 2 == 0 ? kept : gone).push_back(std::move(lease));
  }
  // Remove in a scrambled but fixed order.
  for (std::size_t i = 0; i < gone.size(); ++i) {
    heartbeat.remove(*gone[(i * 67) % gone.size()]);
  }
  EXPECT_EQ(heartbeat.active(), kept.size());
  // A lease removed while being extended is dropped when its store call returns.
  EXPECT_TRUE(eventually([&] {
    for (const auto& lease : gone) {
      if (lease.use_count() != 1) return false;
    }
    return true;
  }));
  ASSERT_TRUE(eventually([&] {
    for (const auto& lease : kept) {
      if (lease->interval() < 1s && lease->extends() < 2) return false;
    }
    return true;
  }));
  for (const auto& lease : kept) {
    EXPECT_FALSE(lease->lost());
    EXPECT_TRUE(live_in_store(store, *lease));
    heartbeat.remove(*lease);
  }
  EXPECT_EQ(heartbeat.active(), 0u);
}

TEST(HeartbeatTest, DestructorStopsPromptlyWithLeasesRegistered) {
  idem::MemoryStore store;
  auto lease = acquire(store, "k", 1h, 20min);
  auto done = std::async(std::launch::async, [&] {
    Heartbeat heartbeat(store, nullptr);
    heartbeat.add(lease);
    // The thread now sleeps until the lease is due in 20 minutes.
    std::this_thread::sleep_for(20ms);
  });
  EXPECT_EQ(done.wait_for(kEventually), std::future_status::ready);
}

TEST(HeartbeatTest, ManyShortLivedLeasesKeepTheScheduleSmall) {
  // Leases removed long before they are due are dropped from the schedule without the
  // thread having to wake up for each; the live one keeps being extended.
  idem::MemoryStore store;
  Heartbeat heartbeat(store, nullptr);
  auto keeper = acquire(store, "keeper", 300ms, 100ms);
  heartbeat.add(keeper);
  for (int i = 0; i < 20000; ++i) {
    auto lease = acquire(store, "short" + std::to_string(i % 100), 1h, 20min);
    heartbeat.add(lease);
    heartbeat.remove(*lease);
    (void)store.release(lease->scope(), lease->key(), lease->token());
  }
  EXPECT_EQ(heartbeat.active(), 1u);
  ASSERT_TRUE(eventually([&] { return keeper->extends() >= 2; }));
  EXPECT_TRUE(live_in_store(store, *keeper));
  heartbeat.remove(*keeper);
}

// Sanitizer and unoptimised builds run the store 10-20 times slower, and on a loaded
// 2-core machine one thread could not then keep up with 100,000 extends a second. They keep
// the 10,000 leases but make each lease longer, so the thread needs a third of the extends
// and every lease keeps the same two intervals of slack.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !defined(NDEBUG)
constexpr Duration kScaleLease{1000};
#else
constexpr Duration kScaleLease{300};
#endif

// Records the size of every extend_many batch it is given.
class BatchRecordingStore : public idem::StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  std::vector<std::size_t> batches() const {
    std::lock_guard lock(mu_);
    return batches_;
  }

 protected:
  std::vector<idem::ExtendResult> do_extend_many(
      std::span<const idem::ExtendRequest> requests) override {
    {
      std::lock_guard lock(mu_);
      batches_.push_back(requests.size());
    }
    return StoreWrapper::do_extend_many(requests);
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::size_t> batches_;
};

// Leases due together are extended in one Store::extend_many call, so a networked store
// pays one round trip for them, not one each.
TEST(HeartbeatTest, LeasesDueTogetherAreExtendedInOneBatch) {
  auto store = std::make_shared<BatchRecordingStore>(std::make_shared<idem::MemoryStore>());
  Heartbeat heartbeat(*store, nullptr);
  std::vector<std::shared_ptr<HeartbeatLease>> leases;
  for (int i = 0; i < 50; ++i) {
    leases.push_back(acquire(*store, "batch-" + std::to_string(i), 3s, 200ms));
  }
  for (const auto& lease : leases) heartbeat.add(lease);
  ASSERT_TRUE(eventually([&] {
    for (const auto& lease : leases) {
      if (lease->extends() < 2) return false;
    }
    return true;
  }));
  for (const auto& lease : leases) heartbeat.remove(*lease);
  const std::vector<std::size_t> batches = store->batches();
  std::size_t extended = 0;
  std::size_t largest = 0;
  for (const std::size_t b : batches) {
    extended += b;
    largest = std::max(largest, b);
  }
  // 50 leases added within a few milliseconds of each other, each extended at least twice:
  // far fewer calls than extends, and at least one call carried many leases.
  EXPECT_GE(extended, 100u);
  EXPECT_LT(batches.size(), extended / 4) << "calls: " << batches.size();
  EXPECT_GE(largest, 25u);
}

// A batch that fails as a whole leaves every lease of it scheduled for a retry; none is
// lost while its local deadline is ahead.
TEST(HeartbeatTest, FailedBatchIsRetriedForEveryLease) {
  auto memory = std::make_shared<idem::MemoryStore>();
  auto faults = std::make_shared<FaultStore>(memory);
  std::atomic<int> errors{0};
  Heartbeat heartbeat(*faults, [&](const std::exception&) { ++errors; });
  std::vector<std::shared_ptr<HeartbeatLease>> leases;
  for (int i = 0; i < 10; ++i) {
    leases.push_back(acquire(*faults, "retry-" + std::to_string(i), 10s, 100ms));
  }
  faults->fail_next(Op::kExtend, 1);
  for (const auto& lease : leases) heartbeat.add(lease);
  ASSERT_TRUE(eventually([&] {
    for (const auto& lease : leases) {
      if (lease->extends() < 1) return false;
    }
    return true;
  }));
  for (const auto& lease : leases) heartbeat.remove(*lease);
  EXPECT_GE(errors.load(), 1);
  for (const auto& lease : leases) EXPECT_FALSE(lease->lost());
}

// SPEC §7: one heartbeat thread serves every in-flight lease. 10,000 leases extended every
// lease / 3, for five lease durations: not one may lapse. A lease is lost only if its
// extend comes two intervals late.
TEST(HeartbeatTest, OneThreadKeepsTenThousandLeasesAlive) {
  constexpr int kLeases = 10000;
  idem::MemoryStore store;
  std::atomic<int> errors{0};
  Heartbeat heartbeat(store, [&](const std::exception&) { ++errors; });
  std::vector<std::shared_ptr<HeartbeatLease>> leases;
  leases.reserve(kLeases);
  for (int i = 0; i < kLeases; ++i) {
    leases.push_back(acquire(store, "lease-" + std::to_string(i), kScaleLease, kScaleLease / 3));
    heartbeat.add(leases.back());
  }
  EXPECT_EQ(heartbeat.active(), static_cast<std::size_t>(kLeases));
  std::this_thread::sleep_for(kScaleLease * 5);
  // Looked at while the heartbeat still runs: every record is still ours and live.
  int not_live = 0;
  int lost = 0;
  std::uint64_t extends = 0;
  for (const auto& lease : leases) {
    not_live += live_in_store(store, *lease) ? 0 : 1;
    lost += lease->lost() ? 1 : 0;
    extends += lease->extends();
  }
  for (const auto& lease : leases) heartbeat.remove(*lease);
  EXPECT_EQ(not_live, 0);
  EXPECT_EQ(lost, 0);
  EXPECT_EQ(errors.load(), 0);
  // About 15 extends each; at least several lease durations' worth happened.
  EXPECT_GE(extends, static_cast<std::uint64_t>(kLeases) * 5);
  EXPECT_EQ(heartbeat.active(), 0u);
}

}  // namespace
