// Executor::begin and AttemptHandle (SPEC §5, §7): what only the begin/complete form can do.
// Everything the two forms share (replay, busy, waiting, steal, lost leases, fencing,
// fingerprints, the payload limit, errors) runs in both forms in executor_test.cpp.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/executor.h"
#include "idem/stores/memory_store.h"
#include "idem/testing/fault_store.h"
#include "idem/testing/matchers.h"
#include "idem/testing/store_fixtures.h"
#include "support/eventually.h"

namespace {

using namespace std::chrono_literals;
using idem::Attempt;
using idem::AttemptHandle;
using idem::BeginKind;
using idem::CallOptions;
using idem::ErrorCode;
using idem::Executor;
using idem::ExecutorOptions;
using idem::WaitPolicy;
using idem::testing::eventually;
using idem::testing::FaultStore;
using idem::testing::IsAcquired;
using idem::testing::IsCompleteWith;
using idem::testing::IsInProgressWith;
using idem::testing::kEventually;
using idem::testing::Op;
using idem::testing::ThrowsIdem;

class AttemptHandleTest : public idem::testing::ManualClockStoreTest {};
class AttemptHandleRealTimeTest : public idem::testing::SystemClockStoreTest {};

// begin() on a key expected to be free; fails the test otherwise.
AttemptHandle<> acquire(Executor& exec, std::string_view scope, std::string_view key,
                        const CallOptions& call = {}) {
  auto begun = exec.begin(scope, key, call);
  if (begun.handle() == nullptr) {
    ADD_FAILURE() << "begin did not acquire " << key;
    return {};
  }
  return std::move(*begun.handle());
}

const WaitPolicy kWaitLong{.max_wait = 1h, .initial_backoff = 1ms, .max_backoff = 1ms};

// --- what begin answers -----------------------------------------------------------------

TEST_F(AttemptHandleTest, BeginOnAFreeKeyHoldsTheLeaseAndRunsNothing) {
  Executor exec(store_);
  auto begun = exec.begin("s", "k");
  ASSERT_EQ(begun.kind(), BeginKind::kAcquired);
  EXPECT_EQ(begun.replay(), nullptr);
  EXPECT_EQ(begun.busy(), nullptr);
  AttemptHandle handle = std::move(*begun.handle());
  EXPECT_TRUE(handle.active());
  EXPECT_EQ(handle.scope(), "s");
  EXPECT_EQ(handle.key(), "k");
  EXPECT_EQ(handle.number(), 1u);
  EXPECT_FALSE(handle.stolen());
  EXPECT_FALSE(handle.lease_lost());
  EXPECT_EQ(handle.attempt().token(), handle.token());
  EXPECT_THAT(memory_->get("s", "k"), IsInProgressWith(handle.token()));
  EXPECT_EQ(exec.active_leases(), 1u);

  auto r = handle.complete("v");
  EXPECT_FALSE(r.replayed);
  EXPECT_EQ(r.value, "v");
  EXPECT_FALSE(handle.active());
  // The lease's facts outlive the handle's end, for logging.
  EXPECT_THAT(memory_->get("s", "k"), IsCompleteWith(handle.token()));
  EXPECT_EQ(exec.active_leases(), 0u);
}

TEST_F(AttemptHandleTest, BeginOnACompletedKeyReplays) {
  Executor exec(store_);
  (void)exec.run("s", "k", [](const Attempt&) { return std::string("first"); });
  auto begun = exec.begin("s", "k");
  ASSERT_EQ(begun.kind(), BeginKind::kReplay);
  EXPECT_TRUE(begun.replay()->replayed);
  EXPECT_EQ(begun.replay()->value, "first");
  EXPECT_EQ(exec.active_leases(), 0u);
}

TEST_F(AttemptHandleTest, BeginOnABusyKeyAnswersInsteadOfThrowing) {
  auto owner = memory_->acquire("s", "k", 60s, 1h);
  ASSERT_THAT(owner, IsAcquired());
  Executor exec(store_);
  auto begun = exec.begin("s", "k");
  ASSERT_EQ(begun.kind(), BeginKind::kBusy);
  EXPECT_EQ(begun.busy()->lease_expires_at, std::get<idem::Acquired>(owner).lease.lease_expires_at);
  EXPECT_EQ(begun.busy()->lease_remaining, 60s);  // the fake clock did not move
  EXPECT_EQ(store_->calls(Op::kAcquire), 1u);
}

TEST_F(AttemptHandleTest, BeginWaitsUnderItsPolicyBeforeAnsweringBusy) {
  ASSERT_THAT(memory_->acquire("s", "k", 60s, 1h), IsAcquired());
  Executor exec(store_);
  auto begun =
      exec.begin("s", "k",
                 CallOptions{.wait = WaitPolicy{
                                 .max_wait = 50ms, .initial_backoff = 5ms, .max_backoff = 10ms}});
  EXPECT_EQ(begun.kind(), BeginKind::kBusy);
  EXPECT_GE(store_->calls(Op::kAcquire), 2u);
  EXPECT_EQ(exec.waiting_duplicates(), 0u);
}

TEST_F(AttemptHandleTest, BeginOnAKeyHeldByAnOpenHandleAnswersBusyAfterOneStoreCall) {
  Executor exec(store_);
  AttemptHandle first = acquire(exec, "s", "k");
  const auto calls_before = store_->total_calls();
  auto second = exec.begin("s", "k");
  ASSERT_EQ(second.kind(), BeginKind::kBusy);
  EXPECT_EQ(second.busy()->lease_expires_at, memory_->get("s", "k")->lease_expires_at);
  EXPECT_EQ(store_->total_calls(), calls_before + 1);  // the first ask (issue 36), no poll
  (void)first.complete("v");
}

TEST_F(AttemptHandleTest, BeginWithADifferentFingerprintFromAnOpenHandleIsKeyReuse) {
  Executor exec(store_);
  AttemptHandle first = acquire(exec, "s", "k", CallOptions{.fingerprint = "A"});
  EXPECT_THAT([&] { (void)exec.begin("s", "k", CallOptions{.fingerprint = "B"}); },
              ThrowsIdem(ErrorCode::kKeyReuse));
  auto same = exec.begin("s", "k", CallOptions{.fingerprint = "A"});
  EXPECT_EQ(same.kind(), BeginKind::kBusy);
}

// --- in-process duplicates wait on a handle in memory -----------------------------------

TEST_F(AttemptHandleTest, DuplicateWaitsInMemoryForAHandleCompletedOnAnotherThread) {
  Executor exec(store_);
  AttemptHandle handle = acquire(exec, "s", "k");
  auto duplicate = std::async(std::launch::async, [&] {
    return exec.run(
        "s", "k", [](const Attempt&) { return std::string("dup"); },
        CallOptions{.wait = kWaitLong});
  });
  ASSERT_TRUE(eventually([&] { return exec.waiting_duplicates() == 1; }));
  std::thread([h = std::move(handle)]() mutable { (void)h.complete("from the handle"); }).join();
  auto r = duplicate.get();
  EXPECT_TRUE(r.replayed);
  EXPECT_EQ(r.value, "from the handle");
  // SPEC §7: the duplicate asked the store once (issue 36: the store is asked before an
  // in-process owner is followed) and never polled it; with a 1 ms backoff it would have.
  EXPECT_EQ(store_->calls(Op::kAcquire), 2u);
}

TEST_F(AttemptHandleTest, DuplicateBeginAcquiresWhenTheHandleIsReleased) {
  Executor exec(store_);
  AttemptHandle handle = acquire(exec, "s", "k");
  auto duplicate = std::async(std::launch::async, [&] {
    auto begun = exec.begin("s", "k", CallOptions{.wait = kWaitLong});
    return begun.handle() ? std::move(*begun.handle()) : AttemptHandle<>();
  });
  ASSERT_TRUE(eventually([&] { return exec.waiting_duplicates() == 1; }));
  handle.release();
  AttemptHandle next = duplicate.get();
  ASSERT_TRUE(next.active());
  // SPEC §4: a released key looks never used.
  EXPECT_EQ(next.number(), 1u);
  EXPECT_FALSE(next.stolen());
  EXPECT_GT(next.token(), handle.token());
}

// --- ending a handle --------------------------------------------------------------------

TEST_F(AttemptHandleTest, DroppedHandleReleasesTheKeyForTheNextCaller) {
  Executor exec(store_);
  {
    auto begun = exec.begin("s", "k");
    ASSERT_NE(begun.handle(), nullptr);
  }
  EXPECT_FALSE(memory_->get("s", "k").has_value());
  EXPECT_EQ(store_->calls(Op::kRelease), 1u);
  EXPECT_EQ(exec.active_leases(), 0u);
  AttemptHandle next = acquire(exec, "s", "k");
  EXPECT_EQ(next.number(), 1u);
  EXPECT_FALSE(next.stolen());
}

TEST_F(AttemptHandleTest, ReleaseEndsTheHandleOnce) {
  Executor exec(store_);
  AttemptHandle handle = acquire(exec, "s", "k");
  handle.release();
  EXPECT_FALSE(handle.active());
  EXPECT_FALSE(memory_->get("s", "k").has_value());
  EXPECT_EQ(exec.active_leases(), 0u);
  handle.release();
  EXPECT_EQ(store_->calls(Op::kRelease), 1u);
  EXPECT_THROW((void)handle.complete("too late"), std::logic_error);
  EXPECT_EQ(store_->calls(Op::kComplete), 0u);
}

TEST_F(AttemptHandleTest, CompletingTwiceIsALogicError) {
  Executor exec(store_);
  AttemptHandle handle = acquire(exec, "s", "k");
  (void)handle.complete("v");
  EXPECT_THROW((void)handle.complete("w"), std::logic_error);
  EXPECT_EQ(store_->calls(Op::kComplete), 1u);
  EXPECT_EQ(memory_->get("s", "k")->payload, "v");
}

TEST_F(AttemptHandleTest, ReleaseWithTheStoreDownLeavesTheLeaseToExpire) {
  Executor exec(store_, ExecutorOptions{.lease = 10s});
  AttemptHandle handle = acquire(exec, "s", "k");
  store_->fail_next(Op::kRelease);
  handle.release();  // best effort: no exception
  EXPECT_FALSE(handle.active());
  EXPECT_EQ(exec.active_leases(), 0u);
  EXPECT_THAT(memory_->get("s", "k"), IsInProgressWith(handle.token()));
  clock_->advance(10s);
  AttemptHandle next = acquire(exec, "s", "k");
  EXPECT_TRUE(next.stolen());
  EXPECT_EQ(next.number(), 2u);
}

TEST_F(AttemptHandleTest, AbandonLeavesTheKeyHeldUntilTheLeaseRunsOutThenItIsTakenOver) {
  std::atomic<int> abandoned{0};
  Executor exec(store_, ExecutorOptions{.lease = 10s, .on_event = [&](const idem::Event& e) {
                                          if (e.kind == idem::EventKind::kAbandoned) ++abandoned;
                                        }});
  AttemptHandle handle = acquire(exec, "s", "k");
  handle.abandon();
  EXPECT_FALSE(handle.active());
  EXPECT_EQ(abandoned.load(), 1);
  // No store call, and no heartbeat: the record stays as the lease left it.
  EXPECT_EQ(store_->calls(Op::kRelease), 0u);
  EXPECT_EQ(exec.active_leases(), 0u);
  EXPECT_THAT(memory_->get("s", "k"), IsInProgressWith(handle.token()));
  // Until the lease runs out the key is busy, also for a caller in this process.
  auto meanwhile = exec.begin("s", "k");
  ASSERT_EQ(meanwhile.kind(), BeginKind::kBusy);
  EXPECT_EQ(meanwhile.busy()->lease_remaining, 10s);
  clock_->advance(10s);
  AttemptHandle next = acquire(exec, "s", "k");
  EXPECT_TRUE(next.stolen());
  EXPECT_EQ(next.number(), 2u);
  EXPECT_GT(next.token(), handle.token());
  (void)next.complete("v");
}

TEST_F(AttemptHandleTest, AbandonEndsTheHandleOnceAndNothingEndsItAgain) {
  Executor exec(store_);
  AttemptHandle handle = acquire(exec, "s", "k");
  handle.abandon();
  handle.abandon();
  handle.release();
  EXPECT_THROW((void)handle.complete("too late"), std::logic_error);
  EXPECT_EQ(store_->calls(Op::kRelease), 0u);
  EXPECT_EQ(store_->calls(Op::kComplete), 0u);
  EXPECT_THAT(memory_->get("s", "k"), IsInProgressWith(handle.token()));
  // And an ended handle ignores abandon: the completed record stays.
  AttemptHandle other = acquire(exec, "s", "other");
  (void)other.complete("v");
  other.abandon();
  EXPECT_THAT(memory_->get("s", "other"), IsCompleteWith(other.token()));
}

TEST_F(AttemptHandleTest, DuplicateWaitingOnAnAbandonedHandleTakesTheKeyOverWhenTheLeaseRunsOut) {
  Executor exec(store_, ExecutorOptions{.lease = 10s});
  AttemptHandle handle = acquire(exec, "s", "k");
  auto duplicate = std::async(std::launch::async, [&] {
    auto begun = exec.begin("s", "k", CallOptions{.wait = kWaitLong});
    return begun.handle() ? std::move(*begun.handle()) : AttemptHandle<>();
  });
  ASSERT_TRUE(eventually([&] { return exec.waiting_duplicates() == 1; }));
  const auto acquires = store_->calls(Op::kAcquire);
  handle.abandon();
  // Back to the store, which answers busy: the abandoned lease still holds the key.
  ASSERT_TRUE(eventually([&] { return store_->calls(Op::kAcquire) > acquires + 1; }));
  EXPECT_THAT(memory_->get("s", "k"), IsInProgressWith(handle.token()));
  clock_->advance(10s);
  AttemptHandle next = duplicate.get();
  ASSERT_TRUE(next.active());
  EXPECT_TRUE(next.stolen());
  EXPECT_EQ(next.number(), 2u);
}

TEST_F(AttemptHandleTest, MovedFromAndDefaultHandlesAreEmpty) {
  Executor exec(store_);
  AttemptHandle<> empty;
  EXPECT_FALSE(empty.active());
  EXPECT_FALSE(static_cast<bool>(empty));
  empty.release();
  EXPECT_THROW((void)empty.complete("v"), std::logic_error);
  EXPECT_THROW((void)empty.token(), std::logic_error);

  AttemptHandle first = acquire(exec, "s", "k");
  AttemptHandle second = std::move(first);
  EXPECT_FALSE(first.active());  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_TRUE(second.active());
  first.release();
  EXPECT_THAT(memory_->get("s", "k"), IsInProgressWith(second.token()));
  EXPECT_EQ(second.complete("v").value, "v");
}

TEST_F(AttemptHandleTest, MoveAssigningOverAnOpenHandleReleasesItsLease) {
  Executor exec(store_);
  AttemptHandle a = acquire(exec, "s", "a");
  AttemptHandle b = acquire(exec, "s", "b");
  a = std::move(b);
  EXPECT_FALSE(memory_->get("s", "a").has_value());
  EXPECT_EQ(a.key(), "b");
  EXPECT_EQ(exec.active_leases(), 1u);
  (void)a.complete("v");
  EXPECT_EQ(memory_->get("s", "b")->payload, "v");
}

// --- typed handles ----------------------------------------------------------------------

struct Receipt {
  long cents = 0;
};

}  // namespace

