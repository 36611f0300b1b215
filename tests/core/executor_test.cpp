// The executor (SPEC §5, §7): replays, waiting, the heartbeat as the action sees it, lost
// leases, errors and validation. Time-dependent cases use a ManualClock; the few that need
// the heartbeat to run for real use short leases on the system clock and wait for events
// with generous bounds, never asserting how long something took.

#include "idem/executor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <future>
#include <latch>
#include <stop_token>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "idem/clock.h"
#include "idem/store_wrapper.h"
#include "idem/stores/memory_store.h"
#include "support/eventually.h"
#include "idem/testing/fault_store.h"
#include "support/gate.h"
#include "idem/testing/matchers.h"
#include "idem/testing/store_fixtures.h"

namespace {

using namespace std::chrono_literals;
using idem::Attempt;
using idem::CallOptions;
using idem::Duration;
using idem::ErrorCode;
using idem::Executor;
using idem::ExecutorOptions;
using idem::WaitPolicy;
using idem::testing::eventually;
using idem::testing::FaultStore;
using idem::testing::Gate;
using idem::testing::kEventually;
using idem::testing::IsAcquired;
using idem::testing::IsBusy;
using idem::testing::IsCompleteWith;
using idem::testing::IsInProgressWith;
using idem::testing::Op;
using idem::testing::ThrowsIdem;


// Waits (boundedly) for the lease to be lost, as a cooperative action would.
bool wait_for_lost(const Attempt& attempt) {
  return eventually([&] { return attempt.lease_lost(); });
}

// Threads of this process. The first call starts and joins a thread, so that helper
// threads some runtimes start with the first thread (ThreadSanitizer's) are already counted.
std::size_t thread_count() {
  static const bool warmed_up = [] {
    std::thread([] {}).join();
    return true;
  }();
  (void)warmed_up;
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

class ExecutorTest : public idem::testing::ManualClockStoreTest {};
class ExecutorRealTimeTest : public idem::testing::SystemClockStoreTest {};

// Every test that applies runs in both forms of a call (issue 11): run(), and begin() with
// the action run on a thread of its own that takes the handle over and ends it there, as a
// queue consumer would. Both forms must behave the same in every test.
enum class Form { kRun, kBegin };

std::string form_name(const ::testing::TestParamInfo<Form>& info) {
  return info.param == Form::kRun ? "Run" : "BeginComplete";
}

template <typename T, typename F>
idem::Result<T> call_in(Form form, Executor& exec, std::string_view scope, std::string_view key,
                        F&& action, const CallOptions& options) {
  if (form == Form::kRun) return exec.run<T>(scope, key, std::forward<F>(action), options);
  auto begun = exec.begin<T>(scope, key, options);
  if (auto* replay = begun.replay()) return std::move(*replay);
  if (const auto* busy = begun.busy()) {
    // What run() throws for the same answer, so the tests read the same in both forms.
    throw idem::InProgress(busy->lease_expires_at, busy->lease_remaining);
  }
  // If the action throws, the handle's destructor releases on the other thread and the
  // future hands the same exception object back.
  return std::async(std::launch::async, [&action, handle = std::move(*begun.handle())]() mutable {
           T value(action(handle.attempt()));
           return handle.complete(std::move(value));
         })
      .get();
}

template <typename Base>
class FormTest : public Base, public ::testing::WithParamInterface<Form> {
 protected:
  template <typename T = std::string, typename F>
  idem::Result<T> call(Executor& exec, std::string_view scope, std::string_view key, F&& action,
                       const CallOptions& options = {}) {
    return call_in<T>(this->GetParam(), exec, scope, key, std::forward<F>(action), options);
  }
};

class ExecutorFormTest : public FormTest<ExecutorTest> {};
class ExecutorRealTimeFormTest : public FormTest<ExecutorRealTimeTest> {};

INSTANTIATE_TEST_SUITE_P(Forms, ExecutorFormTest, ::testing::Values(Form::kRun, Form::kBegin),
                         form_name);
INSTANTIATE_TEST_SUITE_P(Forms, ExecutorRealTimeFormTest,
                         ::testing::Values(Form::kRun, Form::kBegin), form_name);

// --- results and replays --------------------------------------------------------------

TEST_P(ExecutorFormTest, RunsTheActionAndRecordsItsResult) {
  Executor exec(store_);
  int runs = 0;
  auto r = call(exec, "s", "k", [&](const Attempt&) {
    ++runs;
    return std::string("result");
  });
  EXPECT_EQ(r.value, "result");
  EXPECT_FALSE(r.replayed);
  EXPECT_EQ(runs, 1);
  auto record = memory_->get("s", "k");
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, idem::RecordState::kComplete);
  EXPECT_EQ(record->payload, "result");
}

TEST_P(ExecutorFormTest, DuplicateReplaysTheStoredResultWithoutRunning) {
  Executor exec(store_);
  int runs = 0;
  auto action = [&](const Attempt&) { return "run " + std::to_string(++runs); };
  auto first = call(exec, "s", "k", action);
  auto second = call(exec, "s", "k", action);
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(first.replayed);
  EXPECT_TRUE(second.replayed);
  EXPECT_EQ(second.value, "run 1");
}

TEST_P(ExecutorFormTest, DifferentScopesAreDifferentRecords) {
  Executor exec(store_);
  auto a = call(exec, "a:b", "c", [](const Attempt&) { return std::string("1"); });
  auto b = call(exec, "a", "b:c", [](const Attempt&) { return std::string("2"); });
  EXPECT_FALSE(a.replayed);
  EXPECT_FALSE(b.replayed);
  EXPECT_EQ(b.value, "2");
}

TEST_P(ExecutorFormTest, ExpiredResultIsNotReplayed) {
  Executor exec(store_, ExecutorOptions{.ttl = 1h});
  (void)call(exec, "s", "k", [](const Attempt&) { return std::string("old"); });
  // SPEC §8: a completed record past its TTL is treated as absent.
  clock_->advance(1h + 1ms);
  auto r = call(exec, "s", "k", [](const Attempt&) { return std::string("new"); });
  EXPECT_FALSE(r.replayed);
  EXPECT_EQ(r.value, "new");
}

TEST_P(ExecutorFormTest, ActionSeesItsLease) {
  Executor exec(store_);
  idem::Token seen = 0;
  (void)call(exec, "s", "k", [&](const Attempt& a) {
    seen = a.token();
    EXPECT_EQ(a.number(), 1u);
    EXPECT_FALSE(a.stolen());
    EXPECT_FALSE(a.lease_lost());
    EXPECT_EQ(exec.active_leases(), 1u);
    return std::string();
  });
  EXPECT_EQ(memory_->get("s", "k")->token, seen);
  EXPECT_EQ(exec.active_leases(), 0u);
}

TEST_P(ExecutorFormTest, BinaryKeysAndPayloadsRoundTrip) {
  Executor exec(store_);
  const std::string key("k\0ey", 4);
  const std::string payload("\0\1\2\xff", 4);
  (void)call(exec, "s", key, [&](const Attempt&) { return payload; });
  auto r = call(exec, "s", key, [](const Attempt&) { return std::string("other"); });
  EXPECT_TRUE(r.replayed);
  EXPECT_EQ(r.value, payload);
}

// --- codecs -----------------------------------------------------------------------------

struct Invoice {
  int id = 0;
  std::string memo;
};

}  // namespace

template <>
struct idem::Codec<Invoice> {
  static std::string encode(const Invoice& v) { return std::to_string(v.id) + "|" + v.memo; }
  static Invoice decode(std::string_view bytes) {
    const auto bar = bytes.find('|');
    return Invoice{std::stoi(std::string(bytes.substr(0, bar))),
                   std::string(bytes.substr(bar + 1))};
  }
};

