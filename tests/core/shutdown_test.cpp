// The executor's orderly shutdown (shutdown(), the destructor, move assignment): new calls
// are refused, waits end, calls in flight and open handles get shutdown_timeout to end on
// their own, and then their leases are released so no key stays stuck. Run under
// AddressSanitizer, these also prove that no call or handle touches freed state.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "idem/executor.h"
#include "idem/testing/matchers.h"
#include "idem/testing/store_fixtures.h"
#include "support/eventually.h"
#include "support/gate.h"

namespace {

using namespace std::chrono_literals;
using idem::Attempt;
using idem::AttemptHandle;
using idem::CallOptions;
using idem::ErrorCode;
using idem::Executor;
using idem::ExecutorOptions;
using idem::WaitPolicy;
using idem::testing::eventually;
using idem::testing::Gate;
using idem::testing::IsAcquired;
using idem::testing::kEventually;
using idem::testing::Op;
using idem::testing::ThrowsIdem;

class ShutdownTest : public idem::testing::ManualClockStoreTest {};

const std::string kShutDownMessage = "the executor shut down";

AttemptHandle<> acquire(Executor& exec, std::string_view key) {
  auto begun = exec.begin("s", key);
  if (begun.handle() == nullptr) {
    ADD_FAILURE() << "begin did not acquire " << key;
    return {};
  }
  return std::move(*begun.handle());
}

TEST_F(ShutdownTest, NewCallsAreRefusedWithARetryableError) {
  Executor exec(store_);
  exec.shutdown();
  EXPECT_TRUE(exec.is_shut_down());
  try {
    (void)exec.run("s", "k", [](const Attempt&) { return std::string("v"); });
    FAIL() << "run did not throw";
  } catch (const idem::ShutDown& e) {
    EXPECT_EQ(e.code(), ErrorCode::kShutDown);
    EXPECT_TRUE(e.retryable());
    EXPECT_THAT(e.what(), ::testing::HasSubstr("shutting down"));
  }
  EXPECT_THAT([&] { (void)exec.begin("s", "k"); }, ThrowsIdem(ErrorCode::kShutDown));
  EXPECT_EQ(store_->total_calls(), 0u);
  exec.shutdown();  // idempotent
}

TEST_F(ShutdownTest, ARunInFlightFinishesWithinTheTimeout) {
  Executor exec(store_, ExecutorOptions{.shutdown_timeout = 1h});
  Gate started, finish;
  auto run = std::async(std::launch::async, [&] {
    return exec.run("s", "k", [&](const Attempt&) {
      started.open();
      finish.wait();
      return std::string("finished");
    });
  });
  ASSERT_TRUE(started.wait());
  auto stopping = std::async(std::launch::async, [&] { exec.shutdown(); });
  ASSERT_TRUE(eventually([&] { return exec.is_shut_down(); }));
  // The shutdown waits for the call, which still completes normally.
  EXPECT_EQ(stopping.wait_for(20ms), std::future_status::timeout);
  finish.open();
  EXPECT_EQ(run.get().value, "finished");
  EXPECT_EQ(stopping.wait_for(kEventually), std::future_status::ready);
  EXPECT_EQ(memory_->get("s", "k")->payload, "finished");
}

TEST_F(ShutdownTest, DestroyingTheExecutorReleasesARunThatOutlastsTheTimeout) {
  auto exec = std::make_unique<Executor>(store_, ExecutorOptions{.shutdown_timeout = 20ms});
  Gate started;
  bool stop_seen = false;
  bool lost = true;
  auto run = std::async(std::launch::async, [&, &e = *exec] {
    return e.run("s", "k", [&](const Attempt& a) {
      started.open();
      // A cooperative action: it stops when asked.
      stop_seen = eventually([&] { return a.stop_token().stop_requested(); });
      lost = a.lease_lost();
      return std::string("too late");
    });
  });
  ASSERT_TRUE(started.wait());
  // The destructor waits for the run (released after 20 ms, its stop token requested) to
  // leave the executor's code; the run must not touch freed state afterwards.
  exec.reset();
  try {
    (void)run.get();
    FAIL() << "run did not throw";
  } catch (const idem::LeaseLost& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(kShutDownMessage));
    EXPECT_EQ(e.key(), "k");
  }
  EXPECT_TRUE(stop_seen);
  EXPECT_FALSE(lost);  // released by the shutdown, not lost to anybody
  // No stuck key: the next caller starts clean.
  EXPECT_FALSE(memory_->get("s", "k").has_value());
}

