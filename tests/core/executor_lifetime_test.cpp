// The executor over time: cancellation, the heartbeat as the action sees it, and the
// executor's own lifetime.

#include "executor_test.h"

namespace {

using namespace executor_test;

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
          [&] {
            (void)call(other_process, "s", "k", [](const Attempt&) { return std::string(); });
          },
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
