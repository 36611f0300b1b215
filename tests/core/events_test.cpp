// The executor's event hook (ExecutorOptions::on_event) and the ready counter set on it
// (ExecutorMetrics): every outcome is reported once, with its record, lease and elapsed
// time, whichever thread it happens on.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "idem/executor.h"
#include "idem/metrics.h"
#include "idem/testing/matchers.h"
#include "idem/testing/store_fixtures.h"
#include "support/eventually.h"
#include "support/gate.h"

namespace {

using namespace std::chrono_literals;
using idem::Attempt;
using idem::CallOptions;
using idem::EventKind;
using idem::Executor;
using idem::ExecutorOptions;
using idem::WaitPolicy;
using idem::testing::eventually;
using idem::testing::Gate;
using idem::testing::IsAcquired;
using idem::testing::Op;

// What a hook saw, copied out of the Event's views.
struct Seen {
  EventKind kind;
  std::string scope;
  std::string key;
  idem::Token token;
  std::uint32_t attempt;
  bool has_error;
};

class Recorder {
 public:
  idem::EventHook hook() {
    return [this](const idem::Event& e) {
      std::lock_guard lock(mu_);
      seen_.push_back(Seen{e.kind, std::string(e.scope), std::string(e.key), e.token, e.attempt,
                           e.error != nullptr});
      EXPECT_GE(e.elapsed.count(), 0);
    };
  }
  std::vector<Seen> of(EventKind kind) const {
    std::lock_guard lock(mu_);
    std::vector<Seen> out;
    for (const Seen& s : seen_) {
      if (s.kind == kind) out.push_back(s);
    }
    return out;
  }
  std::size_t size() const {
    std::lock_guard lock(mu_);
    return seen_.size();
  }