TEST_F(ShutdownTest, AnOpenHandleIsReleasedAfterTheTimeoutAndOutlivesTheExecutor) {
  AttemptHandle<> handle;
  {
    Executor exec(store_, ExecutorOptions{.shutdown_timeout = 20ms});
    handle = acquire(exec, "k");
  }
  EXPECT_TRUE(handle.stop_token().stop_requested());
  EXPECT_FALSE(memory_->get("s", "k").has_value());
  EXPECT_THAT([&] { (void)handle.complete("too late"); }, ThrowsIdem(ErrorCode::kLeaseLost));
  EXPECT_FALSE(memory_->get("s", "k").has_value());
  EXPECT_EQ(store_->calls(Op::kComplete), 0u);
}

TEST_F(ShutdownTest, AHandleCompletedDuringTheShutdownIsRecorded) {
  Executor exec(store_, ExecutorOptions{.shutdown_timeout = 1h});
  AttemptHandle handle = acquire(exec, "k");
  auto stopping = std::async(std::launch::async, [&] { exec.shutdown(); });
  ASSERT_TRUE(eventually([&] { return exec.is_shut_down(); }));
  EXPECT_EQ(handle.complete("in time").value, "in time");
  EXPECT_EQ(stopping.wait_for(kEventually), std::future_status::ready);
  EXPECT_EQ(memory_->get("s", "k")->payload, "in time");
}

TEST_F(ShutdownTest, ADuplicateWaitingInMemoryStopsWaiting) {
  Executor exec(store_, ExecutorOptions{.shutdown_timeout = 1h});
  AttemptHandle owner = acquire(exec, "k");
  auto duplicate = std::async(std::launch::async, [&] {
    return exec.run(
        "s", "k", [](const Attempt&) { return std::string(); },
        CallOptions{.wait = WaitPolicy{.max_wait = 1h}});
  });
  ASSERT_TRUE(eventually([&] { return exec.waiting_duplicates() == 1; }));
  auto stopping = std::async(std::launch::async, [&] { exec.shutdown(); });
  EXPECT_THAT([&] { (void)duplicate.get(); }, ThrowsIdem(ErrorCode::kShutDown));
  (void)owner.complete("v");
  EXPECT_EQ(stopping.wait_for(kEventually), std::future_status::ready);
}

TEST_F(ShutdownTest, ADuplicatePollingAnotherProcessStopsWaiting) {
  ASSERT_THAT(memory_->acquire("s", "k", 1h, 2h), IsAcquired());
  Executor exec(store_);
  auto poller = std::async(std::launch::async, [&] {
    return exec.run(
        "s", "k", [](const Attempt&) { return std::string(); },
        CallOptions{.wait = WaitPolicy{.max_wait = 1h, .initial_backoff = 1h, .max_backoff = 1h}});
  });
  // Its first poll found the key busy; it then sleeps for up to an hour, and the shutdown
  // wakes it.
  ASSERT_TRUE(store_->wait_for_calls(Op::kAcquire, 1));
  exec.shutdown();
  EXPECT_THAT([&] { (void)poller.get(); }, ThrowsIdem(ErrorCode::kShutDown));
}

TEST_F(ShutdownTest, AMovedFromExecutorRefusesCalls) {
  Executor a(store_);
  Executor b(std::move(a));
  EXPECT_TRUE(a.is_shut_down());  // NOLINT(bugprone-use-after-move): the moved-from state
  EXPECT_THAT([&] { (void)a.run("s", "k", [](const Attempt&) { return std::string(); }); },
              ThrowsIdem(ErrorCode::kShutDown));
  EXPECT_THROW((void)a.options(), std::logic_error);
  EXPECT_FALSE(b.is_shut_down());
  EXPECT_EQ(b.run("s", "k", [](const Attempt&) { return std::string("v"); }).value, "v");
}

TEST_F(ShutdownTest, MoveAssignmentShutsTheOldExecutorDownFirst) {
  Executor exec(store_, ExecutorOptions{.shutdown_timeout = 20ms});
  AttemptHandle old_handle = acquire(exec, "old");
  exec = Executor(store_);
  // The executor that was replaced released its open handle's lease.
  EXPECT_FALSE(memory_->get("s", "old").has_value());
  EXPECT_THAT([&] { (void)old_handle.complete("v"); }, ThrowsIdem(ErrorCode::kLeaseLost));
  EXPECT_EQ(exec.run("s", "new", [](const Attempt&) { return std::string("v"); }).value, "v");
}

}  // namespace
