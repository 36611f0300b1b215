// SPEC §4, complete, release and extend: what each does for the owner, and that every
// other caller is fenced without changing anything.

#include <gmock/gmock.h>

#include <string>
#include <vector>

#include "idem/testing/matchers.h"
#include "idem/testing/store_conformance.h"

namespace idem::testing {
namespace {

// ---- complete ----

TEST_P(StoreConformance, CompleteRecordsPayloadAndTimes) {
  const Lease lease = acquire_fresh("s", "k", live(), live(), "fp");
  pass(ticks(1));
  ASSERT_THAT(store().complete("s", "k", lease.token, "the result", ticks(50)), IsDone());

  // SPEC §4: COMPLETE with the payload, completed_at = now, expires_at = now + ttl; the
  // token that completed it and the fingerprint stay.
  const Record rec = expect_record("s", "k");
  EXPECT_EQ(rec.state, RecordState::kComplete);
  EXPECT_EQ(rec.token, lease.token);
  EXPECT_EQ(rec.payload, "the result");
  EXPECT_EQ(rec.fingerprint, std::optional<std::string>("fp"));
  expect_same_instant(rec.expires_at, rec.completed_at + ticks(50), "expires_at");
  EXPECT_GE(rec.completed_at - lease.acquired_at, ticks(1));
  EXPECT_GE(rec.now, rec.completed_at);
  if (fake_clock()) {
    EXPECT_EQ(rec.completed_at, now());
  }
}

TEST_P(StoreConformance, CompleteRepeatedWithCompletingTokenIsDoneAndChangesNothing) {
  const Lease lease = acquire_fresh("s", "k", live(), live());
  ASSERT_THAT(store().complete("s", "k", lease.token, "first", ticks(50)), IsDone());
  const Record before = expect_record("s", "k");
  pass(ticks(1));

  // SPEC §4: a caller whose reply was lost retries; it succeeds and changes nothing, not
  // even the payload, completed_at or expires_at.
  EXPECT_THAT(store().complete("s", "k", lease.token, "second", live()), IsDone());
  EXPECT_THAT(store().complete("s", "k", lease.token, "first", ticks(50)), IsDone());
  expect_same_record(before, expect_record("s", "k"));
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsReplay("first"));
}

TEST_P(StoreConformance, CompleteWithAnotherTokenOnCompleteRecordIsFenced) {
  const Token token = acquire_and_complete("s", "k", "done", live());
  const Token other = acquire_fresh("s", "other", live(), live()).token;
  const Record before = expect_record("s", "k");

  // SPEC §4: completed by another token, so fenced, whatever the other token is.
  EXPECT_THAT(store().complete("s", "k", other, "mine", live()), IsFenced());
  EXPECT_THAT(store().complete("s", "k", token + 1, "mine", live()), IsFenced());
  EXPECT_THAT(store().complete("s", "k", token - 1, "mine", live()), IsFenced());
  expect_same_record(before, expect_record("s", "k"));
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsReplay("done"));
}

TEST_P(StoreConformance, CompleteWithWrongTokenOnInProgressIsFenced) {
  const Lease lease = acquire_fresh("s", "k", live(), live());
  const Token other = acquire_fresh("s", "other", live(), live()).token;
  const Record before = expect_record("s", "k");

  EXPECT_THAT(store().complete("s", "k", other, "x", live()), IsFenced());
  EXPECT_THAT(store().complete("s", "k", lease.token + 1, "x", live()), IsFenced());
  EXPECT_THAT(store().complete("s", "k", lease.token - 1, "x", live()), IsFenced());
  expect_same_record(before, expect_record("s", "k"));

  // The owner is unaffected.
  EXPECT_THAT(store().complete("s", "k", lease.token, "owner", live()), IsDone());
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsReplay("owner"));
}

TEST_P(StoreConformance, CompleteOnAbsentKeyIsFencedAndWritesNothing) {
  const Token other = acquire_fresh("s", "other", live(), live()).token;
  EXPECT_THAT(store().complete("s", "k", other, "x", live()), IsFenced());
  EXPECT_THAT(store().complete("s", "k", 1, "x", live()), IsFenced());
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsFreshlyAcquired());
}

TEST_P(StoreConformance, CompleteAfterLeaseDeadlineWithoutStealSucceeds) {
  const Lease lease = acquire_fresh("s", "k", ticks(2), live());
  pass(ticks(3));
  // SPEC §4: the lease deadline passed but nobody stole it, so the token still matches.
  EXPECT_THAT(store().complete("s", "k", lease.token, "late", live()), IsDone());
  EXPECT_THAT(store().get("s", "k"), IsCompleteWith(lease.token));
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsReplay("late"));
}

