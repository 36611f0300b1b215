// SPEC §4 and §8, purge, get and forget: what each deletes or reports, and what it leaves
// alone.

#include <gmock/gmock.h>

#include <string>
#include <vector>

#include "idem/testing/matchers.h"
#include "idem/testing/store_conformance.h"

namespace idem::testing {
namespace {

// ---- purge ----

TEST_P(StoreConformance, PurgeOnEmptyStoreDeletesNothing) { EXPECT_EQ(store().purge(100), 0u); }

TEST_P(StoreConformance, PurgeDeletesExpiredCompleteAndKeepsLiveOne) {
  acquire_and_complete("s", "expired", "a", ticks(2));
  acquire_and_complete("s", "live", "b", live());
  const Record live_before = expect_record("s", "live");
  pass(ticks(3));

  const std::size_t purged = store().purge(100);
  if (native_expiry()) {
    EXPECT_LE(purged, 1u);
  } else {
    EXPECT_EQ(purged, 1u);
  }
  EXPECT_EQ(store().get("s", "expired"), std::nullopt);
  expect_same_record(live_before, expect_record("s", "live"));
  EXPECT_EQ(store().purge(100), 0u);
}

TEST_P(StoreConformance, PurgeKeepsExtendedInProgressPastItsTtl) {
  const Lease lease = acquire_fresh("s", "k", ticks(10), ticks(2));
  pass(ticks(3));
  // SPEC §4: the TTL passed but the lease is live, so purge must keep the record.
  EXPECT_EQ(store().purge(100), 0u);
  EXPECT_THAT(store().get("s", "k"), IsInProgressWith(lease.token));

  // A long-running action keeps heartbeating; it is never purged while it does.
  ASSERT_THAT(store().extend("s", "k", lease.token, ticks(10)), IsDone());
  pass(ticks(3));
  EXPECT_EQ(store().purge(100), 0u);
  EXPECT_THAT(store().get("s", "k"), IsInProgressWith(lease.token));

  // Once the heartbeat stops and the lease passes too, the record goes.
  pass(ticks(8));
  const std::size_t purged = store().purge(100);
  if (!native_expiry()) {
    EXPECT_EQ(purged, 1u);
  }
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
  EXPECT_THAT(store().complete("s", "k", lease.token, "late", live()), IsFenced());
}

TEST_P(StoreConformance, LongRunningOwnerPastItsTtlCanComplete) {
  const Lease lease = acquire_fresh("s", "k", ticks(10), ticks(2));
  pass(ticks(3));
  EXPECT_EQ(store().purge(100), 0u);
  ASSERT_THAT(store().complete("s", "k", lease.token, "finally", live()), IsDone());
  EXPECT_EQ(store().purge(100), 0u);
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsReplay("finally"));
}

TEST_P(StoreConformance, PurgeKeepsAbandonedInProgressUntilItsTtlPasses) {
  const Lease first = acquire_fresh("s", "k", ticks(2), ticks(6));
  pass(ticks(3));
  // SPEC §4: the lease passed but the TTL did not; the record waits to be stolen.
  EXPECT_EQ(store().purge(100), 0u);
  EXPECT_THAT(store().get("s", "k"), IsInProgressWith(first.token));

  pass(ticks(4));
  // SPEC §4: now both deadlines passed, so it is purged; the key is then unused.
  const std::size_t purged = store().purge(100);
  if (!native_expiry()) {
    EXPECT_EQ(purged, 1u);
  }
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
  const AcquireResult r = store().acquire("s", "k", live(), live());
  ASSERT_THAT(r, IsFreshlyAcquired());
  EXPECT_GT(std::get<Acquired>(r).lease.token, first.token);
}

TEST_P(StoreConformance, PurgeLimitBoundsEachCallAndRepeatedCallsFinish) {
  constexpr int kExpired = 10;
  for (int i = 0; i < kExpired; ++i) {
    acquire_and_complete("s", "expired-" + std::to_string(i), "p", ticks(2));
  }
  acquire_and_complete("s", "live", "kept", live());
  pass(ticks(3));

  // SPEC §4: at most `limit` per call; successive calls finish the job. A call that comes
  // back short means nothing is left to purge: the purger (purger.h) ends its pass on one.
  std::size_t total = 0;
  for (int call = 0; call < 2 * kExpired; ++call) {
    const std::size_t purged = store().purge(3);
    EXPECT_LE(purged, 3u);
    if (!native_expiry() && total + 3 <= kExpired) {
      EXPECT_EQ(purged, 3u);
    }
    total += purged;
    if (purged == 0) break;
  }
  if (!native_expiry()) {
    EXPECT_EQ(total, static_cast<std::size_t>(kExpired));
  }
  EXPECT_EQ(store().purge(3), 0u);
  for (int i = 0; i < kExpired; ++i) {
    EXPECT_EQ(store().get("s", "expired-" + std::to_string(i)), std::nullopt) << i;
  }
  EXPECT_THAT(store().acquire("s", "live", live(), live()), IsReplay("kept"));
}

TEST_P(StoreConformance, PurgeWithLimitOneDeletesOneAtATime) {
  for (int i = 0; i < 3; ++i) acquire_and_complete("s", std::to_string(i), "p", ticks(2));
  pass(ticks(3));
  if (native_expiry()) {
    EXPECT_LE(store().purge(1), 1u);
  } else {
    EXPECT_EQ(store().purge(1), 1u);
    EXPECT_EQ(store().purge(1), 1u);
    EXPECT_EQ(store().purge(1), 1u);
  }
  EXPECT_EQ(store().purge(1), 0u);
}

TEST_P(StoreConformance, PurgeTouchesNothingElse) {
  // One record of every kind purge must keep (SPEC §4), and one it must delete.
  const Lease held = acquire_fresh("s", "held", live(), live());
  const Token done = acquire_and_complete("s", "done", "kept", live());
  const Lease abandoned = acquire_fresh("s", "abandoned", ticks(2), live());
  const Lease overdue = acquire_fresh("s", "overdue", live(), ticks(2));
  acquire_and_complete("s", "expired", "gone", ticks(2));
  pass(ticks(3));
  std::vector<Record> before;
  for (const char* key : {"held", "done", "abandoned", "overdue"}) {
    before.push_back(expect_record("s", key));
  }

  const std::size_t purged = store().purge(100);
  if (!native_expiry()) {
    EXPECT_EQ(purged, 1u);
  }
  EXPECT_EQ(store().get("s", "expired"), std::nullopt);
  int i = 0;
  for (const char* key : {"held", "done", "abandoned", "overdue"}) {
    SCOPED_TRACE(key);
    expect_same_record(before[i++], expect_record("s", key));
  }
  EXPECT_THAT(store().get("s", "held"), IsInProgressWith(held.token));
  EXPECT_THAT(store().get("s", "done"), IsCompleteWith(done));
  EXPECT_THAT(store().get("s", "abandoned"), IsInProgressWith(abandoned.token));
  EXPECT_THAT(store().get("s", "overdue"), IsInProgressWith(overdue.token));
}

TEST_P(StoreConformance, PurgeDeletesExactlyAtTheDeadlines) {
  if (!fake_clock()) GTEST_SKIP() << "exact boundaries need a fake clock";
  acquire_and_complete("s", "done", "p", ticks(2));
  acquire_fresh("s", "abandoned", ticks(2), ticks(2));
  pass(ticks(2) - Duration{1});
  EXPECT_EQ(store().purge(100), 0u);
  // SPEC §4: expires_at <= now (and lease_expires_at <= now) make a record purgeable.
  pass(Duration{1});
  EXPECT_EQ(store().purge(100), 2u);
}

// ---- get ----

TEST_P(StoreConformance, GetOnAbsentKeyReturnsNothingAndCreatesNothing) {
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsFreshlyAcquired());
}

