// Lost replies (issue 9): a call that reached the store and took effect, whose reply never
// came back, so the caller repeats it. A store cannot tell a repeat from a first call, so
// each test makes the first call, drops its answer, and checks what the repeat gets:
// complete is done and changes nothing; release and extend do no harm and give a clear
// answer; acquire shows the caller its own orphaned lease as busy until it can be stolen;
// forget and purge delete nothing more.

#include <gmock/gmock.h>

#include <string>
#include <vector>

#include "idem/testing/matchers.h"
#include "idem/testing/store_conformance.h"

namespace idem::testing {
namespace {

TEST_P(StoreConformance, AcquireRepeatedAfterLostReplyIsBusyOnItsOwnLeaseThenSteals) {
  // The first acquire's reply is lost: the caller never learns its token.
  (void)store().acquire("s", "k", ticks(2), live());
  const Record orphan = expect_record("s", "k");
  ASSERT_EQ(orphan.state, RecordState::kInProgress);

  // SPEC §4: the repeat finds a live lease and cannot tell it is its own.
  const AcquireResult again = store().acquire("s", "k", ticks(2), live());
  ASSERT_THAT(again, IsBusy());
  expect_same_instant(std::get<Busy>(again).lease_expires_at, orphan.lease_expires_at,
                      "lease_expires_at");
  expect_same_record(orphan, expect_record("s", "k"));

  // Once the orphan's lease passes, a repeat steals it: attempt 2, a greater token.
  pass(ticks(3));
  const Acquired stolen = expect_acquired(store().acquire("s", "k", live(), live()), "steal");
  EXPECT_TRUE(stolen.stolen);
  EXPECT_EQ(stolen.lease.attempt, 2u);
  EXPECT_GT(stolen.lease.token, orphan.token);
}

TEST_P(StoreConformance, CompleteRepeatedAfterLostReplyPastTheLeaseIsDoneAndChangesNothing) {
  const Lease lease = acquire_fresh("s", "k", ticks(2), live());
  (void)store().complete("s", "k", lease.token, "first", live());  // reply lost
  const Record before = expect_record("s", "k");
  ASSERT_EQ(before.state, RecordState::kComplete);

  // The caller retries late, after its lease deadline: still done, nothing changed.
  pass(ticks(3));
  EXPECT_THAT(store().complete("s", "k", lease.token, "first", live()), IsDone());
  EXPECT_THAT(store().complete("s", "k", lease.token, "other bytes", ticks(1)), IsDone());
  expect_same_record(before, expect_record("s", "k"));
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsReplay("first"));
}

TEST_P(StoreConformance, ReleaseRepeatedAfterLostReplyIsFencedAndCreatesNothing) {
  const Lease lease = acquire_fresh("s", "k", live(), live());
  (void)store().release("s", "k", lease.token);  // reply lost

  // SPEC §4: the record is gone; the repeat is a clear "fenced" and writes nothing.
  EXPECT_THAT(store().release("s", "k", lease.token), IsFenced());
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
  const Acquired next = expect_acquired(store().acquire("s", "k", live(), live()), "next");
  EXPECT_FALSE(next.stolen);
  EXPECT_EQ(next.lease.attempt, 1u);
}

TEST_P(StoreConformance, ReleaseRepeatedAfterLostReplyLeavesTheNextOwnerAlone) {
  const Lease first = acquire_fresh("s", "k", live(), live());
  (void)store().release("s", "k", first.token);  // reply lost
  const Lease second = acquire_fresh("s", "k", live(), live());
  const Record before = expect_record("s", "k");

  EXPECT_THAT(store().release("s", "k", first.token), IsFenced());
  expect_same_record(before, expect_record("s", "k"));
  EXPECT_THAT(store().complete("s", "k", second.token, "second", live()), IsDone());
  // And after the next owner completed, the stale repeat is still fenced and harmless.
  const Record done = expect_record("s", "k");
  EXPECT_THAT(store().release("s", "k", first.token), IsFenced());
  expect_same_record(done, expect_record("s", "k"));
}

TEST_P(StoreConformance, ExtendRepeatedAfterLostReplyIsDoneAndKeepsExpiresAt) {
  const Lease lease = acquire_fresh("s", "k", ticks(4), ticks(50));
  pass(ticks(1));
  (void)store().extend("s", "k", lease.token, ticks(4));  // reply lost
  const Record extended = expect_record("s", "k");

  const ExtendResult again = store().extend("s", "k", lease.token, ticks(4));
  ASSERT_THAT(again, IsDone());
  // SPEC §4: the repeat pushes the deadline from its own now; expires_at never moves.
  EXPECT_GE(again.lease_expires_at, extended.lease_expires_at);
  const Record after = expect_record("s", "k");
  EXPECT_EQ(after.token, lease.token);
  EXPECT_EQ(after.attempt, 1u);
  expect_same_instant(after.expires_at, lease.expires_at, "expires_at");
  // Extending earned nothing the lease could not use: it completes as usual.
  EXPECT_THAT(store().complete("s", "k", lease.token, "v", live()), IsDone());
}

TEST_P(StoreConformance, ExtendRepeatedAfterLostReplyOnATakenOverKeyIsFenced) {
  const Lease old = acquire_fresh("s", "k", ticks(2), live());
  pass(ticks(1));
  (void)store().extend("s", "k", old.token, ticks(2));  // reply lost
  // The owner, never hearing back, stops extending; its lease passes and is stolen.
  pass(ticks(3));
  const Acquired thief = expect_acquired(store().acquire("s", "k", live(), live()), "steal");
  ASSERT_TRUE(thief.stolen);
  const Record before = expect_record("s", "k");

  EXPECT_THAT(store().extend("s", "k", old.token, live()), IsFenced());
  expect_same_record(before, expect_record("s", "k"));
}

TEST_P(StoreConformance, ExtendManyRepeatedAfterLostReplyIsDoneForEachLease) {
  const Lease a = acquire_fresh("s", "a", ticks(4), live());
  const Lease b = acquire_fresh("s", "b", ticks(4), live());
  const std::vector<ExtendRequest> batch{{"s", "a", a.token, ticks(4)},
                                         {"s", "b", b.token, ticks(4)}};
  (void)store().extend_many(batch);  // reply lost
  const std::vector<ExtendResult> again = store().extend_many(batch);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_THAT(again[0], IsDone());
  EXPECT_THAT(again[1], IsDone());
  EXPECT_THAT(store().get("s", "a"), IsInProgressWith(a.token));
  EXPECT_THAT(store().get("s", "b"), IsInProgressWith(b.token));
}

TEST_P(StoreConformance, ForgetRepeatedAfterLostReplyDeletesNothingMore) {
  acquire_and_complete("s", "k", "v", live());
  acquire_and_complete("s", "other", "w", live());
  const Record other = expect_record("s", "other");
  (void)store().forget("s", "k");  // reply lost

  EXPECT_FALSE(store().forget("s", "k"));
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
  expect_same_record(other, expect_record("s", "other"));
}

TEST_P(StoreConformance, PurgeRepeatedAfterLostReplyDeletesNothingMore) {
  acquire_and_complete("s", "expired", "a", ticks(2));
  acquire_and_complete("s", "live", "b", live());
  const Record live_before = expect_record("s", "live");
  pass(ticks(3));
  (void)store().purge(100);  // reply lost

  // Nothing eligible is left, and the live record is untouched.
  EXPECT_EQ(store().purge(100), 0u);
  EXPECT_EQ(store().get("s", "expired"), std::nullopt);
  expect_same_record(live_before, expect_record("s", "live"));
}

}  // namespace
}  // namespace idem::testing