template <>
struct idem::Codec<Receipt> {
  static std::string encode(const Receipt& r) { return std::to_string(r.cents); }
  static Receipt decode(std::string_view bytes) { return Receipt{std::stol(std::string(bytes))}; }
};

namespace {

TEST_F(AttemptHandleTest, TypedBeginEncodesTheResultAndDecodesTheReplay) {
  Executor exec(store_);
  auto begun = exec.begin<Receipt>("s", "k");
  ASSERT_NE(begun.handle(), nullptr);
  auto r = begun.handle()->complete(Receipt{1299});
  EXPECT_FALSE(r.replayed);
  EXPECT_EQ(r.value.cents, 1299);
  EXPECT_EQ(memory_->get("s", "k")->payload, "1299");
  auto again = exec.begin<Receipt>("s", "k");
  ASSERT_EQ(again.kind(), BeginKind::kReplay);
  EXPECT_TRUE(again.replay()->replayed);
  EXPECT_EQ(again.replay()->value.cents, 1299);
}

// --- threads and the heartbeat ----------------------------------------------------------

TEST_F(AttemptHandleRealTimeTest, HandleMovedBetweenThreadsKeepsItsLeaseAlive) {
  Executor exec(store_, ExecutorOptions{.lease = 300ms});
  AttemptHandle handle = acquire(exec, "s", "k");
  // Three threads hold the handle in turn, each until the heartbeat has extended it again.
  for (int i = 0; i < 3; ++i) {
    handle = std::async(std::launch::async, [&, h = std::move(handle)]() mutable {
               EXPECT_TRUE(store_->wait_for_calls(Op::kExtend, store_->calls(Op::kExtend) + 1));
               return std::move(h);
             }).get();
  }
  EXPECT_FALSE(handle.lease_lost());
  auto r = std::async(std::launch::async, [h = std::move(handle)]() mutable {
             return h.complete("moved");
           }).get();
  EXPECT_EQ(r.value, "moved");
  EXPECT_EQ(memory_->get("s", "k")->payload, "moved");
  EXPECT_EQ(exec.active_leases(), 0u);
}

TEST_F(AttemptHandleRealTimeTest, ThousandsOfOpenHandlesShareOneHeartbeatAndNoneIsLost) {
  constexpr std::size_t kHandles = 2000;
  Executor exec(store_, ExecutorOptions{.lease = 1s, .heartbeat = 100ms});
  std::vector<AttemptHandle<>> handles;
  handles.reserve(kHandles);
  for (std::size_t i = 0; i < kHandles; ++i) {
    handles.push_back(acquire(exec, "many", std::to_string(i)));
  }
  EXPECT_EQ(exec.active_leases(), kHandles);
  // Two rounds of extends for all of them while every handle is open.
  ASSERT_TRUE(store_->wait_for_calls(Op::kExtend, 2 * kHandles, kEventually));
  std::size_t lost = 0;
  for (auto& h : handles) lost += h.lease_lost() ? 1 : 0;
  EXPECT_EQ(lost, 0u);
  for (auto& h : handles) (void)h.complete(std::string(h.key()));
  EXPECT_EQ(exec.active_leases(), 0u);
  for (std::size_t i = 0; i < kHandles; i += 397) {
    EXPECT_EQ(memory_->get("many", std::to_string(i))->payload, std::to_string(i));
  }
}

// SPEC §6: a store that fails for a while, then comes back.
TEST_F(AttemptHandleTest, HandleKeepsItsLeaseThroughAShortStoreOutage) {
  std::atomic<int> errors{0};
  // Extends every 50 ms of a 10 s lease: a few failed beats stay far from the deadline.
  Executor exec(store_,
                ExecutorOptions{.lease = 10s,
                                .heartbeat = 50ms,
                                .on_heartbeat_error = [&](const std::exception&) { ++errors; }});
  AttemptHandle handle = acquire(exec, "s", "k");
  store_->fail_always(Op::kExtend);
  ASSERT_TRUE(eventually([&] { return errors.load() >= 3; }));
  store_->fail_always(Op::kExtend, false);
  const auto errors_then = errors.load();
  const auto calls = store_->calls(Op::kExtend);
  ASSERT_TRUE(store_->wait_for_calls(Op::kExtend, calls + 2));
  EXPECT_LE(errors.load(), errors_then + 1);  // at most one failure was still in flight
  EXPECT_FALSE(handle.lease_lost());
  EXPECT_EQ(handle.complete("kept").value, "kept");
  EXPECT_THAT(memory_->get("s", "k"), IsCompleteWith(handle.token()));
}

// A handle whose extends fail until its lease is lost by the heartbeat's own clock; the
// store then works again.
AttemptHandle<> lose_to_an_outage(Executor& exec, FaultStore& store) {
  AttemptHandle handle = acquire(exec, "s", "k");
  store.fail_always(Op::kExtend);
  EXPECT_TRUE(eventually([&] { return handle.lease_lost(); }));
  // The heartbeat marks the lease lost before it requests the stop (so a stop callback
  // sees lease_lost()): the stop follows on the heartbeat's thread, a moment later.
  EXPECT_TRUE(eventually([&] { return handle.stop_token().stop_requested(); }));
  store.fail_always(Op::kExtend, false);
  return handle;
}

TEST_F(AttemptHandleTest, HandleLosesItsLeaseToALongOutageAndStillCompletesIfNobodyTookOver) {
  Executor exec(store_, ExecutorOptions{.lease = 300ms});
  AttemptHandle handle = lose_to_an_outage(exec, *store_);
  // SPEC §4: nobody stole the lease, so the owner still holds the token and may complete.
  EXPECT_EQ(handle.complete("late but recorded").value, "late but recorded");
  EXPECT_THAT(memory_->get("s", "k"), IsCompleteWith(handle.token()));
}

TEST_F(AttemptHandleTest, HandleWhoseKeyWasTakenOverDuringAnOutageIsFencedAtComplete) {
  Executor exec(store_, ExecutorOptions{.lease = 300ms});
  AttemptHandle handle = lose_to_an_outage(exec, *store_);
  clock_->advance(1s);
  auto thief = memory_->acquire("s", "k", 60s, 1h);
  ASSERT_THAT(thief, idem::testing::IsStolen(2));
  EXPECT_THAT([&] { (void)handle.complete("stale"); }, ThrowsIdem(ErrorCode::kLeaseLost));
  EXPECT_FALSE(handle.active());
  EXPECT_THAT(memory_->get("s", "k"),
              IsInProgressWith(std::get<idem::Acquired>(thief).lease.token));
}

// Issue 36: a complete that the store fences loses the lease: lease_lost() reads true and
// the stop token is requested afterwards, as when the heartbeat finds the lease lost.
TEST_F(AttemptHandleTest, AFencedCompleteMarksTheLeaseLost) {
  Executor exec(store_, ExecutorOptions{.lease = 60s});
  auto begun = exec.begin("s", "k");
  AttemptHandle<>& handle = *begun.handle();
  ASSERT_FALSE(handle.lease_lost());
  ASSERT_TRUE(memory_->forget("s", "k"));
  try {
    (void)handle.complete("fenced");
    ADD_FAILURE() << "a complete on a forgotten record was recorded";
  } catch (const idem::LeaseLost& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("the record was deleted"));
  }
  EXPECT_TRUE(handle.lease_lost());
  EXPECT_TRUE(handle.stop_token().stop_requested());
  EXPECT_THROW(handle.throw_if_lost(), idem::LeaseLost);
  // The key acquired afresh by another caller after the record went: not "expired".
  auto second = exec.begin("s", "k2");
  ASSERT_TRUE(memory_->forget("s", "k2"));
  ASSERT_THAT(memory_->acquire("s", "k2", 60s, 1h), idem::testing::IsAcquired());
  try {
    (void)second.handle()->complete("fenced");
    ADD_FAILURE() << "a complete on a record acquired afresh was recorded";
  } catch (const idem::LeaseLost& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("acquired the key afresh"));
    EXPECT_THAT(e.what(), ::testing::Not(::testing::HasSubstr("expired")));
  }
}