TEST_P(StoreConformance, GetReportsCompleteFields) {
  const Lease lease = acquire_fresh("s", "k", live(), live(), "fp");
  pass(ticks(1));
  ASSERT_THAT(store().complete("s", "k", lease.token, "payload", ticks(20)), IsDone());
  pass(ticks(1));
  const Record rec = expect_record("s", "k");
  EXPECT_EQ(rec.state, RecordState::kComplete);
  EXPECT_EQ(rec.token, lease.token);
  EXPECT_EQ(rec.payload, "payload");
  EXPECT_EQ(rec.fingerprint, std::optional<std::string>("fp"));
  expect_same_instant(rec.expires_at, rec.completed_at + ticks(20), "expires_at");
  // Record::now is the store's clock at the snapshot.
  EXPECT_GE(rec.now - rec.completed_at, ticks(1));
  if (fake_clock()) {
    EXPECT_EQ(rec.now, now());
    EXPECT_EQ(rec.completed_at, now() - ticks(1));
  }
}

TEST_P(StoreConformance, GetReportsStoreClockAsTimePasses) {
  acquire_fresh("s", "k", live(), live());
  const Record first = expect_record("s", "k");
  pass(ticks(2));
  const Record second = expect_record("s", "k");
  EXPECT_GE(second.now - first.now, ticks(2));
  EXPECT_GE(first.now, first.acquired_at);
  if (fake_clock()) {
    EXPECT_EQ(second.now, now());
  }
}