namespace {

TEST_P(ExecutorFormTest, TypedRunUsesTheUserCodec) {
  Executor exec(store_);
  auto first = call<Invoice>(exec, "s", "k", [](const Attempt&) { return Invoice{42, "paid"}; });
  auto second = call<Invoice>(exec, "s", "k", [](const Attempt&) { return Invoice{0, "again"}; });
  EXPECT_EQ(memory_->get("s", "k")->payload, "42|paid");
  EXPECT_FALSE(first.replayed);
  EXPECT_TRUE(second.replayed);
  EXPECT_EQ(second.value.id, 42);
  EXPECT_EQ(second.value.memo, "paid");
}

TEST_P(ExecutorFormTest, ByteVectorCodecRoundTrips) {
  Executor exec(store_);
  const std::vector<std::byte> bytes{std::byte{0}, std::byte{0x7f}, std::byte{0xff}};
  (void)call<std::vector<std::byte>>(exec, "s", "k", [&](const Attempt&) { return bytes; });
  auto r = call<std::vector<std::byte>>(exec, 
      "s", "k", [](const Attempt&) { return std::vector<std::byte>{}; });
  EXPECT_TRUE(r.replayed);
  EXPECT_EQ(r.value, bytes);
}

// --- the action throws ------------------------------------------------------------------

struct PaymentDeclined : std::runtime_error {
  explicit PaymentDeclined(int c) : std::runtime_error("declined"), code(c) {}
  int code;
};

TEST_P(ExecutorFormTest, ThrowingActionReleasesAndRethrowsTheSameObject) {
  Executor exec(store_);
  // The address of the exception object the action throws, to check it is not copied.
  const std::exception_ptr thrown = std::make_exception_ptr(PaymentDeclined(7));
  const void* original = nullptr;
  try {
    std::rethrow_exception(thrown);
  } catch (const PaymentDeclined& e) {
    original = &e;
  }
  try {
    (void)call(exec, "s", "k",
                   [&](const Attempt&) -> std::string { std::rethrow_exception(thrown); });
    FAIL() << "run did not throw";
  } catch (const PaymentDeclined& e) {
    EXPECT_EQ(&e, original);
    EXPECT_EQ(e.code, 7);
  }
  // SPEC §4: a released key looks never used: attempt 1, not stolen.
  EXPECT_FALSE(memory_->get("s", "k").has_value());
  auto next = memory_->acquire("s", "k", 1s, 1h);
  ASSERT_THAT(next, IsAcquired());
  EXPECT_EQ(std::get<idem::Acquired>(next).lease.attempt, 1u);
  EXPECT_FALSE(std::get<idem::Acquired>(next).stolen);
  EXPECT_EQ(exec.active_leases(), 0u);
}

TEST_P(ExecutorFormTest, ThrowingActionKeepsItsTypeWhenNotAStdException) {
  Executor exec(store_);
  EXPECT_THROW((void)call(exec, "s", "k", [](const Attempt&) -> std::string { throw 42; }), int);
  EXPECT_FALSE(memory_->get("s", "k").has_value());
}

TEST_P(ExecutorFormTest, ReleaseFailureStillRethrowsTheActionsException) {
  Executor exec(store_, ExecutorOptions{.lease = 10s});
  store_->fail_next(Op::kRelease);
  EXPECT_THROW(
      (void)call(exec, "s", "k", [](const Attempt&) -> std::string { throw PaymentDeclined(1); }),
      PaymentDeclined);
  // The release was lost, so the lease simply expires and the next caller steals it.
  EXPECT_EQ(memory_->get("s", "k")->state, idem::RecordState::kInProgress);
  clock_->advance(10s);
  auto r = call(exec, "s", "k", [](const Attempt& a) {
    EXPECT_TRUE(a.stolen());
    EXPECT_EQ(a.number(), 2u);
    return std::string("second");
  });
  EXPECT_EQ(r.value, "second");
}

// --- store errors -----------------------------------------------------------------------

TEST_P(ExecutorFormTest, StoreErrorAtAcquireNeverRunsTheAction) {
  Executor exec(store_);
  store_->fail_next(Op::kAcquire);
  bool ran = false;
  EXPECT_THAT(
      [&] {
        (void)call(exec, "s", "k", [&](const Attempt&) {
          ran = true;
          return std::string();
        });
      },
      ThrowsIdem(ErrorCode::kStoreUnavailable));
  EXPECT_FALSE(ran);
  EXPECT_FALSE(memory_->get("s", "k").has_value());
}

TEST_P(ExecutorFormTest, CompleteIsRetriedAfterATransientStoreError) {
  Executor exec(store_);
  store_->fail_next(Op::kComplete);
  auto r = call(exec, "s", "k", [](const Attempt&) { return std::string("v"); });
  EXPECT_EQ(r.value, "v");
  EXPECT_EQ(store_->calls(Op::kComplete), 2u);
  EXPECT_EQ(memory_->get("s", "k")->payload, "v");
}

TEST_P(ExecutorFormTest, CompleteThatKeepsFailingGivesStoreUnavailable) {
  // The lease is 200 ms by our own clock; retries stop once it has passed.
  Executor exec(store_, ExecutorOptions{.lease = 200ms});
  store_->fail_always(Op::kComplete);
  EXPECT_THAT([&] { (void)call(exec, "s", "k", [](const Attempt&) { return std::string("v"); }); },
              ThrowsIdem(ErrorCode::kStoreUnavailable));
  EXPECT_GE(store_->calls(Op::kComplete), 2u);
  EXPECT_EQ(exec.active_leases(), 0u);
}

// --- lost replies (issue 9): the call took effect in the store, the reply never came ---

TEST_P(ExecutorFormTest, LostAcquireReplyNeverRunsTheActionAndTheOrphanLeaseIsStolenLater) {
  Executor exec(store_, ExecutorOptions{.lease = 10s});
  store_->lose_reply_next(Op::kAcquire);
  int runs = 0;
  const auto action = [&](const Attempt&) {
    ++runs;
    return std::string("v");
  };
  // SPEC §5.1: a store error at acquire means the action is not run, even though the store
  // granted a lease that this process never learned of.
  EXPECT_THAT([&] { (void)call(exec, "s", "k", action); },
              ThrowsIdem(ErrorCode::kStoreUnavailable));
  EXPECT_EQ(runs, 0);
  const auto orphan = memory_->get("s", "k");
  ASSERT_TRUE(orphan.has_value());
  ASSERT_EQ(orphan->state, idem::RecordState::kInProgress);

  // A retry sees its own orphaned lease as somebody else's: busy until that lease ends. It
  // cannot tell the lease is its own (it never saw the token), so it must not run.
  try {
    (void)call(exec, "s", "k", action);
    ADD_FAILURE() << "a retry ran while the orphaned lease was live";
  } catch (const idem::InProgress& e) {
    EXPECT_EQ(e.lease_expires_at(), orphan->lease_expires_at);
  }
  EXPECT_EQ(runs, 0);

  // Once the orphan's lease has passed, the next call steals it and runs as attempt 2.
  clock_->advance(10s);
  auto r = call(exec, "s", "k", [&](const Attempt& a) {
    EXPECT_TRUE(a.stolen());
    EXPECT_EQ(a.number(), 2u);
    EXPECT_GT(a.token(), orphan->token);
    return action(a);
  });
  EXPECT_EQ(r.value, "v");
  EXPECT_EQ(runs, 1);
}

TEST_P(ExecutorFormTest, LostCompleteReplyReturnsTheRecordedResult) {
  Executor exec(store_);
  store_->lose_reply_next(Op::kComplete);
  auto r = call(exec, "s", "k", [](const Attempt&) { return std::string("v"); });
  // The record holds the result, so the caller gets it as a fresh result, read back
  // instead of sent again.
  EXPECT_EQ(r.value, "v");
  EXPECT_FALSE(r.replayed);
  EXPECT_EQ(store_->lost_replies(Op::kComplete), 1u);
  EXPECT_EQ(store_->calls(Op::kComplete), 1u);
  EXPECT_GE(store_->calls(Op::kGet), 1u);
  EXPECT_THAT(memory_->get("s", "k"), IsCompleteWith(*r.token));
  auto again = call(exec, "s", "k", [](const Attempt&) -> std::string {
    ADD_FAILURE() << "ran twice";
    return "x";
  });
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.value, "v");
}