TEST_P(StoreConformance, CompleteAfterTtlPassedWhileLeaseLiveSucceeds) {
  const Lease lease = acquire_fresh("s", "k", live(), ticks(2));
  pass(ticks(3));
  ASSERT_THAT(store().complete("s", "k", lease.token, "slow", ticks(50)), IsDone());
  // SPEC §4: the COMPLETE record's expires_at is counted from completion.
  const Record rec = expect_record("s", "k");
  EXPECT_GT(rec.expires_at, rec.now);
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsReplay("slow"));
}

TEST_P(StoreConformance, StaleOwnerIsFencedAfterSteal) {
  const Lease stale = acquire_fresh("s", "k", ticks(2), live());
  pass(ticks(3));
  const AcquireResult r = store().acquire("s", "k", live(), live());
  ASSERT_THAT(r, IsStolen(2));
  const Token thief = std::get<Acquired>(r).lease.token;
  const Record before = expect_record("s", "k");

  // SPEC §4: the stale owner wakes up; complete, release and extend are all refused and
  // the thief's record is untouched.
  EXPECT_THAT(store().complete("s", "k", stale.token, "stale", live()), IsFenced());
  EXPECT_THAT(store().release("s", "k", stale.token), IsFenced());
  EXPECT_THAT(store().extend("s", "k", stale.token, live()), IsFenced());
  expect_same_record(before, expect_record("s", "k"));

  // The thief completes; the stale owner is still fenced and the result stays the thief's.
  ASSERT_THAT(store().complete("s", "k", thief, "thief", live()), IsDone());
  const Record completed = expect_record("s", "k");
  EXPECT_THAT(store().complete("s", "k", stale.token, "stale", live()), IsFenced());
  EXPECT_THAT(store().release("s", "k", stale.token), IsFenced());
  EXPECT_THAT(store().extend("s", "k", stale.token, live()), IsFenced());
  expect_same_record(completed, expect_record("s", "k"));
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsReplay("thief"));
}

TEST_P(StoreConformance, CompleteAfterReleaseIsFenced) {
  const Lease lease = acquire_fresh("s", "k", live(), live());
  ASSERT_THAT(store().release("s", "k", lease.token), IsDone());
  EXPECT_THAT(store().complete("s", "k", lease.token, "x", live()), IsFenced());
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
}

TEST_P(StoreConformance, CompleteAfterForgetIsFenced) {
  const Lease lease = acquire_fresh("s", "k", live(), live());
  ASSERT_TRUE(store().forget("s", "k"));
  // SPEC §4: forget fences the current owner at complete, and complete writes nothing.
  EXPECT_THAT(store().complete("s", "k", lease.token, "x", live()), IsFenced());
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
}

TEST_P(StoreConformance, CompleteAfterPurgeIsFenced) {
  const Lease lease = acquire_fresh("s", "k", ticks(2), ticks(2));
  pass(ticks(3));
  const std::size_t purged = store().purge(100);
  if (!native_expiry()) {
    EXPECT_EQ(purged, 1u);
  }
  ASSERT_EQ(store().get("s", "k"), std::nullopt);
  EXPECT_THAT(store().complete("s", "k", lease.token, "x", live()), IsFenced());
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
}

TEST_P(StoreConformance, CompleteOnReplacedRecordIsFenced) {
  // An owner that completed, whose record expired and was taken over by a new attempt,
  // cannot complete again over the new attempt.
  const Token old = acquire_and_complete("s", "k", "old", ticks(2));
  pass(ticks(3));
  const Lease fresh = acquire_fresh("s", "k", live(), live());
  EXPECT_THAT(store().complete("s", "k", old, "old", live()), IsFenced());
  EXPECT_THAT(store().get("s", "k"), IsInProgressWith(fresh.token));
}

// ---- release ----

TEST_P(StoreConformance, ReleaseLeavesNoTrace) {
  const Lease first = acquire_fresh("s", "k", live(), live(), "fp-first");
  ASSERT_THAT(store().release("s", "k", first.token), IsDone());
  EXPECT_EQ(store().get("s", "k"), std::nullopt);

  // SPEC §4: the next acquire sees a key that was never used.
  const AcquireResult r = store().acquire("s", "k", live(), live());
  ASSERT_THAT(r, IsFreshlyAcquired());
  EXPECT_GT(std::get<Acquired>(r).lease.token, first.token);
  const Record rec = expect_record("s", "k");
  EXPECT_EQ(rec.attempt, 1u);
  EXPECT_EQ(rec.fingerprint, std::nullopt);
}

