// The background purger (SPEC §8): deletes what purge may delete, in bounded batches, on an
// interval that stops promptly, reporting store errors and carrying on.

#include "idem/purger.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/stores/memory_store.h"
#include "idem/testing/fault_store.h"
#include "idem/testing/matchers.h"  // gtest printers for the store results (ODR)
#include "support/eventually.h"

namespace {

using namespace std::chrono_literals;
using idem::Purger;
using idem::PurgerOptions;
using idem::testing::eventually;
using idem::testing::FaultStore;
using idem::testing::kEventually;
using idem::testing::Op;

class PurgerTest : public ::testing::Test {
 protected:
  // `n` completed records with a 1 h TTL.
  void complete_records(const std::string& prefix, int n) {
    for (int i = 0; i < n; ++i) {
      const std::string key = prefix + std::to_string(i);
      auto a = std::get<idem::Acquired>(memory_->acquire("s", key, 1min, 1h));
      ASSERT_EQ(memory_->complete("s", key, a.lease.token, "v", 1h), idem::WriteResult::kDone);
    }
  }

  std::shared_ptr<idem::ManualClock> clock_ = std::make_shared<idem::ManualClock>();
  std::shared_ptr<idem::MemoryStore> memory_ =
      std::make_shared<idem::MemoryStore>(idem::MemoryStoreOptions{.clock = clock_});
  std::shared_ptr<FaultStore> store_ = std::make_shared<FaultStore>(memory_);
};

TEST_F(PurgerTest, PurgesExpiredRecordsAndKeepsLiveOnes) {
  complete_records("old", 30);
  clock_->advance(2h);
  complete_records("new", 20);
  // A long-running action whose TTL has passed but whose lease is live is never purged.
  ASSERT_TRUE(std::holds_alternative<idem::Acquired>(memory_->acquire("s", "running", 3h, 1h)));
  clock_->advance(90min);
  complete_records("live", 10);
  ASSERT_TRUE(std::holds_alternative<idem::Acquired>(memory_->acquire("s", "fresh", 1min, 1h)));
  Purger purger(store_, PurgerOptions{.interval = 1h});
  // The background pass and this one share the work; together they delete old and new.
  const std::size_t now = purger.run_once();
  EXPECT_TRUE(eventually([&] { return now + purger.purged() == 50; }));
  EXPECT_FALSE(memory_->get("s", "old0").has_value());
  EXPECT_FALSE(memory_->get("s", "new0").has_value());
  EXPECT_TRUE(memory_->get("s", "live0").has_value());
  EXPECT_EQ(memory_->size(), 12u);
  EXPECT_TRUE(memory_->get("s", "running").has_value());
  EXPECT_TRUE(memory_->get("s", "fresh").has_value());
}

TEST_F(PurgerTest, BackgroundPassRunsAtOnceAndCounts) {
  complete_records("k", 25);
  clock_->advance(2h);
  Purger purger(store_, PurgerOptions{.interval = 1h, .batch = 10});
  EXPECT_TRUE(eventually([&] { return purger.purged() == 25; }));
  EXPECT_EQ(memory_->size(), 0u);
  // Batches of 10: 10, 10, then a short batch of 5 ends the pass.
  EXPECT_EQ(store_->calls(Op::kPurge), 3u);
}

TEST_F(PurgerTest, PassStopsAtMaxBatches) {
  complete_records("k", 50);
  clock_->advance(2h);
  Purger purger(store_, PurgerOptions{.interval = 1h, .batch = 10, .max_batches_per_pass = 2});
  ASSERT_TRUE(eventually([&] { return purger.purged() == 20; }));
  const auto calls = store_->calls(Op::kPurge);
  EXPECT_EQ(calls, 2u);
  EXPECT_EQ(memory_->size(), 30u);
  // On the caller's thread too: at most two batches of ten.
  EXPECT_EQ(purger.run_once(), 20u);
  EXPECT_EQ(memory_->size(), 10u);
}

TEST_F(PurgerTest, TriggerRunsAPassBeforeTheIntervalEnds) {
  Purger purger(store_, PurgerOptions{.interval = 1h});
  ASSERT_TRUE(store_->wait_for_calls(Op::kPurge, 1));
  complete_records("k", 5);
  clock_->advance(2h);
  purger.trigger();
  EXPECT_TRUE(eventually([&] { return purger.purged() == 5; }));
}

TEST_F(PurgerTest, IntervalRunsPassesRepeatedly) {
  Purger purger(store_, PurgerOptions{.interval = 10ms});
  EXPECT_TRUE(store_->wait_for_calls(Op::kPurge, 5));
}

TEST_F(PurgerTest, DestructorStopsPromptlyDuringALongInterval) {
  auto done = std::async(std::launch::async, [&] {
    Purger purger(store_, PurgerOptions{.interval = 24h});
    ASSERT_TRUE(store_->wait_for_calls(Op::kPurge, 1));
  });
  EXPECT_EQ(done.wait_for(kEventually), std::future_status::ready);
}

TEST_F(PurgerTest, DestructorWaitsForAStoreCallInProgress) {
  store_->pause(Op::kPurge);
  auto purger = std::make_unique<Purger>(store_, PurgerOptions{.interval = 24h});
  ASSERT_TRUE(store_->wait_for_blocked(Op::kPurge, 1));
  auto destroyed = std::async(std::launch::async, [&] { purger.reset(); });
  EXPECT_EQ(destroyed.wait_for(50ms), std::future_status::timeout);
  store_->resume(Op::kPurge);
  EXPECT_EQ(destroyed.wait_for(kEventually), std::future_status::ready);
}

TEST_F(PurgerTest, ErrorsAreReportedAndThePurgerKeepsGoing) {
  complete_records("k", 5);
  clock_->advance(2h);
  std::atomic<int> errors{0};
  store_->fail_next(Op::kPurge, 2);
  Purger purger(store_, PurgerOptions{.interval = 5ms, .on_error = [&](const std::exception& e) {
                                        EXPECT_NE(dynamic_cast<const idem::StoreUnavailable*>(&e),
                                                  nullptr);
                                        ++errors;
                                      }});
  EXPECT_TRUE(eventually([&] { return purger.purged() == 5; }));
  EXPECT_EQ(errors.load(), 2);
}

TEST_F(PurgerTest, RunOnceThrowsStoreErrorsToItsCaller) {
  Purger purger(store_, PurgerOptions{.interval = 24h});
  ASSERT_TRUE(store_->wait_for_calls(Op::kPurge, 1));
  store_->fail_next(Op::kPurge);
  EXPECT_THROW(purger.run_once(), idem::StoreUnavailable);
}

TEST_F(PurgerTest, BadOptionsAreRefused) {
  auto argument_of = [&](std::shared_ptr<idem::Store> store, PurgerOptions o) {
    try {
      Purger purger(std::move(store), std::move(o));
    } catch (const idem::InvalidArgument& e) {
      return e.argument();
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(argument_of(nullptr, {}), "store");
  EXPECT_EQ(argument_of(store_, {.interval = 0ms}), "interval");
  EXPECT_EQ(argument_of(store_, {.batch = 0}), "batch");
  EXPECT_EQ(argument_of(store_, {.max_batches_per_pass = 0}), "max_batches_per_pass");
}

}  // namespace
