#include "idem/testing/store_conformance.h"

#include <gmock/gmock.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "idem/testing/matchers.h"

namespace idem::testing {

void StoreConformance::SetUp() {
  const StoreTestContext& context = GetParam();
  if (context.fake_clock) clock_ = std::make_shared<ManualClock>();
  store_ = context.make(clock_);
  ASSERT_NE(store_, nullptr) << "the context '" << context.name << "' made no store";
}

Duration StoreConformance::ticks(int n) const {
  return fake_clock() ? Duration{std::chrono::seconds(n)} : GetParam().tick * n;
}

void StoreConformance::pass(Duration d) {
  if (fake_clock()) {
    clock_->advance(d);
    return;
  }
  // The store's clock started counting `d` no earlier than its last reply reached us, so
  // sleeping `d` locally is enough; the margin keeps a deadline that is exactly `d` away
  // clearly in the past however the server rounds its timestamps.
  const Duration margin = std::max(GetParam().tick / 4, Duration{10});
  std::this_thread::sleep_for(d + margin);
}

Timestamp StoreConformance::now() const { return clock_ ? clock_->now() : Timestamp{}; }

Acquired StoreConformance::expect_acquired(const AcquireResult& r, std::string_view what) {
  if (const auto* a = std::get_if<Acquired>(&r)) return *a;
  ADD_FAILURE() << what << ": expected Acquired, got " << ::testing::PrintToString(r);
  throw AbortTest(std::string(what));
}

Lease StoreConformance::acquire_fresh(std::string_view scope, std::string_view key, Duration lease,
                                      Duration ttl, std::optional<std::string_view> fingerprint) {
  const Acquired a =
      expect_acquired(store().acquire(scope, key, lease, ttl, fingerprint), "acquire");
  if (a.stolen || a.lease.attempt != 1) {
    ADD_FAILURE() << "expected a fresh lease (stolen=false, attempt 1), got "
                  << ::testing::PrintToString(a);
    throw AbortTest("acquire_fresh");
  }
  return a.lease;
}

Token StoreConformance::acquire_and_complete(std::string_view scope, std::string_view key,
                                             std::string_view payload, Duration ttl,
                                             std::optional<std::string_view> fingerprint) {
  const Lease lease = acquire_fresh(scope, key, live(), ttl, fingerprint);
  if (store().complete(scope, key, lease.token, payload, ttl) != WriteResult::kDone) {
    ADD_FAILURE() << "complete by the owner of a live lease was fenced";
    throw AbortTest("acquire_and_complete");
  }
  return lease.token;
}

Record StoreConformance::expect_record(std::string_view scope, std::string_view key) {
  std::optional<Record> r = store().get(scope, key);
  if (!r) {
    ADD_FAILURE() << "get found no record";
    throw AbortTest("expect_record");
  }
  return *r;
}

void StoreConformance::expect_same_instant(Timestamp a, Timestamp b, std::string_view what) const {
  if (fake_clock()) {
    EXPECT_EQ(a, b) << what;
  } else {
    EXPECT_LE(a - b, Duration{1}) << what;
    EXPECT_LE(b - a, Duration{1}) << what;
  }
}

void StoreConformance::expect_same_record(const Record& before, const Record& after) const {
  EXPECT_EQ(after.state, before.state);
  EXPECT_EQ(after.token, before.token);
  EXPECT_EQ(after.expires_at, before.expires_at);
  EXPECT_EQ(after.fingerprint, before.fingerprint);
  if (before.state == RecordState::kInProgress) {
    EXPECT_EQ(after.attempt, before.attempt);
    EXPECT_EQ(after.acquired_at, before.acquired_at);
    EXPECT_EQ(after.lease_expires_at, before.lease_expires_at);
  } else {
    EXPECT_EQ(after.completed_at, before.completed_at);
    EXPECT_TRUE(after.payload == before.payload)
        << "payload changed from " << preview(before.payload) << " to " << preview(after.payload);
  }
}

void StoreConformance::expect_lease_shape(const Lease& lease, Duration lease_duration,
                                          Duration ttl) const {
  EXPECT_GT(lease.token, Token{0});
  // SPEC §4: lease_expires_at = now + lease_duration and expires_at = now + ttl, for one
  // reading of the store's clock, which is also the acquisition time.
  expect_same_instant(lease.lease_expires_at, lease.acquired_at + lease_duration,
                      "lease_expires_at = acquired_at + lease duration");
  expect_same_instant(lease.expires_at, lease.acquired_at + ttl, "expires_at = acquired_at + ttl");
  if (fake_clock()) {
    EXPECT_EQ(lease.acquired_at, clock_->now());
    EXPECT_EQ(lease.lease_remaining, lease_duration);
  } else {
    // SPEC §6: the time left by the store's own clock, which cannot exceed the lease.
    EXPECT_GT(lease.lease_remaining, Duration::zero());
    EXPECT_LE(lease.lease_remaining, lease_duration);
  }
}

}  // namespace idem::testing
