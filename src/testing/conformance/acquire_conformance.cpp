// SPEC §4, acquire: one test per row of its table, plus the attempt count and the exact
// boundaries of "expired" on a fake clock.

#include <gmock/gmock.h>

#include <string>
#include <string_view>

#include "idem/testing/matchers.h"
#include "idem/testing/store_conformance.h"

namespace idem::testing {
namespace {

using namespace std::string_view_literals;

TEST_P(StoreConformance, AcquireOnAbsentKeyGrantsFirstAttempt) {
  const AcquireResult r = store().acquire("s", "k", ticks(10), live(), "fp");
  ASSERT_THAT(r, IsFreshlyAcquired());
  const Lease lease = std::get<Acquired>(r).lease;
  // SPEC §4: lease_expires_at = now + lease_duration, expires_at = now + ttl, attempt 1.
  expect_lease_shape(lease, ticks(10), live());

  // SPEC §3: the record is IN_PROGRESS with the lease's fields and the fingerprint.
  const Record rec = expect_record("s", "k");
  EXPECT_EQ(rec.state, RecordState::kInProgress);
  EXPECT_EQ(rec.token, lease.token);
  EXPECT_EQ(rec.attempt, 1u);
  expect_same_instant(rec.acquired_at, lease.acquired_at, "acquired_at");
  expect_same_instant(rec.lease_expires_at, lease.lease_expires_at, "lease_expires_at");
  expect_same_instant(rec.expires_at, lease.expires_at, "expires_at");
  EXPECT_EQ(rec.fingerprint, std::optional<std::string>("fp"));
}

TEST_P(StoreConformance, AcquireWithoutFingerprintStoresNone) {
  acquire_fresh("s", "k", live(), live());
  EXPECT_EQ(expect_record("s", "k").fingerprint, std::nullopt);
  // SPEC §4: Busy reports the stored fingerprint, which is none here.
  const AcquireResult r = store().acquire("s", "k", live(), live(), "other");
  ASSERT_THAT(r, IsBusy());
  EXPECT_EQ(std::get<Busy>(r).fingerprint, std::nullopt);
}

TEST_P(StoreConformance, AcquireOnLiveLeaseIsBusy) {
  const Lease owner = acquire_fresh("s", "k", live(), live(), "fp-owner"sv);
  const Record before = expect_record("s", "k");
  pass(ticks(2));

  const AcquireResult r = store().acquire("s", "k", ticks(10), ticks(10), "fp-other");
  ASSERT_THAT(r, IsBusy());
  const Busy& busy = std::get<Busy>(r);
  // SPEC §4: Busy carries the owner's deadline, the time left on it and the stored
  // fingerprint (the owner's, not the caller's).
  expect_same_instant(busy.lease_expires_at, owner.lease_expires_at, "Busy.lease_expires_at");
  EXPECT_EQ(busy.fingerprint, std::optional<std::string>("fp-owner"));
  if (fake_clock()) {
    EXPECT_EQ(busy.lease_remaining, live() - ticks(2));
  } else {
    EXPECT_GT(busy.lease_remaining, Duration::zero());
    EXPECT_LE(busy.lease_remaining, live() - ticks(2));
  }

  // SPEC §4: the record is unchanged, however many duplicates arrive.
  EXPECT_THAT(store().acquire("s", "k", ticks(10), ticks(10)), IsBusy());
  expect_same_record(before, expect_record("s", "k"));
}

TEST_P(StoreConformance, AcquireOnLiveCompleteReplays) {
  const std::string payload(
      "result\0with\xff"
      "bytes",
      17);
  const Token token = acquire_and_complete("s", "k", payload, live(), "fp-first"sv);
  const Record before = expect_record("s", "k");
  pass(ticks(2));

  const AcquireResult r = store().acquire("s", "k", ticks(10), ticks(10), "fp-second");
  ASSERT_THAT(r, IsReplay(payload));
  const Replay& replay = std::get<Replay>(r);
  // SPEC §4: Replay carries the payload, completed_at, expires_at and stored fingerprint.
  EXPECT_EQ(replay.completed_at, before.completed_at);
  EXPECT_EQ(replay.expires_at, before.expires_at);
  EXPECT_EQ(replay.fingerprint, std::optional<std::string>("fp-first"));

  EXPECT_THAT(store().acquire("s", "k", ticks(10), ticks(10)), IsReplay(payload));
  const Record after = expect_record("s", "k");
  EXPECT_EQ(after.token, token);
  expect_same_record(before, after);
}

TEST_P(StoreConformance, ReplayWithoutStoredFingerprintReportsNone) {
  acquire_and_complete("s", "k", "p", live());
  const AcquireResult r = store().acquire("s", "k", live(), live(), "fp");
  ASSERT_THAT(r, IsReplay("p"));
  EXPECT_EQ(std::get<Replay>(r).fingerprint, std::nullopt);
}

TEST_P(StoreConformance, AcquireOnExpiredCompleteStartsOverBeforeAnyPurge) {
  const Token first = acquire_and_complete("s", "k", "old", ticks(2), "fp-old"sv);
  pass(ticks(3));
  // SPEC §8: no purge has run; a store without native expiry still holds the record.
  if (!native_expiry()) {
    const Record rec = expect_record("s", "k");
    EXPECT_EQ(rec.state, RecordState::kComplete);
    EXPECT_LE(rec.expires_at, rec.now);
  }

  // SPEC §4: a COMPLETE with expires_at <= now is replaced as if absent.
  const AcquireResult r = store().acquire("s", "k", ticks(10), live(), "fp-new");
  ASSERT_THAT(r, IsFreshlyAcquired());
  const Lease lease = std::get<Acquired>(r).lease;
  EXPECT_GT(lease.token, first);
  expect_lease_shape(lease, ticks(10), live());

  const Record rec = expect_record("s", "k");
  EXPECT_EQ(rec.state, RecordState::kInProgress);
  EXPECT_EQ(rec.token, lease.token);
  EXPECT_EQ(rec.attempt, 1u);
  EXPECT_EQ(rec.fingerprint, std::optional<std::string>("fp-new"));
}

TEST_P(StoreConformance, AcquireStealsExpiredLease) {
  const Lease first = acquire_fresh("s", "k", ticks(2), live(), "fp"sv);
  pass(ticks(3));

  // SPEC §4: an IN_PROGRESS record whose lease passed is stolen: same record, new token,
  // new lease deadline, expires_at = now + the new ttl, attempt + 1.
  const AcquireResult r = store().acquire("s", "k", ticks(10), ticks(50), "fp");
  ASSERT_THAT(r, IsStolen(2));
  const Lease lease = std::get<Acquired>(r).lease;
  EXPECT_GT(lease.token, first.token);
  expect_lease_shape(lease, ticks(10), ticks(50));
  EXPECT_GE(lease.acquired_at - first.acquired_at, ticks(3));

  const Record rec = expect_record("s", "k");
  EXPECT_EQ(rec.state, RecordState::kInProgress);
  EXPECT_EQ(rec.token, lease.token);
  EXPECT_EQ(rec.attempt, 2u);
  expect_same_instant(rec.acquired_at, lease.acquired_at, "acquired_at is the steal's");
  expect_same_instant(rec.lease_expires_at, lease.lease_expires_at, "lease_expires_at");
  expect_same_instant(rec.expires_at, lease.expires_at, "expires_at");

  // The thief now holds a live lease of its own.
  EXPECT_THAT(store().acquire("s", "k", ticks(10), ticks(10)), IsBusy());
}

TEST_P(StoreConformance, AttemptCountsEverySteal) {
  Token last = acquire_fresh("s", "k", ticks(2), live()).token;
  for (int attempt = 2; attempt <= 4; ++attempt) {
    pass(ticks(3));
    const AcquireResult r = store().acquire("s", "k", ticks(2), live());
    ASSERT_THAT(r, IsStolen(attempt));
    const Token token = std::get<Acquired>(r).lease.token;
    EXPECT_GT(token, last);
    last = token;
    EXPECT_EQ(expect_record("s", "k").attempt, static_cast<std::uint32_t>(attempt));
  }
}

TEST_P(StoreConformance, AcquireOnAbandonedRecordPastItsTtlStealsOrStartsOver) {
  const Lease first = acquire_fresh("s", "k", ticks(2), ticks(2));
  pass(ticks(3));
  // SPEC §4: both deadlines passed. Not purged, the record is stolen (the lease passed);
  // dropped by a store's native expiry, the key is absent. Either way a new lease.
  const bool present = store().get("s", "k").has_value();
  if (!native_expiry()) {
    EXPECT_TRUE(present) << "only purge deletes records (SPEC §4)";
  }
  const AcquireResult r = store().acquire("s", "k", ticks(10), live());
  if (present) {
    EXPECT_THAT(r, IsStolen(2));
  } else {
    EXPECT_THAT(r, IsFreshlyAcquired());
  }
  ASSERT_THAT(r, IsAcquired());
  EXPECT_GT(std::get<Acquired>(r).lease.token, first.token);
}

TEST_P(StoreConformance, LeaseEndsExactlyAtItsDeadline) {
  if (!fake_clock()) GTEST_SKIP() << "exact boundaries need a fake clock";
  acquire_fresh("s", "k", ticks(2), live());
  pass(ticks(2) - Duration{1});
  const AcquireResult busy = store().acquire("s", "k", ticks(2), live());
  ASSERT_THAT(busy, IsBusy());
  EXPECT_EQ(std::get<Busy>(busy).lease_remaining, Duration{1});
  // SPEC §4: a lease with lease_expires_at <= now has expired.
  pass(Duration{1});
  EXPECT_THAT(store().acquire("s", "k", ticks(2), live()), IsStolen(2));
}

TEST_P(StoreConformance, CompleteRecordExpiresExactlyAtItsDeadline) {
  if (!fake_clock()) GTEST_SKIP() << "exact boundaries need a fake clock";
  acquire_and_complete("s", "k", "p", ticks(2));
  pass(ticks(2) - Duration{1});
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsReplay("p"));
  // SPEC §4: a COMPLETE with expires_at <= now is treated as absent.
  pass(Duration{1});
  EXPECT_THAT(store().acquire("s", "k", live(), live()), IsFreshlyAcquired());
}

}  // namespace
}  // namespace idem::testing