TEST_P(ExecutorFormTest, LostCompleteReplyAfterTheStoresLeaseDeadlineStillReturnsTheResult) {
  Executor exec(store_, ExecutorOptions{.lease = 10s});
  auto r = call(exec, "s", "k", [&](const Attempt&) {
    // The process paused past its lease by the store's clock; nobody stole it, so the
    // complete lands (SPEC §4), and only its reply is lost.
    clock_->advance(15s);
    store_->lose_reply_next(Op::kComplete);
    return std::string("late");
  });
  EXPECT_EQ(r.value, "late");
  EXPECT_EQ(memory_->get("s", "k")->payload, "late");
}

TEST_P(ExecutorFormTest, LostCompleteReplyAndFailedReadBackRetryTheCompleteAndReturnTheResult) {
  Executor exec(store_);
  store_->lose_reply_next(Op::kComplete);
  store_->fail_next(Op::kGet);
  auto r = call(exec, "s", "k", [](const Attempt&) { return std::string("v"); });
  // The read-back failed too, so the complete went again: done, as a repeat with the
  // completing token is (SPEC §4), and nothing changed.
  EXPECT_EQ(r.value, "v");
  EXPECT_EQ(store_->calls(Op::kComplete), 2u);
  EXPECT_EQ(memory_->get("s", "k")->payload, "v");
}

// A store that applies every complete but reports the first `n` unconfirmed, as a Redis
// store with wait_replicas does when no replica acknowledged the write: the record reads
// back COMPLETE, and that read proves nothing (StoreUnavailable::unconfirmed).
class UnconfirmedCompletes : public idem::StoreWrapper {
 public:
  UnconfirmedCompletes(std::shared_ptr<idem::Store> target, int n)
      : StoreWrapper(std::move(target)), left_(n) {}
  std::atomic<int> completes{0};
  std::atomic<int> gets{0};

 protected:
  idem::WriteResult do_complete(std::string_view scope, std::string_view key, idem::Token token,
                                std::string_view payload, Duration ttl) override {
    ++completes;
    const idem::WriteResult r = StoreWrapper::do_complete(scope, key, token, payload, ttl);
    if (left_.fetch_sub(1) > 0) {
      throw idem::StoreUnavailable("replicated://", "only 0 of 1 replicas acknowledged the write",
                                   {}, /*unconfirmed=*/true);
    }
    return r;
  }
  std::optional<idem::Record> do_get(std::string_view scope, std::string_view key) override {
    ++gets;
    return StoreWrapper::do_get(scope, key);
  }

 private:
  std::atomic<int> left_;
};

TEST_P(ExecutorFormTest, UnconfirmedCompleteIsRepeatedUntilConfirmedNeverSettledByARead) {
  auto store = std::make_shared<UnconfirmedCompletes>(memory_, 2);
  Executor exec(store, ExecutorOptions{.lease = 10s});
  auto r = call(exec, "s", "k", [](const Attempt&) { return std::string("v"); });
  EXPECT_EQ(r.value, "v");
  EXPECT_FALSE(r.replayed);
  // The record read COMPLETE after the first complete; only the third, confirmed, counted.
  EXPECT_EQ(store->completes.load(), 3);
  EXPECT_EQ(store->gets.load(), 0);
}

TEST_P(ExecutorFormTest, CompleteNeverConfirmedSaysTheResultMayOrMayNotHaveBeenRecorded) {
  auto store = std::make_shared<UnconfirmedCompletes>(memory_, 1 << 30);
  Executor exec(store, ExecutorOptions{.lease = 200ms});
  try {
    (void)call(exec, "s", "k", [](const Attempt&) { return std::string("v"); });
    ADD_FAILURE() << "a result the store never confirmed was reported recorded";
  } catch (const idem::StoreUnavailable& e) {
    EXPECT_TRUE(e.unconfirmed());
    EXPECT_THAT(e.what(), ::testing::HasSubstr("may or may not have been recorded"));
    EXPECT_EQ(e.key(), "k");
  }
  EXPECT_GE(store->completes.load(), 2);
  // A read would have shown it recorded: the record is COMPLETE with this call's token.
  EXPECT_EQ(memory_->get("s", "k")->state, idem::RecordState::kComplete);
}

TEST_P(ExecutorFormTest, FailedCompleteAfterATakeoverGivesLeaseLostWithoutAnotherWrite) {
  Executor exec(store_, ExecutorOptions{.lease = 10s});
  idem::Token thief = 0;
  EXPECT_THAT(
      [&] {
        (void)call(exec, "s", "k", [&](const Attempt&) {
          clock_->advance(15s);
          thief = std::get<idem::Acquired>(memory_->acquire("s", "k", 10s, 1h)).lease.token;
          store_->fail_next(Op::kComplete);
          return std::string("stale");
        });
      },
      ThrowsIdem(ErrorCode::kLeaseLost));
  // The read-back showed another owner: the stale owner is fenced, and its complete is not
  // sent again.
  EXPECT_EQ(store_->calls(Op::kComplete), 1u);
  EXPECT_THAT(memory_->get("s", "k"), IsInProgressWith(thief));
}

TEST_P(ExecutorFormTest, CompleteThatNeverLandsSaysTheResultWasNotRecorded) {
  Executor exec(store_, ExecutorOptions{.lease = 200ms});
  store_->fail_always(Op::kComplete);
  try {
    (void)call(exec, "s", "k", [](const Attempt&) { return std::string("v"); });
    ADD_FAILURE() << "no error";
  } catch (const idem::StoreUnavailable& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("the result was not recorded"));
    EXPECT_EQ(e.key(), "k");
  }
  EXPECT_EQ(memory_->get("s", "k")->state, idem::RecordState::kInProgress);
}

TEST_P(ExecutorFormTest, CompleteWhoseOutcomeStaysUnknownSaysSo) {
  Executor exec(store_, ExecutorOptions{.lease = 200ms});
  store_->lose_reply_always(Op::kComplete);
  store_->fail_always(Op::kGet);
  try {
    (void)call(exec, "s", "k", [](const Attempt&) { return std::string("v"); });
    ADD_FAILURE() << "no error";
  } catch (const idem::StoreUnavailable& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("may or may not have been recorded"));
  }
  // It was recorded: a later call replays it.
  store_->lose_reply_always(Op::kComplete, false);
  store_->fail_always(Op::kGet, false);
  auto r = call(exec, "s", "k", [](const Attempt&) { return std::string("again"); });
  EXPECT_TRUE(r.replayed);
  EXPECT_EQ(r.value, "v");
}

TEST_P(ExecutorFormTest, LostReleaseReplyLeavesTheKeyClean) {
  Executor exec(store_);
  store_->lose_reply_next(Op::kRelease);
  EXPECT_THROW(
      (void)call(exec, "s", "k", [](const Attempt&) -> std::string { throw PaymentDeclined(1); }),
      PaymentDeclined);
  EXPECT_EQ(store_->lost_replies(Op::kRelease), 1u);
  EXPECT_FALSE(memory_->get("s", "k").has_value());
  auto r = call(exec, "s", "k", [](const Attempt& a) {
    EXPECT_FALSE(a.stolen());
    EXPECT_EQ(a.number(), 1u);
    return std::string("second");
  });
  EXPECT_EQ(r.value, "second");
}

class LostExtendReplyTest : public idem::testing::SystemClockStoreTest,
                            public ::testing::WithParamInterface<Op> {};

INSTANTIATE_TEST_SUITE_P(Ops, LostExtendReplyTest,
                         ::testing::Values(Op::kExtend, Op::kExtendMany),
                         [](const ::testing::TestParamInfo<Op>& info) {
                           return info.param == Op::kExtend ? "Extend" : "ExtendMany";
                         });