TEST_P(StoreConformance, ReleaseAfterStealLeavesNoTrace) {
  acquire_fresh("s", "k", ticks(2), live());
  pass(ticks(3));
  const AcquireResult stolen = store().acquire("s", "k", live(), live());
  ASSERT_THAT(stolen, IsStolen(2));
  ASSERT_THAT(store().release("s", "k", std::get<Acquired>(stolen).lease.token), IsDone());
  // SPEC §3: a failed attempt leaves no trace, the attempt count included.
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsFreshlyAcquired());
}

TEST_P(StoreConformance, ReleaseAfterLeaseDeadlineWithoutStealSucceeds) {
  const Lease lease = acquire_fresh("s", "k", ticks(2), live());
  pass(ticks(3));
  EXPECT_THAT(store().release("s", "k", lease.token), IsDone());
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsFreshlyAcquired());
}

TEST_P(StoreConformance, ReleaseWithWrongTokenIsFenced) {
  const Lease lease = acquire_fresh("s", "k", live(), live());
  const Token other = acquire_fresh("s", "other", live(), live()).token;
  const Record before = expect_record("s", "k");
  EXPECT_THAT(store().release("s", "k", other), IsFenced());
  EXPECT_THAT(store().release("s", "k", lease.token + 1), IsFenced());
  EXPECT_THAT(store().release("s", "k", lease.token - 1), IsFenced());
  expect_same_record(before, expect_record("s", "k"));
}

TEST_P(StoreConformance, ReleaseTwiceIsFenced) {
  const Lease lease = acquire_fresh("s", "k", live(), live());
  ASSERT_THAT(store().release("s", "k", lease.token), IsDone());
  EXPECT_THAT(store().release("s", "k", lease.token), IsFenced());
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
}

TEST_P(StoreConformance, ReleaseOfCompleteRecordIsFenced) {
  const Token token = acquire_and_complete("s", "k", "kept", live());
  const Record before = expect_record("s", "k");
  // SPEC §4: release deletes only an IN_PROGRESS record; a result, once stored, stays.
  EXPECT_THAT(store().release("s", "k", token), IsFenced());
  EXPECT_THAT(store().release("s", "k", token + 1), IsFenced());
  expect_same_record(before, expect_record("s", "k"));
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsReplay("kept"));
}

TEST_P(StoreConformance, ReleaseOnAbsentKeyIsFenced) {
  const Token other = acquire_fresh("s", "other", live(), live()).token;
  EXPECT_THAT(store().release("s", "k", other), IsFenced());
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
  EXPECT_THAT(store().get("s", "other"), IsInProgressWith(other));
}

// ---- extend ----

TEST_P(StoreConformance, ExtendMovesLeaseDeadlineButNotExpiry) {
  const Lease lease = acquire_fresh("s", "k", ticks(4), live());
  const Record before = expect_record("s", "k");
  pass(ticks(2));

  const ExtendResult ext = store().extend("s", "k", lease.token, ticks(10));
  ASSERT_THAT(ext, IsDone());
  // SPEC §4: lease_expires_at = now + lease_duration, reported with the time left.
  if (fake_clock()) {
    EXPECT_EQ(ext.lease_expires_at, now() + ticks(10));
    EXPECT_EQ(ext.lease_remaining, ticks(10));
  } else {
    EXPECT_GE(ext.lease_expires_at - lease.lease_expires_at, ticks(8));
    EXPECT_GT(ext.lease_remaining, Duration::zero());
    EXPECT_LE(ext.lease_remaining, ticks(10));
  }

  // SPEC §4: extend does not touch expires_at (nor anything but the lease deadline).
  const Record after = expect_record("s", "k");
  EXPECT_EQ(after.state, RecordState::kInProgress);
  EXPECT_EQ(after.token, before.token);
  EXPECT_EQ(after.attempt, before.attempt);
  EXPECT_EQ(after.acquired_at, before.acquired_at);
  EXPECT_EQ(after.expires_at, before.expires_at);
  expect_same_instant(after.lease_expires_at, ext.lease_expires_at, "lease_expires_at");
}

TEST_P(StoreConformance, ExtendKeepsLeaseFromBeingStolen) {
  const Lease lease = acquire_fresh("s", "k", ticks(4), live());
  // Six ticks pass in all, more than the first lease, but each extend adds four from now.
  for (int i = 0; i < 3; ++i) {
    pass(ticks(2));
    ASSERT_THAT(store().extend("s", "k", lease.token, ticks(4)), IsDone());
  }
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsBusy());
  pass(ticks(5));
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsStolen(2));
}

