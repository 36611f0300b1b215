// The executor's duplicates: fingerprints, failing fast, waiting on another process and
// on this one in memory (SPEC §7), and what the caller gets back.

#include "executor_test.h"

namespace {

using namespace executor_test;

// --- fingerprints -----------------------------------------------------------------------

TEST_P(ExecutorFormTest, DifferentFingerprintOnReplayIsKeyReuse) {
  Executor exec(store_);
  (void)call(
      exec, "s", "k", [](const Attempt&) { return std::string("v"); },
      CallOptions{.fingerprint = "A"});
  try {
    (void)call(
        exec, "s", "k", [](const Attempt&) { return std::string("w"); },
        CallOptions{.fingerprint = "B"});
    FAIL() << "run did not throw";
  } catch (const idem::KeyReuse& e) {
    EXPECT_EQ(e.stored_fingerprint(), "A");
    EXPECT_EQ(e.request_fingerprint(), "B");
  }
  auto same = call(
      exec, "s", "k", [](const Attempt&) { return std::string("w"); },
      CallOptions{.fingerprint = "A"});
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
        (void)call(
            exec, "s", "k", [](const Attempt&) { return std::string(); },
            CallOptions{.wait = WaitPolicy{.max_wait = 1h}, .fingerprint = "B"});
      },
      ThrowsIdem(ErrorCode::kKeyReuse));
  EXPECT_EQ(store_->calls(Op::kAcquire), 1u);
}