TEST_P(LostExtendReplyTest, HeartbeatKeepsTheLeaseWhenExtendRepliesAreLost) {
  // The lease is long against the interval, so a loaded machine cannot make the local
  // deadline pass between two beats.
  Executor exec(store_, ExecutorOptions{.lease = 3s, .heartbeat = 50ms});
  store_->lose_reply_next(GetParam(), 2);
  auto r = exec.run("s", "k", [&](const Attempt& a) {
    // Two lost replies, then extends that are answered.
    EXPECT_TRUE(eventually([&] { return store_->lost_replies(GetParam()) == 2u; }));
    const auto answered = store_->calls(Op::kExtend) + 1;
    EXPECT_TRUE(eventually([&] { return store_->calls(Op::kExtend) > answered; }));
    EXPECT_FALSE(a.lease_lost());
    return std::string("kept");
  });
  EXPECT_EQ(r.value, "kept");
  EXPECT_FALSE(r.replayed);
}

// --- limits and validation --------------------------------------------------------------

TEST_P(ExecutorFormTest, OversizePayloadIsRefusedWithItsSizeAndTheRecordReleased) {
  Executor exec(store_, ExecutorOptions{.max_payload = 10});
  try {
    (void)call(exec, "s", "k", [](const Attempt&) { return std::string(11, 'x'); });
    FAIL() << "run did not throw";
  } catch (const idem::PayloadTooLarge& e) {
    EXPECT_EQ(e.size(), 11u);
    EXPECT_EQ(e.limit(), 10u);
    EXPECT_EQ(e.argument(), "payload");
  }
  EXPECT_FALSE(memory_->get("s", "k").has_value());
  EXPECT_EQ(store_->calls(Op::kComplete), 0u);
  // Exactly at the limit is fine.
  auto r = call(exec, "s", "k", [](const Attempt&) { return std::string(10, 'x'); });
  EXPECT_EQ(r.value.size(), 10u);
}

struct BadCall {
  std::string name;
  std::string scope;
  std::string key;
  CallOptions call;
  std::string argument;  // what the error must name
};

TEST_P(ExecutorFormTest, BadInputsAreRefusedBeforeAnyStoreCall) {
  Executor exec(store_);
  const std::vector<BadCall> cases = {
      {"empty key", "s", "", {}, "key"},
      {"long key", "s", std::string(idem::kMaxKeyBytes + 1, 'k'), {}, "key"},
      {"empty scope", "", "k", {}, "scope"},
      {"long scope", std::string(idem::kMaxScopeBytes + 1, 's'), "k", {}, "scope"},
      {"zero lease", "s", "k", CallOptions{.lease = 0ms}, "lease"},
      {"negative ttl", "s", "k", CallOptions{.ttl = -1ms}, "ttl"},
      {"ttl over a year", "s", "k", CallOptions{.ttl = idem::kMaxDuration + 1ms}, "ttl"},
      {"lease over a year", "s", "k", CallOptions{.lease = idem::kMaxDuration + 1ms}, "lease"},
      {"heartbeat not shorter than the lease", "s", "k", CallOptions{.lease = 1s, .heartbeat = 1s},
       "heartbeat"},
      {"negative heartbeat", "s", "k", CallOptions{.heartbeat = -5ms}, "heartbeat"},
      {"negative max_wait", "s", "k", CallOptions{.wait = WaitPolicy{.max_wait = -1ms}},
       "max_wait"},
      {"zero backoff", "s", "k",
       CallOptions{.wait = WaitPolicy{.max_wait = 1s, .initial_backoff = 0ms}}, "initial_backoff"},
  };
  for (const BadCall& c : cases) {
    bool ran = false;
    try {
      (void)call(exec, 
          c.scope, c.key,
          [&](const Attempt&) {
            ran = true;
            return std::string();
          },
          c.call);
      ADD_FAILURE() << c.name << ": not refused";
    } catch (const idem::InvalidArgument& e) {
      EXPECT_EQ(e.argument(), c.argument) << c.name << ": " << e.what();
    }
    EXPECT_FALSE(ran) << c.name;
  }
  EXPECT_EQ(store_->total_calls(), 0u);
}

TEST_P(ExecutorFormTest, LongestScopeAndKeyAreAccepted) {
  Executor exec(store_);
  auto r = call(exec, std::string(idem::kMaxScopeBytes, 's'), std::string(idem::kMaxKeyBytes, 'k'),
                    [](const Attempt&) { return std::string("ok"); });
  EXPECT_EQ(r.value, "ok");
}

