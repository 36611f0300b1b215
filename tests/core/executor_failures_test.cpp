// The executor when the store fails: store errors, lost replies, limits and validation.

#include "executor_test.h"

namespace {

using namespace executor_test;

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

INSTANTIATE_TEST_SUITE_P(Ops, LostExtendReplyTest, ::testing::Values(Op::kExtend, Op::kExtendMany),
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
      (void)call(
          exec, c.scope, c.key,
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

}  // namespace
