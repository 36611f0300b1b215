// The executor (SPEC §5, §7): replays, waiting, the heartbeat as the action sees it, lost
// leases, errors and validation. Time-dependent cases use a ManualClock; the few that need
// the heartbeat to run for real use short leases on the system clock and wait for events
// with generous bounds, never asserting how long something took.
//
// This file: results and replays, codecs, an action that throws. Beside it:
// executor_failures_test.cpp, executor_waiting_test.cpp, executor_lifetime_test.cpp.

#include "executor_test.h"

namespace {

using namespace executor_test;

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
  auto r = call<std::vector<std::byte>>(exec, "s", "k",
                                        [](const Attempt&) { return std::vector<std::byte>{}; });
  EXPECT_TRUE(r.replayed);
  EXPECT_EQ(r.value, bytes);
}

// --- the action throws ------------------------------------------------------------------

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

}  // namespace