TEST_P(StoreConformance, ExtendCanShortenLease) {
  const Lease lease = acquire_fresh("s", "k", live(), live());
  // SPEC §4: extend sets the deadline to now + lease_duration, even an earlier one.
  ASSERT_THAT(store().extend("s", "k", lease.token, ticks(2)), IsDone());
  pass(ticks(3));
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsStolen(2));
}

TEST_P(StoreConformance, ExtendAfterDeadlineWithoutStealSucceeds) {
  const Lease lease = acquire_fresh("s", "k", ticks(2), live());
  pass(ticks(3));
  // The owner was slow to heartbeat but nobody stole: its lease lives again.
  ASSERT_THAT(store().extend("s", "k", lease.token, live()), IsDone());
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsBusy());
  EXPECT_THAT(store().complete("s", "k", lease.token, "p", live()), IsDone());
}

TEST_P(StoreConformance, ExtendAfterReleaseIsFenced) {
  const Lease lease = acquire_fresh("s", "k", live(), live());
  ASSERT_THAT(store().release("s", "k", lease.token), IsDone());
  EXPECT_THAT(store().extend("s", "k", lease.token, live()), IsFenced());
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
}

TEST_P(StoreConformance, ExtendAfterForgetIsFenced) {
  const Lease lease = acquire_fresh("s", "k", live(), live());
  ASSERT_TRUE(store().forget("s", "k"));
  EXPECT_THAT(store().extend("s", "k", lease.token, live()), IsFenced());
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
}

TEST_P(StoreConformance, ExtendAfterStealIsFenced) {
  const Lease stale = acquire_fresh("s", "k", ticks(2), live());
  pass(ticks(3));
  ASSERT_THAT(store().acquire("s", "k", live(), live()), IsStolen(2));
  const Record before = expect_record("s", "k");
  EXPECT_THAT(store().extend("s", "k", stale.token, live()), IsFenced());
  expect_same_record(before, expect_record("s", "k"));
}

TEST_P(StoreConformance, ExtendAfterCompleteIsFenced) {
  const Token token = acquire_and_complete("s", "k", "p", live());
  const Record before = expect_record("s", "k");
  // SPEC §4: extend needs an IN_PROGRESS record; the completing token no longer leases.
  EXPECT_THAT(store().extend("s", "k", token, live()), IsFenced());
  expect_same_record(before, expect_record("s", "k"));
}

TEST_P(StoreConformance, ExtendWithWrongTokenIsFenced) {
  const Lease lease = acquire_fresh("s", "k", ticks(4), live());
  const Token other = acquire_fresh("s", "other", live(), live()).token;
  const Record before = expect_record("s", "k");
  EXPECT_THAT(store().extend("s", "k", other, live()), IsFenced());
  EXPECT_THAT(store().extend("s", "k", lease.token + 1, live()), IsFenced());
  EXPECT_THAT(store().extend("s", "k", lease.token - 1, live()), IsFenced());
  expect_same_record(before, expect_record("s", "k"));
}

TEST_P(StoreConformance, ExtendOnAbsentKeyIsFencedAndWritesNothing) {
  const Token other = acquire_fresh("s", "other", live(), live()).token;
  EXPECT_THAT(store().extend("s", "k", other, live()), IsFenced());
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
}

// ---- extend_many (the heartbeat's batched extend) ----