TEST_P(StoreConformance, GetIsReadOnly) {
  const Lease live_lease = acquire_fresh("s", "held", live(), live());
  const Lease stale = acquire_fresh("s", "abandoned", ticks(2), live());
  acquire_and_complete("s", "expired", "old", ticks(2));
  pass(ticks(3));

  // SPEC §4: get changes nothing: it does not extend, steal, replace or purge.
  const Record held = expect_record("s", "held");
  const Record abandoned = expect_record("s", "abandoned");
  expect_same_record(held, expect_record("s", "held"));
  expect_same_record(abandoned, expect_record("s", "abandoned"));
  EXPECT_EQ(abandoned.token, stale.token);
  EXPECT_LE(abandoned.lease_expires_at, abandoned.now);
  EXPECT_EQ(held.token, live_lease.token);
  if (!native_expiry()) {
    // Store interface: an expired record not yet purged is returned as it is.
    const Record expired = expect_record("s", "expired");
    EXPECT_EQ(expired.state, RecordState::kComplete);
    EXPECT_EQ(expired.payload, "old");
    EXPECT_LE(expired.expires_at, expired.now);
    EXPECT_EQ(store().purge(100), 1u);
  }
  EXPECT_THAT(store().acquire("s", "abandoned", live(), live()), IsStolen(2));
  EXPECT_THAT(store().acquire("s", "held", live(), live()), IsBusy());
}

// ---- forget ----

TEST_P(StoreConformance, ForgetDeletesInProgressAndFencesOwner) {
  const Lease lease = acquire_fresh("s", "k", live(), live());
  EXPECT_TRUE(store().forget("s", "k"));
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
  // SPEC §4: the current owner is fenced, and nothing it does brings the record back.
  EXPECT_THAT(store().complete("s", "k", lease.token, "x", live()), IsFenced());
  EXPECT_THAT(store().extend("s", "k", lease.token, live()), IsFenced());
  EXPECT_THAT(store().release("s", "k", lease.token), IsFenced());
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
  const AcquireResult r = store().acquire("s", "k", live(), live());
  ASSERT_THAT(r, IsFreshlyAcquired());
  EXPECT_GT(std::get<Acquired>(r).lease.token, lease.token);
}

TEST_P(StoreConformance, ForgetDeletesCompleteRecord) {
  acquire_and_complete("s", "k", "p", live());
  EXPECT_TRUE(store().forget("s", "k"));
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsFreshlyAcquired());
}

TEST_P(StoreConformance, ForgetDeletesAbandonedRecord) {
  acquire_fresh("s", "k", ticks(2), live());
  pass(ticks(3));
  EXPECT_TRUE(store().forget("s", "k"));
  // Forgotten, not stolen: the next acquire is a first attempt.
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsFreshlyAcquired());
}

TEST_P(StoreConformance, ForgetDeletesExpiredCompleteRecord) {
  acquire_and_complete("s", "k", "p", ticks(2));
  pass(ticks(3));
  const bool deleted = store().forget("s", "k");
  if (!native_expiry()) {
    EXPECT_TRUE(deleted);
  }
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
}

TEST_P(StoreConformance, ForgetOnAbsentKeyReturnsFalse) {
  EXPECT_FALSE(store().forget("s", "k"));
  const Lease lease = acquire_fresh("s", "k", live(), live());
  ASSERT_THAT(store().release("s", "k", lease.token), IsDone());
  EXPECT_FALSE(store().forget("s", "k"));
}

TEST_P(StoreConformance, ForgetTouchesOnlyItsRecord) {
  const Lease other_key = acquire_fresh("s", "other", live(), live());
  const Lease other_scope = acquire_fresh("t", "k", live(), live());
  acquire_fresh("s", "k", live(), live());
  EXPECT_TRUE(store().forget("s", "k"));
  EXPECT_THAT(store().get("s", "other"), IsInProgressWith(other_key.token));
  EXPECT_THAT(store().get("t", "k"), IsInProgressWith(other_scope.token));
}

}  // namespace
}  // namespace idem::testing