TEST_F(ExecutorTest, BadExecutorOptionsAreRefused) {
  auto argument_of = [&](std::shared_ptr<idem::Store> store, ExecutorOptions o) {
    try {
      Executor exec(std::move(store), std::move(o));
    } catch (const idem::InvalidArgument& e) {
      return e.argument();
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(argument_of(nullptr, {}), "store");
  EXPECT_EQ(argument_of(store_, {.max_payload = idem::kMaxPayloadBytes + 1}), "max_payload");
  EXPECT_EQ(argument_of(store_, {.lease = 0ms}), "lease");
  EXPECT_EQ(argument_of(store_, {.ttl = 366 * 24h}), "ttl");
  EXPECT_EQ(argument_of(store_, {.lease = 3s, .heartbeat = 5s}), "heartbeat");
  EXPECT_EQ(
      argument_of(store_, {.wait = {.max_wait = 1s, .initial_backoff = 2s, .max_backoff = 1s}}),
      "max_backoff");
  EXPECT_EQ(argument_of(store_, {.max_payload = idem::kMaxPayloadBytes}), "(accepted)");
  EXPECT_EQ(store_->total_calls(), 0u);
}

// --- fingerprints -----------------------------------------------------------------------

TEST_P(ExecutorFormTest, DifferentFingerprintOnReplayIsKeyReuse) {
  Executor exec(store_);
  (void)call(exec, 
      "s", "k", [](const Attempt&) { return std::string("v"); }, CallOptions{.fingerprint = "A"});
  try {
    (void)call(exec, 
        "s", "k", [](const Attempt&) { return std::string("w"); }, CallOptions{.fingerprint = "B"});
    FAIL() << "run did not throw";
  } catch (const idem::KeyReuse& e) {
    EXPECT_EQ(e.stored_fingerprint(), "A");
    EXPECT_EQ(e.request_fingerprint(), "B");
  }
  auto same = call(exec, 
      "s", "k", [](const Attempt&) { return std::string("w"); }, CallOptions{.fingerprint = "A"});
  EXPECT_TRUE(same.replayed);
  // Only one side carrying a fingerprint is no evidence of reuse.
  auto none = call(exec, "s", "k", [](const Attempt&) { return std::string("w"); });
  EXPECT_TRUE(none.replayed);
}

TEST_P(ExecutorFormTest, DifferentFingerprintOnBusyIsKeyReuseNotAWait) {
  ASSERT_THAT(memory_->acquire("s", "k", 60s, 1h, "A"), IsAcquired());
  Executor exec(store_);
  EXPECT_THAT(
      [&] {
        (void)call(exec, 
            "s", "k", [](const Attempt&) { return std::string(); },
            CallOptions{.wait = WaitPolicy{.max_wait = 1h}, .fingerprint = "B"});
      },
      ThrowsIdem(ErrorCode::kKeyReuse));
  EXPECT_EQ(store_->calls(Op::kAcquire), 1u);
}

TEST_P(ExecutorFormTest, DifferentFingerprintFromAnInProcessOwnerIsKeyReuse) {
  Executor exec(store_);
  Gate started, finish;
  auto owner = std::async(std::launch::async, [&] {
    return call(exec, 
        "s", "k",
        [&](const Attempt&) {
          started.open();
          finish.wait();
          return std::string("v");
        },
        CallOptions{.fingerprint = "A"});
  });
  ASSERT_TRUE(started.wait());
  const auto calls_before = store_->total_calls();
  EXPECT_THAT(
      [&] {
        (void)call(exec, 
            "s", "k", [](const Attempt&) { return std::string(); },
            CallOptions{.wait = WaitPolicy{.max_wait = 1h}, .fingerprint = "B"});
      },
      ThrowsIdem(ErrorCode::kKeyReuse));
  EXPECT_EQ(store_->total_calls(), calls_before);
  finish.open();
  EXPECT_EQ(owner.get().value, "v");
}

// --- fail fast --------------------------------------------------------------------------

TEST_P(ExecutorFormTest, FailFastInProgressCarriesTheOwnersDeadline) {
  auto owner = memory_->acquire("s", "k", 60s, 1h);
  ASSERT_THAT(owner, IsAcquired());
  const auto deadline = std::get<idem::Acquired>(owner).lease.lease_expires_at;
  Executor exec(store_);
  bool ran = false;
  try {
    (void)call(exec, "s", "k", [&](const Attempt&) {
      ran = true;
      return std::string();
    });
    FAIL() << "run did not throw";
  } catch (const idem::InProgress& e) {
    EXPECT_EQ(e.lease_expires_at(), deadline);
    EXPECT_EQ(e.lease_remaining(), 60s);  // the fake clock did not move
  }
  EXPECT_FALSE(ran);
}

TEST_P(ExecutorFormTest, FailFastDuplicateOfAnInProcessOwnerMakesNoStoreCall) {
  Executor exec(store_, ExecutorOptions{.lease = 60s});
  Gate started, finish;
  idem::Timestamp deadline{};
  auto owner = std::async(std::launch::async, [&] {
    return call(exec, "s", "k", [&](const Attempt&) {
      deadline = memory_->get("s", "k")->lease_expires_at;
      started.open();
      finish.wait();
      return std::string("v");
    });
  });
  ASSERT_TRUE(started.wait());
  const auto calls_before = store_->total_calls();
  try {
    (void)call(exec, "s", "k", [](const Attempt&) { return std::string(); });
    ADD_FAILURE() << "run did not throw";
  } catch (const idem::InProgress& e) {
    EXPECT_EQ(e.lease_expires_at(), deadline);
    EXPECT_GT(e.lease_remaining(), 0ms);
    EXPECT_LE(e.lease_remaining(), 60s);
  }
  EXPECT_EQ(store_->total_calls(), calls_before);
  finish.open();
  EXPECT_EQ(owner.get().value, "v");
}

// --- waiting on another process ---------------------------------------------------------

// Two executors on one store stand for two processes: neither sees the other in memory.
TEST_P(ExecutorFormTest, WaiterEndsWithAReplayWhenTheOwnerCompletes) {
  Executor process_a(store_);
  Executor process_b(store_);
  Gate started, finish;
  auto owner = std::async(std::launch::async, [&] {
    return call(process_a, "s", "k", [&](const Attempt&) {
      started.open();
      finish.wait();
      return std::string("from a");
    });
  });
  ASSERT_TRUE(started.wait());
  auto waiter = std::async(std::launch::async, [&] {
    return call(process_b, 
        "s", "k", [](const Attempt&) { return std::string("from b"); },
        CallOptions{.wait = WaitPolicy{.max_wait = 1h, .max_backoff = 20ms}});
  });
  // The waiter is polling the store (the owner made the first acquire).
  ASSERT_TRUE(store_->wait_for_calls(Op::kAcquire, 3));
  finish.open();
  auto r = waiter.get();
  EXPECT_TRUE(r.replayed);
  EXPECT_EQ(r.value, "from a");
  EXPECT_FALSE(owner.get().replayed);
}

TEST_P(ExecutorFormTest, WaiterAcquiresForItselfWhenTheOwnerReleases) {
  Executor process_a(store_);
  Executor process_b(store_);
  Gate started, finish;
  auto owner = std::async(std::launch::async, [&] {
    (void)call(process_a, "s", "k", [&](const Attempt&) -> std::string {
      started.open();
      finish.wait();
      throw PaymentDeclined(1);
    });
  });
  ASSERT_TRUE(started.wait());
  auto waiter = std::async(std::launch::async, [&] {
    return call(process_b, 
        "s", "k",
        [](const Attempt& a) {
          // SPEC §4: after a release the key looks never used.
          EXPECT_EQ(a.number(), 1u);
          EXPECT_FALSE(a.stolen());
          return std::string("from b");
        },
        CallOptions{.wait = WaitPolicy{.max_wait = 1h, .max_backoff = 20ms}});
  });
  ASSERT_TRUE(store_->wait_for_calls(Op::kAcquire, 3));
  finish.open();
  EXPECT_THROW(owner.get(), PaymentDeclined);
  auto r = waiter.get();
  EXPECT_FALSE(r.replayed);
  EXPECT_EQ(r.value, "from b");
}

TEST_P(ExecutorFormTest, WaiterStealsWhenTheOwnersLeaseExpires) {
  // A process that died holding the lease: nobody extends it.
  auto dead = memory_->acquire("s", "k", 60s, 1h);
  ASSERT_THAT(dead, IsAcquired());
  Executor exec(store_);
  auto waiter = std::async(std::launch::async, [&] {
    return call(exec, 
        "s", "k",
        [](const Attempt& a) {
          EXPECT_TRUE(a.stolen());
          EXPECT_EQ(a.number(), 2u);
          return std::string("taken over");
        },
        CallOptions{.wait = WaitPolicy{.max_wait = 1h, .max_backoff = 20ms}});
  });
  ASSERT_TRUE(store_->wait_for_calls(Op::kAcquire, 2));
  clock_->advance(60s);
  auto r = waiter.get();
  EXPECT_FALSE(r.replayed);
  EXPECT_EQ(r.value, "taken over");
  EXPECT_EQ(memory_->get("s", "k")->payload, "taken over");
}

TEST_P(ExecutorFormTest, WaiterGivesUpWithInProgressWhenItsBoundRunsOut) {
  auto owner = memory_->acquire("s", "k", 60s, 1h);
  ASSERT_THAT(owner, IsAcquired());
  Executor exec(store_);
  try {
    (void)call(exec, 
        "s", "k", [](const Attempt&) { return std::string(); },
        CallOptions{.wait =
                        WaitPolicy{.max_wait = 50ms, .initial_backoff = 5ms, .max_backoff = 10ms}});
    FAIL() << "run did not throw";
  } catch (const idem::InProgress& e) {
    EXPECT_EQ(e.lease_expires_at(), std::get<idem::Acquired>(owner).lease.lease_expires_at);
  }
  EXPECT_GE(store_->calls(Op::kAcquire), 2u);
  EXPECT_EQ(exec.active_leases(), 0u);
  EXPECT_EQ(exec.waiting_duplicates(), 0u);
}

TEST_P(ExecutorRealTimeFormTest, WaiterNeverSleepsPastTheOwnersLeaseDeadline) {
  // The owner's lease ends in 100 ms and nobody extends it. The waiter's backoff is an
  // hour: only by honouring the owner's deadline can it steal the key soon.
  ASSERT_THAT(memory_->acquire("s", "k", 100ms, 1h), IsAcquired());
  Executor exec(store_);
  auto waiter = std::async(std::launch::async, [&] {
    return call(exec, 
        "s", "k", [](const Attempt& a) { return std::to_string(a.number()); },
        CallOptions{.wait = WaitPolicy{.max_wait = 2h, .initial_backoff = 1h, .max_backoff = 1h}});
  });
  ASSERT_EQ(waiter.wait_for(kEventually), std::future_status::ready);
  EXPECT_EQ(waiter.get().value, "2");
}

// --- waiting on this process, in memory -------------------------------------------------

TEST_P(ExecutorFormTest, InProcessDuplicateWaitsInMemoryAndGetsTheResult) {
  Executor exec(store_);
  Gate started, finish;
  int runs = 0;
  auto owner = std::async(std::launch::async, [&] {
    return call(exec, "s", "k", [&](const Attempt&) {
      ++runs;
      started.open();
      finish.wait();
      return std::string("v");
    });
  });
  ASSERT_TRUE(started.wait());
  ASSERT_EQ(store_->calls(Op::kAcquire), 1u);
  auto duplicate = std::async(std::launch::async, [&] {
    return call(exec, 
        "s", "k", [&](const Attempt&) { return std::string("dup"); },
        CallOptions{.wait =
                        WaitPolicy{.max_wait = 1h, .initial_backoff = 1ms, .max_backoff = 1ms}});
  });
  ASSERT_TRUE(eventually([&] { return exec.waiting_duplicates() == 1; }));
  // With a 1 ms backoff a polling waiter would have called acquire many times by now.
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(store_->calls(Op::kAcquire), 1u);
  finish.open();
  auto r = duplicate.get();
  EXPECT_TRUE(r.replayed);
  EXPECT_EQ(r.value, "v");
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(store_->calls(Op::kAcquire), 1u);
  EXPECT_FALSE(owner.get().replayed);
  EXPECT_EQ(exec.waiting_duplicates(), 0u);
}

TEST_P(ExecutorFormTest, InProcessDuplicateAcquiresWhenTheOwnerThrows) {
  Executor exec(store_);
  Gate started, finish;
  auto owner = std::async(std::launch::async, [&] {
    (void)call(exec, "s", "k", [&](const Attempt&) -> std::string {
      started.open();
      finish.wait();
      throw PaymentDeclined(2);
    });
  });
  ASSERT_TRUE(started.wait());
  auto duplicate = std::async(std::launch::async, [&] {
    return call(exec, 
        "s", "k",
        [&](const Attempt& a) {
          EXPECT_EQ(a.number(), 1u);
          EXPECT_FALSE(a.stolen());
          return std::string("retried");
        },
        CallOptions{.wait = WaitPolicy{.max_wait = 1h}});
  });
  ASSERT_TRUE(eventually([&] { return exec.waiting_duplicates() == 1; }));
  finish.open();
  EXPECT_THROW(owner.get(), PaymentDeclined);
  auto r = duplicate.get();
  EXPECT_FALSE(r.replayed);
  EXPECT_EQ(r.value, "retried");
}

TEST_P(ExecutorFormTest, InProcessDuplicateGivesUpWhenItsBoundRunsOut) {
  Executor exec(store_);
  Gate started, finish;
  auto owner = std::async(std::launch::async, [&] {
    return call(exec, "s", "k", [&](const Attempt&) {
      started.open();
      finish.wait();
      return std::string("v");
    });
  });
  ASSERT_TRUE(started.wait());
  EXPECT_THAT(
      [&] {
        (void)call(exec, 
            "s", "k", [](const Attempt&) { return std::string(); },
            CallOptions{.wait = WaitPolicy{.max_wait = 20ms}});
      },
      ThrowsIdem(ErrorCode::kInProgress));
  EXPECT_EQ(exec.waiting_duplicates(), 0u);
  finish.open();
  EXPECT_EQ(owner.get().value, "v");
  EXPECT_EQ(exec.active_leases(), 0u);
}

TEST_P(ExecutorFormTest, InProcessDuplicatesOfAnotherProcessesOwnerLeaveOnePollerToPoll) {
  Executor process_a(store_);
  Executor process_b(store_);
  Gate started, finish;
  auto owner = std::async(std::launch::async, [&] {
    return call(process_a, "s", "k", [&](const Attempt&) {
      started.open();
      finish.wait();
      return std::string("from a");
    });
  });
  ASSERT_TRUE(started.wait());
  bool b_ran = false;
  std::vector<std::future<Executor::BytesResult>> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.push_back(std::async(std::launch::async, [&] {
      return call(process_b, 
          "s", "k",
          [&](const Attempt&) {
            b_ran = true;
            return std::string("from b");
          },
          CallOptions{.wait =
                          WaitPolicy{.max_wait = 1h, .initial_backoff = 5ms, .max_backoff = 5ms}});
    }));
  }
  // SPEC §7: one of them polls the store; the other three wait on it in memory.
  const bool three_in_memory = eventually([&] { return process_b.waiting_duplicates() == 3; });
  finish.open();
  for (auto& w : waiters) {
    auto r = w.get();
    EXPECT_TRUE(r.replayed);
    EXPECT_EQ(r.value, "from a");
  }
  EXPECT_TRUE(three_in_memory);
  EXPECT_FALSE(b_ran);
  EXPECT_EQ(owner.get().value, "from a");
  EXPECT_EQ(process_b.waiting_duplicates(), 0u);
}

TEST_P(ExecutorFormTest, PollerThatGivesUpHandsPollingToTheNextWaiter) {
  ASSERT_THAT(memory_->acquire("s", "k", 60s, 1h), IsAcquired());
  Executor exec(store_);
  auto short_wait = std::async(std::launch::async, [&] {
    return call(exec, 
        "s", "k", [](const Attempt&) { return std::string(); },
        CallOptions{.wait =
                        WaitPolicy{.max_wait = 200ms, .initial_backoff = 5ms, .max_backoff = 5ms}});
  });
  // Its second poll comes after it listed itself as the key's poller and slept once (its
  // 200 ms bound allows no more on a loaded machine).
  ASSERT_TRUE(store_->wait_for_calls(Op::kAcquire, 2));
  auto long_wait = std::async(std::launch::async, [&] {
    return call(exec, 
        "s", "k", [](const Attempt& a) { return std::to_string(a.number()); },
        CallOptions{.wait =
                        WaitPolicy{.max_wait = 1h, .initial_backoff = 5ms, .max_backoff = 5ms}});
  });
  EXPECT_THAT([&] { (void)short_wait.get(); }, ThrowsIdem(ErrorCode::kInProgress));
  // The long waiter polls for itself now; once the dead owner's lease runs out, it steals.
  const auto calls = store_->calls(Op::kAcquire);
  ASSERT_TRUE(store_->wait_for_calls(Op::kAcquire, calls + 2));
  clock_->advance(60s);
  EXPECT_EQ(long_wait.get().value, "2");
}

TEST_P(ExecutorFormTest, ConcurrentDuplicatesRunTheActionOnce) {
  Executor exec(store_);
  std::atomic<int> runs{0};
  std::vector<std::future<Executor::BytesResult>> calls;
  for (int i = 0; i < 8; ++i) {
    calls.push_back(std::async(std::launch::async, [&] {
      return call(exec, 
          "s", "k",
          [&](const Attempt&) {
            ++runs;
            std::this_thread::sleep_for(20ms);
            return std::string("once");
          },
          CallOptions{.wait =
                          WaitPolicy{.max_wait = 1h, .initial_backoff = 1ms, .max_backoff = 5ms}});
    }));
  }
  int fresh = 0;
  for (auto& c : calls) {
    auto r = c.get();
    EXPECT_EQ(r.value, "once");
    fresh += r.replayed ? 0 : 1;
  }
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(fresh, 1);
}

// --- what the caller gets back -----------------------------------------------------------

TEST_P(ExecutorFormTest, AResultSaysWhereItCameFrom) {
  Executor exec(store_);
  clock_->set(idem::Timestamp{std::chrono::hours(24 * 365 * 50)});
  auto fresh = call(exec, "s", "k", [](const Attempt&) { return std::string("v"); });
  const auto record = memory_->get("s", "k");
  EXPECT_FALSE(fresh.replayed);
  EXPECT_EQ(fresh.token, record->token);
  EXPECT_EQ(fresh.attempt, 1u);
  EXPECT_FALSE(fresh.stolen);
  EXPECT_FALSE(fresh.completed_at.has_value());  // the store does not report it
  clock_->advance(5s);
  auto replay = call(exec, "s", "k", [](const Attempt&) { return std::string(); });
  EXPECT_TRUE(replay.replayed);
  EXPECT_EQ(replay.completed_at, record->completed_at);
  EXPECT_EQ(replay.expires_at, record->expires_at);
  EXPECT_FALSE(replay.token.has_value());  // nor the token with a replay
}

TEST_P(ExecutorFormTest, ADuplicateServedInMemoryKnowsTheLeaseThatProducedIt) {
  Executor exec(store_);
  Gate started, finish;
  idem::Token token = 0;
  auto owner = std::async(std::launch::async, [&] {
    return call(exec, "s", "k", [&](const Attempt& a) {
      token = a.token();
      started.open();
      finish.wait();
      return std::string("v");
    });
  });
  ASSERT_TRUE(started.wait());
  auto duplicate = std::async(std::launch::async, [&] {
    return call(
        exec, "s", "k", [](const Attempt&) { return std::string(); },
        CallOptions{.wait = WaitPolicy{.max_wait = 1h}});
  });
  ASSERT_TRUE(eventually([&] { return exec.waiting_duplicates() == 1; }));
  finish.open();
  const auto r = duplicate.get();
  EXPECT_TRUE(r.replayed);
  EXPECT_EQ(r.token, token);
  EXPECT_EQ(r.attempt, 1u);
  (void)owner.get();
}

TEST_P(ExecutorFormTest, APerCallLeaseShorterThanTheExecutorsHeartbeatAdapts) {
  // The executor extends every 10 s; a call with a 300 ms lease gets lease / 3 instead of
  // an error about a heartbeat option it never set.
  Executor exec(store_, ExecutorOptions{.lease = 30s, .heartbeat = 10s});
  auto r = call(
      exec, "s", "k",
      [&](const Attempt&) {
        EXPECT_TRUE(store_->wait_for_calls(Op::kExtend, 2));
        return std::string("v");
      },
      CallOptions{.lease = 300ms});
  EXPECT_EQ(r.value, "v");
  // A heartbeat the call does set must still be shorter than its lease.
  EXPECT_THAT(
      [&] {
        (void)call(
            exec, "s", "k2", [](const Attempt&) { return std::string(); },
            CallOptions{.lease = 300ms, .heartbeat = 300ms});
      },
      ThrowsIdem(ErrorCode::kInvalidArgument));
}

// --- cancellation ---------------------------------------------------------------------------

TEST_P(ExecutorFormTest, CancellingAWaitOnAnInProcessOwnerEndsItAtOnce) {
  Executor exec(store_);
  Gate started, finish;
  auto owner = std::async(std::launch::async, [&] {
    return call(exec, "s", "k", [&](const Attempt&) {
      started.open();
      finish.wait();
      return std::string("v");
    });
  });
  ASSERT_TRUE(started.wait());
  std::stop_source cancel;
  auto duplicate = std::async(std::launch::async, [&] {
    return call(
        exec, "s", "k", [](const Attempt&) { return std::string(); },
        CallOptions{.wait = WaitPolicy{.max_wait = 1h}, .stop_token = cancel.get_token()});
  });
  ASSERT_TRUE(eventually([&] { return exec.waiting_duplicates() == 1; }));
  cancel.request_stop();
  // An hour of waiting left, yet it ends now: the key is still busy.
  EXPECT_THAT([&] { (void)duplicate.get(); }, ThrowsIdem(ErrorCode::kInProgress));
  finish.open();
  EXPECT_EQ(owner.get().value, "v");
}

TEST_P(ExecutorFormTest, CancellingAPollerEndsItsWaitAtOnce) {
  ASSERT_THAT(memory_->acquire("s", "k", 1h, 2h), IsAcquired());
  Executor exec(store_);
  std::stop_source cancel;
  auto poller = std::async(std::launch::async, [&] {
    return call(
        exec, "s", "k", [](const Attempt&) { return std::string(); },
        CallOptions{.wait = WaitPolicy{.max_wait = 1h, .initial_backoff = 1h, .max_backoff = 1h},
                    .stop_token = cancel.get_token()});
  });
  // Its first poll found the key busy; it then sleeps for up to an hour.
  ASSERT_TRUE(store_->wait_for_calls(Op::kAcquire, 1));
  cancel.request_stop();
  EXPECT_THAT([&] { (void)poller.get(); }, ThrowsIdem(ErrorCode::kInProgress));
}

TEST_P(ExecutorFormTest, CancellationRequestsTheActionsStopTokenWithoutLosingTheLease) {
  Executor exec(store_);
  std::stop_source cancel;
  bool stop_seen = false;
  bool lost = true;
  auto r = call(
      exec, "s", "k",
      [&](const Attempt& a) {
        cancel.request_stop();
        stop_seen = a.stop_token().stop_requested();
        lost = a.lease_lost();
        a.throw_if_lost();  // not lost: does not throw
        return std::string("stopped early");
      },
      CallOptions{.stop_token = cancel.get_token()});
  EXPECT_TRUE(stop_seen);
  EXPECT_FALSE(lost);
  // The action chose to return a result: it is recorded.
  EXPECT_EQ(r.value, "stopped early");
  EXPECT_EQ(memory_->get("s", "k")->payload, "stopped early");
}

// --- the heartbeat, as the action sees it -----------------------------------------------

TEST_P(ExecutorRealTimeFormTest, HeartbeatKeepsALongActionAlive) {
  // A 300 ms lease extended every 100 ms, for five lease durations.
  Executor exec(store_, ExecutorOptions{.lease = 300ms});
  Executor other_process(store_);
  idem::Timestamp first_deadline{};
  int busy_seen = 0;
  bool lost = false;
  auto r = call(exec, "s", "k", [&](const Attempt& a) {
    first_deadline = memory_->get("s", "k")->lease_expires_at;
    const auto end = std::chrono::steady_clock::now() + 1500ms;
    while (std::chrono::steady_clock::now() < end) {
      // Nobody else can take the key: the store says Busy and another executor fails fast.
      EXPECT_THAT(memory_->acquire("s", "k", 1s, 1h), IsBusy());
      EXPECT_THAT(
          [&] { (void)call(other_process, "s", "k", [](const Attempt&) { return std::string(); }); },
          ThrowsIdem(ErrorCode::kInProgress));
      ++busy_seen;
      std::this_thread::sleep_for(50ms);
    }
    lost = a.lease_lost();
    return std::string("done");
  });
  EXPECT_FALSE(lost);
  EXPECT_FALSE(r.replayed);
  EXPECT_GT(busy_seen, 0);
  EXPECT_GE(store_->calls(Op::kExtend), 3u);
  // The record completed with this run's result: the lease was never lost.
  auto record = memory_->get("s", "k");
  EXPECT_EQ(record->state, idem::RecordState::kComplete);
  EXPECT_EQ(record->payload, "done");
  EXPECT_GT(record->completed_at, first_deadline);
}

TEST_P(ExecutorRealTimeFormTest, ForgottenRecordLosesTheLease) {
  Executor exec(store_, ExecutorOptions{.lease = 300ms});
  Gate started;
  idem::Token token = 0;
  auto run = std::async(std::launch::async, [&] {
    return call(exec, "s", "k", [&](const Attempt& a) {
      token = a.token();
      started.open();
      EXPECT_TRUE(wait_for_lost(a));
      return std::string("too late");
    });
  });
  ASSERT_TRUE(started.wait());
  ASSERT_TRUE(memory_->forget("s", "k"));
  try {
    (void)run.get();
    FAIL() << "run did not throw";
  } catch (const idem::LeaseLost& e) {
    EXPECT_EQ(e.token(), token);
    EXPECT_EQ(e.scope(), "s");
    EXPECT_EQ(e.key(), "k");
    // Nobody else owns the key: the message must not say so.
    EXPECT_THAT(e.what(), ::testing::HasSubstr("the record was deleted"));
    EXPECT_THAT(e.what(), ::testing::Not(::testing::HasSubstr("another caller")));
  }
  EXPECT_FALSE(memory_->get("s", "k").has_value());
  EXPECT_EQ(exec.active_leases(), 0u);
}

TEST_P(ExecutorRealTimeFormTest, ThrowIfLostGivesTheCallerLeaseLostNotTheActionsOwnError) {
  Executor exec(store_, ExecutorOptions{.lease = 300ms});
  Gate started;
  idem::Token token = 0;
  auto run = std::async(std::launch::async, [&] {
    return call(exec, "s", "k", [&](const Attempt& a) {
      token = a.token();
      started.open();
      EXPECT_TRUE(wait_for_lost(a));
      a.throw_if_lost();
      return std::string("never returned");
    });
  });
  ASSERT_TRUE(started.wait());
  ASSERT_TRUE(memory_->forget("s", "k"));
  try {
    (void)run.get();
    FAIL() << "run did not throw";
  } catch (const idem::LeaseLost& e) {
    EXPECT_EQ(e.token(), token);
    EXPECT_EQ(e.key(), "k");
    EXPECT_THAT(e.what(), ::testing::HasSubstr("lost lease"));
  }
  EXPECT_EQ(exec.active_leases(), 0u);
}

TEST_P(ExecutorFormTest, LeaseStolenWhileTheHeartbeatIsPausedIsLost) {
  Executor exec(store_, ExecutorOptions{.lease = 300ms});
  store_->pause(Op::kExtend);
  Gate started;
  auto run = std::async(std::launch::async, [&] {
    return call(exec, "s", "k", [&](const Attempt& a) {
      started.open();
      EXPECT_TRUE(wait_for_lost(a));
      return std::string("stale");
    });
  });
  ASSERT_TRUE(started.wait());
  // The heartbeat is stuck in a slow store call while the lease runs out and another
  // caller steals the key.
  ASSERT_TRUE(store_->wait_for_blocked(Op::kExtend, 1));
  clock_->advance(1s);
  auto thief = memory_->acquire("s", "k", 60s, 1h);
  ASSERT_THAT(thief, IsAcquired());
  ASSERT_TRUE(std::get<idem::Acquired>(thief).stolen);
  store_->resume(Op::kExtend);
  try {
    (void)run.get();
    ADD_FAILURE() << "run did not throw";
  } catch (const idem::LeaseLost& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("another caller took the key over"));
  }
  // The thief's lease is untouched.
  auto record = memory_->get("s", "k");
  EXPECT_EQ(record->state, idem::RecordState::kInProgress);
  EXPECT_EQ(record->token, std::get<idem::Acquired>(thief).lease.token);
}