TEST_P(StoreConformance, ExtendManyGivesEachLeaseItsOwnOutcomeInOrder) {
  const Lease live_lease = acquire_fresh("s", "live", ticks(4), live());
  const Lease released = acquire_fresh("s", "released", live(), live());
  ASSERT_THAT(store().release("s", "released", released.token), IsDone());
  const Token completed = acquire_and_complete("s", "completed", "p", live());
  const Lease stale = acquire_fresh("s", "stolen", ticks(2), live());
  const Lease other = acquire_fresh("t", "live", ticks(4), live());
  pass(ticks(3));
  ASSERT_THAT(store().acquire("s", "stolen", live(), live()), IsStolen(2));
  const Record completed_before = expect_record("s", "completed");
  const Record stolen_before = expect_record("s", "stolen");

  const std::vector<ExtendRequest> batch = {
      {"s", "live", live_lease.token, ticks(10)},   {"s", "released", released.token, ticks(10)},
      {"s", "completed", completed, ticks(10)},     {"s", "stolen", stale.token, ticks(10)},
      {"s", "absent", live_lease.token, ticks(10)}, {"t", "live", other.token, ticks(20)},
      {"s", "live", other.token, ticks(10)},
  };
  const std::vector<ExtendResult> results = store().extend_many(batch);
  ASSERT_EQ(results.size(), batch.size());
  // SPEC §4: each entry is judged as a lone extend would be.
  EXPECT_THAT(results[0], IsDone());
  EXPECT_THAT(results[1], IsFenced());
  EXPECT_THAT(results[2], IsFenced());
  EXPECT_THAT(results[3], IsFenced());
  EXPECT_THAT(results[4], IsFenced());
  EXPECT_THAT(results[5], IsDone());
  EXPECT_THAT(results[6], IsFenced());
  if (fake_clock()) {
    EXPECT_EQ(results[0].lease_expires_at, now() + ticks(10));
    EXPECT_EQ(results[0].lease_remaining, ticks(10));
    EXPECT_EQ(results[5].lease_expires_at, now() + ticks(20));
    EXPECT_EQ(results[5].lease_remaining, ticks(20));
  } else {
    EXPECT_GT(results[0].lease_remaining, ticks(8));
    EXPECT_LE(results[0].lease_remaining, ticks(10));
    EXPECT_GT(results[5].lease_remaining, ticks(18));
    EXPECT_LE(results[5].lease_remaining, ticks(20));
  }
  expect_same_instant(expect_record("s", "live").lease_expires_at, results[0].lease_expires_at,
                      "lease_expires_at of s/live");
  expect_same_instant(expect_record("t", "live").lease_expires_at, results[5].lease_expires_at,
                      "lease_expires_at of t/live");
  // Fenced entries changed nothing.
  EXPECT_EQ(store().get("s", "released"), std::nullopt);
  EXPECT_EQ(store().get("s", "absent"), std::nullopt);
  expect_same_record(completed_before, expect_record("s", "completed"));
  expect_same_record(stolen_before, expect_record("s", "stolen"));

  // The extended leases outlive their first deadline.
  pass(ticks(5));
  EXPECT_THAT(store().acquire("s", "live", live(), live()), IsBusy());
  EXPECT_THAT(store().acquire("t", "live", live(), live()), IsBusy());
}

TEST_P(StoreConformance, ExtendManyOfNothingIsNothing) {
  EXPECT_TRUE(store().extend_many({}).empty());
}

TEST_P(StoreConformance, ExtendManyOfManyLeasesExtendsEveryOne) {
  std::vector<std::string> keys;
  std::vector<Token> tokens;
  for (int i = 0; i < 300; ++i) {
    keys.push_back("k" + std::to_string(i));
    tokens.push_back(acquire_fresh("s", keys.back(), ticks(4), live()).token);
  }
  pass(ticks(2));
  std::vector<ExtendRequest> batch;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    batch.push_back({"s", keys[i], tokens[i], ticks(10)});
  }
  const std::vector<ExtendResult> results = store().extend_many(batch);
  ASSERT_EQ(results.size(), batch.size());
  for (std::size_t i = 0; i < results.size(); ++i) {
    EXPECT_THAT(results[i], IsDone()) << "lease " << i;
  }
  pass(ticks(3));
  for (std::size_t i = 0; i < keys.size(); i += 37) {
    EXPECT_THAT(store().acquire("s", keys[i], live(), live()), IsBusy()) << "key " << keys[i];
  }
}

TEST_P(StoreConformance, ExtendManyValidatesEveryRequestBeforeWriting) {
  const Lease lease = acquire_fresh("s", "k", ticks(4), live());
  const Record before = expect_record("s", "k");
  pass(ticks(1));
  const std::vector<ExtendRequest> batch = {{"s", "k", lease.token, ticks(10)},
                                            {"s", "", lease.token, ticks(10)}};
  // SPEC §10: bad input is refused before anything is written.
  EXPECT_THAT([&] { (void)store().extend_many(batch); }, ThrowsIdem(ErrorCode::kInvalidArgument));
  const std::vector<ExtendRequest> zero = {{"s", "k", lease.token, ticks(10)},
                                           {"s", "k", lease.token, Duration::zero()}};
  EXPECT_THAT([&] { (void)store().extend_many(zero); }, ThrowsIdem(ErrorCode::kInvalidArgument));
  expect_same_record(before, expect_record("s", "k"));
}

}  // namespace
}  // namespace idem::testing
