// What a user of the installed testing kit writes (docs/testing.md): the store conformance
// suite run on a store (the in-memory one, standing in for a store of the user's own), and
// tests of the user's own code over idem with FaultStore and the matchers. Built against
// the installed package by tests/CMakeLists.txt (install_testing_kit).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <idem/idem.h>
#include <idem/testing/fault_store.h>
#include <idem/testing/matchers.h>
#include <idem/testing/store_conformance.h>
#include <idem/testing/store_fixtures.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>

// ---- the shared suite on a store ----

IDEM_INSTANTIATE_STORE_CONFORMANCE(
    Memory,
    idem::testing::StoreTestContext{
        .name = "memory",
        .make = [](std::shared_ptr<idem::ManualClock> clock) -> std::shared_ptr<idem::Store> {
          return std::make_shared<idem::MemoryStore>(idem::MemoryStoreOptions{.clock = clock});
        },
        .fake_clock = true});

// The suite is in a static library: every one of its tests must have been linked.
TEST(Kit, EveryTestOfTheSuiteIsLinked) {
  EXPECT_EQ(idem::testing::instantiated_conformance_tests("Memory"),
            idem::testing::store_conformance_test_count());
  EXPECT_GT(idem::testing::store_conformance_test_count(), 50);
}

// ---- the user's own code over idem ----

// Charges an order at most once per order id; says how the call went.
std::string charge(idem::Executor& executor, const std::string& order, int& charges) {
  try {
    auto r = executor.run("orders", order, [&](const idem::Attempt&) {
      ++charges;
      return std::string("charged ") + order;
    });
    return r.replayed ? "replayed: " + r.value : r.value;
  } catch (const idem::InProgress&) {
    return "busy";
  }
}

using idem::testing::HasValue;
using idem::testing::IsFresh;
using idem::testing::IsReplayed;
using idem::testing::ThrowsIdem;

class ChargeTest : public idem::testing::ManualClockStoreTest {};

TEST_F(ChargeTest, ADuplicateIsReplayed) {
  idem::Executor executor(store_);
  int charges = 0;
  EXPECT_EQ(charge(executor, "o1", charges), "charged o1");
  EXPECT_EQ(charge(executor, "o1", charges), "replayed: charged o1");
  EXPECT_EQ(charges, 1);
  EXPECT_THAT(executor.run("orders", "o1", [](const idem::Attempt&) { return std::string("x"); }),
              testing::AllOf(IsReplayed(), HasValue("charged o1")));
}

TEST_F(ChargeTest, ADuplicateWhileTheFirstRunsIsBusy) {
  // Two executors: two processes, as far as the store can tell.
  idem::Executor first(store_);
  idem::Executor second(store_);
  int charges = 0;
  // The first run blocks in complete, its lease live; the duplicate finds it Busy.
  store_->pause(idem::testing::Op::kComplete);
  auto running = std::async(std::launch::async, [&] { return charge(first, "o2", charges); });
  ASSERT_TRUE(store_->wait_for_blocked(idem::testing::Op::kComplete, 1));
  int second_charges = 0;
  EXPECT_EQ(charge(second, "o2", second_charges), "busy");
  EXPECT_EQ(second_charges, 0);
  store_->resume(idem::testing::Op::kComplete);
  EXPECT_EQ(running.get(), "charged o2");
}

TEST_F(ChargeTest, ALostLeaseIsNotRecorded) {
  idem::Executor first(store_);
  idem::Executor second(store_);
  // While the first run's action works, its lease ends (the clock jumps past it) and
  // another caller steals the key and completes it: the first run's result is fenced.
  auto action = [&](const idem::Attempt&) {
    clock_->advance(std::chrono::minutes(5));
    EXPECT_THAT(second.run("orders", "o3", [](const idem::Attempt&) { return std::string("B"); }),
                IsFresh());
    return std::string("A");
  };
  EXPECT_THAT([&] { first.run("orders", "o3", action); }, ThrowsIdem(idem::ErrorCode::kLeaseLost));
  EXPECT_THAT(store_->acquire("orders", "o3", std::chrono::seconds(30), std::chrono::hours(1)),
              idem::testing::IsReplay("B"));
}

TEST_F(ChargeTest, AStoreThatCannotBeReachedIsReported) {
  idem::Executor executor(store_);
  store_->fail_next(idem::testing::Op::kAcquire);
  int charges = 0;
  EXPECT_THAT([&] { charge(executor, "o4", charges); },
              ThrowsIdem(idem::ErrorCode::kStoreUnavailable));
  EXPECT_EQ(charges, 0);
}

int main(int argc, char** argv) {
  testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