TEST_P(ExecutorFormTest, RunReturnsWhileTheHeartbeatIsStuckInAStoreCall) {
  Executor exec(store_, ExecutorOptions{.lease = 300ms});
  store_->pause(Op::kExtend);
  Gate stuck, done;
  auto slow = std::async(std::launch::async, [&] {
    return call(exec, "s", "slow", [&](const Attempt&) {
      // The heartbeat thread is now inside a store call for this lease.
      EXPECT_TRUE(store_->wait_for_blocked(Op::kExtend, 1));
      stuck.open();
      done.wait();
      return std::string("slow");
    });
  });
  ASSERT_TRUE(stuck.wait());
  // Other calls start and finish without waiting for the heartbeat.
  auto quick = std::async(std::launch::async, [&] {
    return call(exec, "s", "quick", [](const Attempt&) { return std::string("quick"); });
  });
  EXPECT_EQ(quick.wait_for(kEventually), std::future_status::ready);
  EXPECT_EQ(quick.get().value, "quick");
  done.open();
  // The slow call returns too, its extend still stuck: nobody took its key, so its result
  // is recorded.
  EXPECT_EQ(slow.wait_for(kEventually), std::future_status::ready);
  EXPECT_EQ(slow.get().value, "slow");
  EXPECT_EQ(exec.active_leases(), 0u);
  store_->resume(Op::kExtend);
}