 private:
  mutable std::mutex mu_;
  std::vector<Seen> seen_;
};

class EventsTest : public idem::testing::ManualClockStoreTest {
 protected:
  Recorder recorder_;
};

class EventsRealTimeTest : public idem::testing::SystemClockStoreTest {
 protected:
  Recorder recorder_;
};

TEST_F(EventsTest, RanReplayedReleasedAndInProgress) {
  Executor exec(store_, ExecutorOptions{.on_event = recorder_.hook()});
  idem::Token token = 0;
  (void)exec.run("s", "k", [&](const Attempt& a) {
    token = a.token();
    return std::string("v");
  });
  (void)exec.run("s", "k", [](const Attempt&) { return std::string(); });
  EXPECT_THROW(
      (void)exec.run("s", "bad", [](const Attempt&) -> std::string { throw std::exception(); }),
      std::exception);
  ASSERT_THAT(memory_->acquire("s", "busy", 60s, 1h), IsAcquired());
  EXPECT_THROW((void)exec.run("s", "busy", [](const Attempt&) { return std::string(); }),
               idem::InProgress);

  ASSERT_EQ(recorder_.of(EventKind::kRan).size(), 1u);
  const Seen ran = recorder_.of(EventKind::kRan)[0];
  EXPECT_EQ(ran.scope, "s");
  EXPECT_EQ(ran.key, "k");
  EXPECT_EQ(ran.token, token);
  EXPECT_EQ(ran.attempt, 1u);
  ASSERT_EQ(recorder_.of(EventKind::kReplayed).size(), 1u);
  EXPECT_EQ(recorder_.of(EventKind::kReplayed)[0].token, 0u);  // the store does not say
  ASSERT_EQ(recorder_.of(EventKind::kReleased).size(), 1u);
  EXPECT_EQ(recorder_.of(EventKind::kReleased)[0].key, "bad");
  ASSERT_EQ(recorder_.of(EventKind::kInProgress).size(), 1u);
  EXPECT_EQ(recorder_.of(EventKind::kInProgress)[0].key, "busy");
  EXPECT_EQ(recorder_.size(), 4u);
}

TEST_F(EventsTest, FollowedAnInProcessOwner) {
  Executor exec(store_, ExecutorOptions{.on_event = recorder_.hook()});
  auto begun = exec.begin("s", "k");
  auto handle = std::move(*begun.handle());
  auto duplicate = std::async(std::launch::async, [&] {
    return exec.run(
        "s", "k", [](const Attempt&) { return std::string(); },
        CallOptions{.wait = WaitPolicy{.max_wait = 1h}});
  });
  ASSERT_TRUE(eventually([&] { return exec.waiting_duplicates() == 1; }));
  (void)handle.complete("v");
  EXPECT_TRUE(duplicate.get().replayed);
  ASSERT_EQ(recorder_.of(EventKind::kFollowed).size(), 1u);
  // The duplicate knows which lease produced its result.
  EXPECT_EQ(recorder_.of(EventKind::kFollowed)[0].token, handle.token());
}

TEST_F(EventsTest, StolenAndReleasedByAnOversizeResult) {
  Executor exec(store_, ExecutorOptions{.max_payload = 2, .on_event = recorder_.hook()});
  ASSERT_THAT(memory_->acquire("s", "k", 10s, 1h), IsAcquired());
  clock_->advance(10s);
  EXPECT_THROW((void)exec.run("s", "k", [](const Attempt&) { return std::string("big"); }),
               idem::PayloadTooLarge);
  ASSERT_EQ(recorder_.of(EventKind::kStolen).size(), 1u);
  EXPECT_EQ(recorder_.of(EventKind::kStolen)[0].attempt, 2u);
  EXPECT_EQ(recorder_.of(EventKind::kReleased).size(), 1u);
}

TEST_F(EventsTest, AHookThatThrowsIsContained) {
  Executor exec(store_, ExecutorOptions{.on_event = [](const idem::Event&) {
                  throw std::runtime_error("careless hook");
                }});
  EXPECT_EQ(exec.run("s", "k", [](const Attempt&) { return std::string("v"); }).value, "v");
  EXPECT_TRUE(exec.run("s", "k", [](const Attempt&) { return std::string(); }).replayed);
}

TEST_F(EventsRealTimeTest, LeaseLostAndHeartbeatErrorsComeFromTheHeartbeat) {
  Executor exec(store_, ExecutorOptions{.lease = 300ms, .on_event = recorder_.hook()});
  store_->fail_always(Op::kExtend);
  auto lost = exec.begin("s", "lost");
  ASSERT_NE(lost.handle(), nullptr);
  ASSERT_TRUE(eventually([&] { return lost.handle()->lease_lost(); }));
  store_->fail_always(Op::kExtend, false);
  ASSERT_FALSE(recorder_.of(EventKind::kHeartbeatError).empty());
  EXPECT_TRUE(recorder_.of(EventKind::kHeartbeatError)[0].has_error);
  EXPECT_EQ(recorder_.of(EventKind::kHeartbeatError)[0].key, "lost");
  ASSERT_EQ(recorder_.of(EventKind::kLeaseLost).size(), 1u);
  EXPECT_EQ(recorder_.of(EventKind::kLeaseLost)[0].token, lost.handle()->token());

  lost.handle()->release();
}

TEST_F(EventsTest, LeaseLostWhenCompleteIsFenced) {
  Executor exec(store_, ExecutorOptions{.on_event = recorder_.hook()});
  auto forgotten = exec.begin("s", "forgotten");
  ASSERT_TRUE(memory_->forget("s", "forgotten"));
  EXPECT_THROW((void)forgotten.handle()->complete("v"), idem::LeaseLost);
  ASSERT_EQ(recorder_.of(EventKind::kLeaseLost).size(), 1u);
  EXPECT_EQ(recorder_.of(EventKind::kLeaseLost)[0].key, "forgotten");
}

TEST_F(EventsTest, MetricsCountEventsAndRenderPrometheusText) {
  idem::ExecutorMetrics metrics;
  std::size_t passed_on = 0;
  Executor exec(
      store_, ExecutorOptions{.on_event = metrics.hook([&](const idem::Event&) { ++passed_on; })});
  (void)exec.run("s", "a", [](const Attempt&) { return std::string("v"); });
  (void)exec.run("s", "b", [](const Attempt&) { return std::string("v"); });
  (void)exec.run("s", "a", [](const Attempt&) { return std::string(); });
  EXPECT_THROW((void)exec.run("s", "c", [](const Attempt&) -> std::string { throw 1; }), int);

  EXPECT_EQ(metrics.count(EventKind::kRan), 2u);
  EXPECT_EQ(metrics.count(EventKind::kReplayed), 1u);
  EXPECT_EQ(metrics.count(EventKind::kReleased), 1u);
  EXPECT_EQ(passed_on, 4u);
  EXPECT_GE(metrics.action_seconds_sum(), 0.0);
  const std::string text = metrics.prometheus();
  EXPECT_THAT(text, ::testing::HasSubstr("# TYPE idem_calls_total counter\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("idem_calls_total{outcome=\"ran\"} 2\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("idem_calls_total{outcome=\"replayed\"} 1\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("idem_leases_total{event=\"released\"} 1\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("idem_heartbeat_errors_total 0\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("idem_action_seconds_count 2\n"));
  EXPECT_THAT(metrics.prometheus("payments"),
              ::testing::HasSubstr("payments_calls_total{outcome=\"ran\"} 2\n"));
}

}  // namespace