// Many threads begin and end handles on overlapping keys, ending them every way there is:
// complete or release on the same thread, drop, or hand them to a queue consumer that ends
// them on its own thread. Run under ThreadSanitizer by scripts/test.sh.
TEST_F(AttemptHandleTest, ManyThreadsBeginAndEndHandlesOnOverlappingKeys) {
  constexpr int kThreads = 6;
  constexpr int kIterations = 240;
  // The threads share a window of a few keys that moves every kPerWindow iterations, so
  // most calls meet a key that other threads hold, wait on or just ended.
  constexpr int kPerWindow = 20;
  constexpr int kKeysPerWindow = 4;
  Executor exec(store_, ExecutorOptions{.lease = 5s});

  struct Work {
    AttemptHandle<> handle;
    bool complete;
    std::string value;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Work> queue;
  bool closing = false;
  std::map<std::string, std::vector<std::string>> fresh;    // guarded by mu
  std::map<std::string, std::vector<std::string>> replays;  // guarded by mu
  std::atomic<int> errors{0};

  auto completed = [&](const std::string& key, idem::Result<std::string> r) {
    std::lock_guard lock(mu);
    (r.replayed ? replays : fresh)[key].push_back(std::move(r.value));
  };
  auto end = [&](Work w) {
    try {
      if (!w.complete) {
        w.handle.release();
        return;
      }
      const std::string key(w.handle.key());
      completed(key, w.handle.complete(w.value));
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
      ++errors;
    }
  };
  std::thread consumer([&] {
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return closing || !queue.empty(); });
      if (queue.empty()) return;
      Work w = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      end(std::move(w));
      lock.lock();
    }
  });

  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::minstd_rand rng(static_cast<unsigned>(t) + 1);
      start.arrive_and_wait();
      for (int i = 0; i < kIterations; ++i) {
        const std::string key =
            std::to_string(i / kPerWindow) + "/" + std::to_string(rng() % kKeysPerWindow);
        const CallOptions call =
            rng() % 2
                ? CallOptions{}
                : CallOptions{.wait = WaitPolicy{
                                  .max_wait = 20ms, .initial_backoff = 1ms, .max_backoff = 2ms}};
        try {
          auto begun = exec.begin("stress", key, call);
          if (auto* r = begun.replay()) {
            completed(key, std::move(*r));
            continue;
          }
          if (begun.busy()) continue;
          Work w{std::move(*begun.handle()), false,
                 key + "/" + std::to_string(t) + "/" + std::to_string(i)};
          // One in eight handles completes, so a key sees several owners before it does.
          const auto how = rng() % 16;
          if (how == 0) {
            w.complete = true;
            end(std::move(w));
          } else if (how < 6) {
            end(std::move(w));
          } else if (how < 8) {
            // Dropped: the handle's destructor releases.
          } else {
            w.complete = how == 8;
            {
              std::lock_guard lock(mu);
              queue.push_back(std::move(w));
            }
            cv.notify_one();
          }
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
          ++errors;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  {
    std::lock_guard lock(mu);
    closing = true;
  }
  cv.notify_one();
  consumer.join();

  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(exec.active_leases(), 0u);
  EXPECT_EQ(exec.waiting_duplicates(), 0u);
  int completions = 0;
  for (int k = 0; k < kIterations / kPerWindow * kKeysPerWindow; ++k) {
    const std::string key =
        std::to_string(k / kKeysPerWindow) + "/" + std::to_string(k % kKeysPerWindow);
    const auto record = memory_->get("stress", key);
    // At most once: one completion per key, and every replay is that completion's result.
    ASSERT_LE(fresh[key].size(), 1u) << key;
    if (fresh[key].empty()) {
      EXPECT_FALSE(record.has_value()) << key;  // every handle that did not complete released
      EXPECT_TRUE(replays[key].empty()) << key;
      continue;
    }
    ++completions;
    ASSERT_TRUE(record.has_value()) << key;
    EXPECT_EQ(record->payload, fresh[key][0]) << key;
    for (const auto& v : replays[key]) EXPECT_EQ(v, fresh[key][0]) << key;
  }
  EXPECT_GT(completions, 0);
}

}  // namespace