TEST_P(ExecutorRealTimeFormTest, HeartbeatErrorsUntilTheDeadlineLoseTheLease) {
  std::atomic<int> errors{0};
  Executor exec(store_,
                ExecutorOptions{.lease = 300ms,
                                .on_heartbeat_error = [&](const std::exception&) { ++errors; }});
  store_->fail_always(Op::kExtend);
  bool lost = false;
  auto r = call(exec, "s", "k", [&](const Attempt& a) {
    lost = wait_for_lost(a);
    return std::string("finished anyway");
  });
  EXPECT_TRUE(lost);
  EXPECT_GE(errors.load(), 2);
  // SPEC §4: nobody stole the lease, so the owner still holds the token and may complete.
  EXPECT_FALSE(r.replayed);
  EXPECT_EQ(memory_->get("s", "k")->payload, "finished anyway");
}

TEST_P(ExecutorRealTimeFormTest, HeartbeatErrorCallbackThatThrowsIsContained) {
  // A 1 s lease extended every 333 ms; two failed extends are retried well within it.
  Executor exec(store_, ExecutorOptions{.lease = 1s, .on_heartbeat_error = [](const auto&) {
                                          throw std::runtime_error("careless callback");
                                        }});
  store_->fail_next(Op::kExtend, 2);
  auto r = call(exec, "s", "k", [&](const Attempt& a) {
    EXPECT_TRUE(store_->wait_for_calls(Op::kExtend, 3));
    return std::string(a.lease_lost() ? "lost" : "kept");
  });
  EXPECT_EQ(r.value, "kept");
}