TEST_P(ExecutorFormTest, DifferentFingerprintFromAnInProcessOwnerIsKeyReuse) {
  Executor exec(store_);
  Gate started, finish;
  auto owner = std::async(std::launch::async, [&] {
    return call(
        exec, "s", "k",
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
        (void)call(
            exec, "s", "k", [](const Attempt&) { return std::string(); },
            CallOptions{.wait = WaitPolicy{.max_wait = 1h}, .fingerprint = "B"});
      },
      ThrowsIdem(ErrorCode::kKeyReuse));
  EXPECT_EQ(store_->total_calls(), calls_before + 1);  // the first ask, no poll
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

TEST_P(ExecutorFormTest, FailFastDuplicateOfAnInProcessOwnerAsksTheStoreOnce) {
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
  EXPECT_EQ(store_->total_calls(), calls_before + 1);  // the first ask, no poll
  finish.open();
  EXPECT_EQ(owner.get().value, "v");
}

// --- waiting without blocking (Executor::watch) -----------------------------------------

// An event loop's duplicate (idem proxy --wait) is told at once when the call of this
// executor that holds its key completes or releases it, and then asks again. The memory
// store cannot notify, so the watch here is the executor's own.
TEST_F(ExecutorTest, AWatchIsToldWhenTheInProcessOwnerCompletesOrReleases) {
  Executor exec(store_);
  for (const bool completes : {true, false}) {
    const std::string key = completes ? "completes" : "releases";
    SCOPED_TRACE(key);
    idem::BeginResult<> begun = exec.begin("s", key);
    ASSERT_NE(begun.handle(), nullptr);
    std::atomic<int> told{0};
    std::unique_ptr<idem::RecordWatch> watch = exec.watch("s", key, [&] { told.fetch_add(1); });
    ASSERT_NE(watch, nullptr);
    EXPECT_EQ(told.load(), 0);
    if (completes) {
      (void)begun.handle()->complete("v");
    } else {
      begun.handle()->release();
    }
    EXPECT_EQ(told.load(), 1);
    idem::BeginResult<> again = exec.begin("s", key);
    if (completes) {
      ASSERT_NE(again.replay(), nullptr);
      EXPECT_EQ(again.replay()->value, "v");
    } else {
      EXPECT_NE(again.handle(), nullptr);
    }
  }
}

TEST_F(ExecutorTest, AWatchEndedBeforeTheOwnerFinishesIsNeverCalled) {
  Executor exec(store_);
  idem::BeginResult<> begun = exec.begin("s", "k");
  ASSERT_NE(begun.handle(), nullptr);
  std::atomic<int> told{0};
  std::atomic<int> kept{0};
  std::unique_ptr<idem::RecordWatch> ended = exec.watch("s", "k", [&] { told.fetch_add(1); });
  std::unique_ptr<idem::RecordWatch> stays = exec.watch("s", "k", [&] { kept.fetch_add(1); });
  ASSERT_NE(ended, nullptr);
  ended.reset();
  (void)begun.handle()->complete("v");
  EXPECT_EQ(told.load(), 0);
  EXPECT_EQ(kept.load(), 1);
}

TEST_F(ExecutorTest, NothingToWatchWithoutAnInProcessOwnerOrAStoreThatNotifies) {
  Executor exec(store_);
  EXPECT_EQ(exec.watch("s", "free", [] {}), nullptr);
  // Held by another process (another executor): only the store could tell, and this one
  // cannot.
  Executor other(store_);
  idem::BeginResult<> begun = other.begin("s", "k");
  ASSERT_NE(begun.handle(), nullptr);
  EXPECT_EQ(exec.watch("s", "k", [] {}), nullptr);
  EXPECT_THAT([&] { (void)exec.watch("s", "k", nullptr); },
              ThrowsIdem(ErrorCode::kInvalidArgument));
  EXPECT_THAT([&] { (void)exec.watch("", "k", [] {}); }, ThrowsIdem(ErrorCode::kInvalidArgument));
}

// --- waiting without blocking (Executor::begin_async) -----------------------------------

// What begin_async's callbacks received, in order.
struct Answers {
  std::mutex mu;
  std::vector<idem::BeginAnswer> got;  // guarded by mu

  idem::Executor::BeginCallback callback() {
    return [this](idem::BeginAnswer a) {
      std::lock_guard lock(mu);
      got.push_back(std::move(a));
    };
  }
  std::size_t size() {
    std::lock_guard lock(mu);
    return got.size();
  }
  // Waits for the n-th answer and takes it.
  idem::BeginResult<> take(std::size_t n = 0) {
    EXPECT_TRUE(eventually([&] { return size() > n; }));
    std::lock_guard lock(mu);
    if (got.size() <= n) throw std::runtime_error("no answer came");
    return std::move(got[n]).get();
  }
};

// A wait that only a wake can end in time: the first poll after the watch began comes
// half an hour later at the earliest.
const WaitPolicy kWaitForAWake{.max_wait = 1h, .initial_backoff = 1h, .max_backoff = 1h};

TEST_F(ExecutorTest, BeginAsyncAnswersAtOnceWhenItNeedNotWait) {
  Executor exec(store_);
  Answers answers;
  std::optional<idem::BeginResult<>> free =
      exec.begin_async("s", "k", CallOptions{.wait = kWaitForAWake}, answers.callback());
  ASSERT_TRUE(free.has_value());
  ASSERT_NE(free->handle(), nullptr);
  // Busy, with no waiting policy: busy at once.
  std::optional<idem::BeginResult<>> busy = exec.begin_async("s", "k", {}, answers.callback());
  ASSERT_TRUE(busy.has_value());
  EXPECT_NE(busy->busy(), nullptr);
  (void)free->handle()->complete("v");
  std::optional<idem::BeginResult<>> replay =
      exec.begin_async("s", "k", CallOptions{.wait = kWaitForAWake}, answers.callback());
  ASSERT_TRUE(replay.has_value());
  ASSERT_NE(replay->replay(), nullptr);
  EXPECT_EQ(replay->replay()->value, "v");
  EXPECT_EQ(answers.size(), 0u);
  EXPECT_EQ(exec.waiting_async(), 0u);
  EXPECT_THAT([&] { (void)exec.begin_async("s", "k", {}, nullptr); },
              ThrowsIdem(ErrorCode::kInvalidArgument));
  EXPECT_THAT([&] { (void)exec.begin_async("", "k", {}, answers.callback()); },
              ThrowsIdem(ErrorCode::kInvalidArgument));
}

// SPEC §7: the duplicate of a call of this executor is answered as soon as that call
// completes (a replay) or releases (the key, acquired), not at its next poll.
TEST_F(ExecutorTest, BeginAsyncIsAnsweredWhenTheInProcessOwnerFinishes) {
  Executor exec(store_);
  for (const bool completes : {true, false}) {
    const std::string key = completes ? "completes" : "releases";
    SCOPED_TRACE(key);
    idem::BeginResult<> owner = exec.begin("s", key);
    ASSERT_NE(owner.handle(), nullptr);
    Answers answers;
    EXPECT_FALSE(exec.begin_async("s", key, CallOptions{.wait = kWaitForAWake}, answers.callback())
                     .has_value());
    EXPECT_EQ(exec.waiting_async(), 1u);
    if (completes) {
      (void)owner.handle()->complete("v");
    } else {
      owner.handle()->release();
    }
    idem::BeginResult<> got = answers.take();
    if (completes) {
      ASSERT_NE(got.replay(), nullptr);
      EXPECT_EQ(got.replay()->value, "v");
    } else {
      ASSERT_NE(got.handle(), nullptr);
      EXPECT_EQ(got.handle()->key(), key);
      (void)got.handle()->complete("mine");
    }
    EXPECT_TRUE(eventually([&] { return exec.waiting_async() == 0; }));
    EXPECT_EQ(answers.size(), 1u);
  }
}

// An owner this executor cannot see (another process; the memory store sends no
// notification) is found finished by the policy's polling.
TEST_F(ExecutorTest, BeginAsyncPollsForAnOwnerItCannotSee) {
  Executor exec(store_);
  Executor other(store_);
  idem::BeginResult<> owner = other.begin("s", "k");
  ASSERT_NE(owner.handle(), nullptr);
  Answers answers;
  const WaitPolicy poll{.max_wait = 1h, .initial_backoff = 1ms, .max_backoff = 2ms};
  EXPECT_FALSE(exec.begin_async("s", "k", CallOptions{.wait = poll}, answers.callback()));
  ASSERT_TRUE(store_->wait_for_calls(idem::testing::Op::kAcquire, 4));
  EXPECT_EQ(answers.size(), 0u);
  (void)owner.handle()->complete("v");
  idem::BeginResult<> got = answers.take();
  ASSERT_NE(got.replay(), nullptr);
  EXPECT_EQ(got.replay()->value, "v");
}

TEST_F(ExecutorTest, BeginAsyncAnswersBusyWhenItsBoundRunsOut) {
  std::mutex mu;
  std::vector<idem::EventKind> events;
  Executor exec(store_, ExecutorOptions{.on_event = [&](const idem::Event& e) {
                  std::lock_guard lock(mu);
                  events.push_back(e.kind);
                }});
  idem::BeginResult<> owner = exec.begin("s", "k");
  ASSERT_NE(owner.handle(), nullptr);
  Answers answers;
  const WaitPolicy briefly{.max_wait = 30ms, .initial_backoff = 1ms, .max_backoff = 5ms};
  EXPECT_FALSE(exec.begin_async("s", "k", CallOptions{.wait = briefly}, answers.callback()));
  idem::BeginResult<> got = answers.take();
  ASSERT_NE(got.busy(), nullptr);
  EXPECT_GT(got.busy()->lease_remaining, Duration::zero());
  std::lock_guard lock(mu);
  // One kInProgress for the call, however many times it asked.
  EXPECT_EQ(std::count(events.begin(), events.end(), idem::EventKind::kInProgress), 1);
}

TEST_F(ExecutorTest, BeginAsyncIsCancelledByItsStopToken) {
  Executor exec(store_);
  idem::BeginResult<> owner = exec.begin("s", "k");
  ASSERT_NE(owner.handle(), nullptr);
  Answers answers;
  std::stop_source stop;
  EXPECT_FALSE(exec.begin_async("s", "k",
                                CallOptions{.wait = kWaitForAWake, .stop_token = stop.get_token()},
                                answers.callback()));
  stop.request_stop();
  idem::BeginResult<> got = answers.take();
  EXPECT_NE(got.busy(), nullptr);
  // Already cancelled: busy at once, nothing left waiting.
  std::optional<idem::BeginResult<>> at_once =
      exec.begin_async("s", "k", CallOptions{.wait = kWaitForAWake, .stop_token = stop.get_token()},
                       answers.callback());
  ASSERT_TRUE(at_once.has_value());
  EXPECT_NE(at_once->busy(), nullptr);
  EXPECT_TRUE(eventually([&] { return exec.waiting_async() == 0; }));
  EXPECT_EQ(answers.size(), 1u);
}

TEST_F(ExecutorTest, BeginAsyncWaitersAreAnsweredShutDownWhenTheExecutorShutsDown) {
  Executor exec(store_, ExecutorOptions{.shutdown_timeout = 0ms});
  idem::BeginResult<> owner = exec.begin("s", "k");
  ASSERT_NE(owner.handle(), nullptr);
  Answers answers;
  EXPECT_FALSE(exec.begin_async("s", "k", CallOptions{.wait = kWaitForAWake}, answers.callback()));
  exec.shutdown();
  ASSERT_EQ(answers.size(), 1u);  // answered before shutdown returned
  EXPECT_THAT([&] { (void)answers.take(); }, ThrowsIdem(ErrorCode::kShutDown));
  EXPECT_THAT([&] { (void)exec.begin_async("s", "k", {}, answers.callback()); },
              ThrowsIdem(ErrorCode::kShutDown));
}

// Many event-loop duplicates of one key, some cancelled while the owner completes: each is
// answered exactly once, with the owner's result unless its cancellation came first. Run
// under ThreadSanitizer by scripts/test.sh.
TEST_F(ExecutorTest, ManyAsyncWaitersOnOneKeyAreEachAnsweredOnce) {
  constexpr int kWaiters = 200;
  Executor exec(store_);
  idem::BeginResult<> owner = exec.begin("s", "k");
  ASSERT_NE(owner.handle(), nullptr);
  std::mutex mu;
  std::vector<int> calls(kWaiters, 0);         // guarded by mu
  std::vector<std::string> outcome(kWaiters);  // guarded by mu
  std::vector<std::stop_source> stops(kWaiters);
  for (int i = 0; i < kWaiters; ++i) {
    const auto done = [&, i](idem::BeginAnswer a) {
      idem::BeginResult<> r = std::move(a).get();
      std::lock_guard lock(mu);
      ++calls[i];
      outcome[i] = r.replay() != nullptr ? r.replay()->value : r.busy() != nullptr ? "busy" : "?";
    };
    EXPECT_FALSE(exec.begin_async(
        "s", "k", CallOptions{.wait = kWaitForAWake, .stop_token = stops[i].get_token()}, done));
  }
  std::thread canceller([&] {
    for (int i = 0; i < kWaiters; i += 3) stops[i].request_stop();
  });
  (void)owner.handle()->complete("v");
  canceller.join();
  EXPECT_TRUE(eventually([&] { return exec.waiting_async() == 0; }));
  std::lock_guard lock(mu);
  for (int i = 0; i < kWaiters; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(calls[i], 1);
    if (i % 3 == 0) {
      EXPECT_THAT(outcome[i], ::testing::AnyOf("busy", "v"));
    } else {
      EXPECT_EQ(outcome[i], "v");
    }
  }
}

// SPEC §7: begin_async waits on an owner of this executor in memory, as a blocking call
// does: the owner's result comes from memory, with the token of the lease that produced it,
// and the store is not asked again.
TEST_F(ExecutorTest, BeginAsyncGetsAnInProcessOwnersResultFromMemory) {
  Executor exec(store_);
  idem::BeginResult<> owner = exec.begin("s", "k");
  ASSERT_NE(owner.handle(), nullptr);
  const idem::Token token = owner.handle()->token();
  Answers answers;
  EXPECT_FALSE(exec.begin_async("s", "k", CallOptions{.wait = kWaitForAWake}, answers.callback()));
  EXPECT_EQ(exec.waiting_duplicates(), 1u);
  const auto acquires = store_->calls(Op::kAcquire);
  (void)owner.handle()->complete("v");
  idem::BeginResult<> got = answers.take();
  ASSERT_NE(got.replay(), nullptr);
  EXPECT_EQ(got.replay()->value, "v");
  EXPECT_TRUE(got.replay()->replayed);
  EXPECT_EQ(got.replay()->token, token);
  EXPECT_EQ(store_->calls(Op::kAcquire), acquires);
  EXPECT_EQ(exec.waiting_duplicates(), 0u);
}

// SPEC §7: blocking and event-loop duplicates are one mechanism: in one process, whichever
// came first polls the store for a key held elsewhere, and the others, of either kind,
// wait on it in memory and get its answer.
TEST_F(ExecutorTest, BlockingAndAsyncDuplicatesOfAnotherProcessesOwnerShareOnePoller) {
  for (const bool async_polls : {true, false}) {
    SCOPED_TRACE(async_polls ? "begin_async polls" : "a blocking call polls");
    const std::string key = async_polls ? "async first" : "blocking first";
    Executor process_a(store_);
    Executor process_b(store_);
    idem::BeginResult<> owner = process_a.begin("s", key);
    ASSERT_NE(owner.handle(), nullptr);
    const WaitPolicy poll{.max_wait = 1h, .initial_backoff = 5ms, .max_backoff = 5ms};
    Answers answers;
    std::vector<std::future<idem::BeginResult<>>> blocking;
    const auto start_blocking = [&] {
      blocking.push_back(std::async(std::launch::async, [&] {
        return process_b.begin("s", key, CallOptions{.wait = poll});
      }));
    };
    if (async_polls) {
      EXPECT_FALSE(process_b.begin_async("s", key, CallOptions{.wait = poll}, answers.callback()));
      // Its first turn on the queue lists it as the key's poller.
      ASSERT_TRUE(store_->wait_for_calls(Op::kAcquire, store_->calls(Op::kAcquire) + 2));
      start_blocking();
      start_blocking();
    } else {
      start_blocking();
      ASSERT_TRUE(store_->wait_for_calls(Op::kAcquire, store_->calls(Op::kAcquire) + 2));
      EXPECT_FALSE(process_b.begin_async("s", key, CallOptions{.wait = poll}, answers.callback()));
      start_blocking();
    }
    // One of the three polls; the other two wait on it in memory.
    const bool two_in_memory = eventually([&] { return process_b.waiting_duplicates() == 2; });
    (void)owner.handle()->complete("from a");
    idem::BeginResult<> async_got = answers.take();
    ASSERT_NE(async_got.replay(), nullptr);
    EXPECT_EQ(async_got.replay()->value, "from a");
    for (auto& b : blocking) {
      idem::BeginResult<> r = b.get();
      ASSERT_NE(r.replay(), nullptr);
      EXPECT_EQ(r.replay()->value, "from a");
    }
    EXPECT_TRUE(two_in_memory);
    EXPECT_EQ(process_b.waiting_duplicates(), 0u);
    EXPECT_TRUE(eventually([&] { return process_b.waiting_async() == 0; }));
  }
}

// A begin_async that polls for the key and is cancelled hands the polling on: the blocking
// duplicate that followed it goes back to the store and is answered.
TEST_F(ExecutorTest, ACancelledAsyncPollerHandsThePollingToItsFollowers) {
  Executor process_a(store_);
  Executor process_b(store_);
  idem::BeginResult<> owner = process_a.begin("s", "k");
  ASSERT_NE(owner.handle(), nullptr);
  const WaitPolicy poll{.max_wait = 1h, .initial_backoff = 5ms, .max_backoff = 5ms};
  Answers answers;
  std::stop_source stop;
  EXPECT_FALSE(process_b.begin_async(
      "s", "k", CallOptions{.wait = poll, .stop_token = stop.get_token()}, answers.callback()));
  // Its third ask comes after it listed itself as the key's poller.
  ASSERT_TRUE(store_->wait_for_calls(Op::kAcquire, store_->calls(Op::kAcquire) + 2));
  auto blocking = std::async(std::launch::async,
                             [&] { return process_b.begin("s", "k", CallOptions{.wait = poll}); });
  ASSERT_TRUE(eventually([&] { return process_b.waiting_duplicates() == 1; }));
  stop.request_stop();
  EXPECT_NE(answers.take().busy(), nullptr);
  // The follower polls for itself now.
  ASSERT_TRUE(store_->wait_for_calls(Op::kAcquire, store_->calls(Op::kAcquire) + 2));
  (void)owner.handle()->complete("from a");
  idem::BeginResult<> r = blocking.get();
  ASSERT_NE(r.replay(), nullptr);
  EXPECT_EQ(r.replay()->value, "from a");
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
    return call(
        process_b, "s", "k", [](const Attempt&) { return std::string("from b"); },
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
    return call(
        process_b, "s", "k",
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
    return call(
        exec, "s", "k",
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
    (void)call(
        exec, "s", "k", [](const Attempt&) { return std::string(); },
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
    return call(
        exec, "s", "k", [](const Attempt& a) { return std::to_string(a.number()); },
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
    return call(
        exec, "s", "k", [&](const Attempt&) { return std::string("dup"); },
        CallOptions{.wait =
                        WaitPolicy{.max_wait = 1h, .initial_backoff = 1ms, .max_backoff = 1ms}});
  });
  ASSERT_TRUE(eventually([&] { return exec.waiting_duplicates() == 1; }));
  // With a 1 ms backoff a polling waiter would have called acquire many times by now.
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(store_->calls(Op::kAcquire), 2u);  // the owner's and the first ask
  finish.open();
  auto r = duplicate.get();
  EXPECT_TRUE(r.replayed);
  EXPECT_EQ(r.value, "v");
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(store_->calls(Op::kAcquire), 2u);  // no poll while it waited
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
    return call(
        exec, "s", "k",
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
        (void)call(
            exec, "s", "k", [](const Attempt&) { return std::string(); },
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
      return call(
          process_b, "s", "k",
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
    return call(
        exec, "s", "k", [](const Attempt&) { return std::string(); },
        CallOptions{.wait =
                        WaitPolicy{.max_wait = 200ms, .initial_backoff = 5ms, .max_backoff = 5ms}});
  });
  // Its second poll comes after it listed itself as the key's poller and slept once (its
  // 200 ms bound allows no more on a loaded machine).
  ASSERT_TRUE(store_->wait_for_calls(Op::kAcquire, 2));
  auto long_wait = std::async(std::launch::async, [&] {
    return call(
        exec, "s", "k", [](const Attempt& a) { return std::to_string(a.number()); },
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
      return call(
          exec, "s", "k",
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

}  // namespace

namespace {

using namespace executor_test;

// Issue 36: an in-process owner whose record an operator forgot is not followed in memory:
// the next caller in the same executor asks the store first and acquires at once, as a
// caller in another executor does; the old owner is fenced at its complete.
TEST(ExecutorInMemoryWait, AForgottenRecordIsNotHeldBusyByAnInProcessOwner) {
  auto memory = std::make_shared<idem::MemoryStore>();
  Executor exec(memory);
  auto first = exec.begin("s", "k");
  ASSERT_EQ(first.kind(), idem::BeginKind::kAcquired);
  ASSERT_TRUE(memory->forget("s", "k"));
  auto second = exec.begin("s", "k");
  ASSERT_EQ(second.kind(), idem::BeginKind::kAcquired)
      << "the executor's memory outlived the record";
  Executor other(memory);
  EXPECT_EQ(other.begin("s", "k").kind(), idem::BeginKind::kBusy);
  EXPECT_THROW(first.handle()->complete("old"), idem::LeaseLost);
  EXPECT_EQ(second.handle()->complete("new").value, "new");
  EXPECT_EQ(exec.run("s", "k", [](const Attempt&) { return std::string("x"); }).value, "new");
}

}  // namespace