// Runs `depth` nested calls on different keys, so one thread holds `depth` leases at once;
// the innermost waits for every thread to reach it, then holds on for `hold`.
std::size_t nest(Executor& exec, int thread, int depth, std::latch& all_in,
                 std::chrono::milliseconds hold, std::atomic<int>& lost) {
  if (depth == 0) {
    all_in.arrive_and_wait();
    std::this_thread::sleep_for(hold);
    return 0;
  }
  const std::string key = std::to_string(thread) + "/" + std::to_string(depth);
  auto r = exec.run("nest", key, [&](const Attempt& a) {
    const std::size_t inner = nest(exec, thread, depth - 1, all_in, hold, lost);
    if (a.lease_lost()) ++lost;
    return std::to_string(inner + 1);
  });
  return std::stoul(r.value);
}

TEST_F(ExecutorRealTimeTest, HundredsOfConcurrentRunsShareOneHeartbeat) {
  constexpr int kThreads = 8;
  constexpr int kDepth = 32;
  Executor exec(store_, ExecutorOptions{.lease = 300ms});
  std::latch all_in(kThreads);
  std::atomic<int> lost{0};
  std::size_t peak = 0;
  std::vector<std::future<std::size_t>> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.push_back(std::async(std::launch::async,
                                 [&, t] { return nest(exec, t, kDepth, all_in, 1200ms, lost); }));
  }
  const bool all_alive_at_once = eventually([&] {
    peak = std::max(peak, exec.active_leases());
    return peak == kThreads * kDepth;
  });
  for (auto& t : threads) EXPECT_EQ(t.get(), static_cast<std::size_t>(kDepth));
  EXPECT_TRUE(all_alive_at_once) << "peak " << peak;
  EXPECT_EQ(lost.load(), 0);
  EXPECT_EQ(exec.active_leases(), 0u);
  EXPECT_EQ(memory_->size(), static_cast<std::size_t>(kThreads * kDepth));
}

// --- lifetime ---------------------------------------------------------------------------

TEST_F(ExecutorTest, DestructorLeavesNoThreadBehind) {
  const std::size_t before = thread_count();
  {
    Executor exec(store_);
    (void)exec.run("s", "k", [](const Attempt&) { return std::string("v"); });
    EXPECT_EQ(thread_count(), before + 1);  // the one heartbeat thread
    (void)exec.run("s", "k2", [](const Attempt&) { return std::string("v"); });
    EXPECT_EQ(thread_count(), before + 1);
  }
  EXPECT_TRUE(eventually([&] { return thread_count() == before; }));
}

TEST_F(ExecutorTest, ReplayOnlyExecutorStartsNoThread) {
  const std::size_t before = thread_count();
  {
    Executor first(store_);
    (void)first.run("s", "k", [](const Attempt&) { return std::string("v"); });
  }
  ASSERT_TRUE(eventually([&] { return thread_count() == before; }));
  Executor exec(store_);
  EXPECT_TRUE(exec.run("s", "k", [](const Attempt&) { return std::string(); }).replayed);
  EXPECT_EQ(thread_count(), before);
}

}  // namespace
