// SPEC §10: bad input is rejected with idem::InvalidArgument naming the input, before any
// record is written or changed.

#include <gmock/gmock.h>

#include <functional>
#include <string>
#include <vector>

#include "idem/error.h"
#include "idem/testing/matchers.h"
#include "idem/testing/store_conformance.h"

namespace idem::testing {
namespace {

// Runs `call` and expects idem::InvalidArgument naming `argument`.
void expect_invalid(const std::function<void()>& call, const std::string& argument,
                    const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << ": no exception, expected an invalid " << argument;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), argument) << what << ": " << e.what();
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": expected InvalidArgument, got " << e.what();
  }
}

// Every operation that takes a scope and key, called with the given ones.
void call_every_operation(Store& store, const std::string& scope, const std::string& key,
                          const std::string& argument, Duration d) {
  expect_invalid([&] { store.acquire(scope, key, d, d); }, argument, "acquire");
  expect_invalid([&] { (void)store.complete(scope, key, 1, "p", d); }, argument, "complete");
  expect_invalid([&] { (void)store.release(scope, key, 1); }, argument, "release");
  expect_invalid([&] { (void)store.extend(scope, key, 1, d); }, argument, "extend");
  expect_invalid([&] { store.get(scope, key); }, argument, "get");
  expect_invalid([&] { store.forget(scope, key); }, argument, "forget");
}

TEST_P(StoreConformance, InvalidScopeIsRejectedBeforeAnyWrite) {
  const std::string too_long(kMaxScopeBytes + 1, 's');
  call_every_operation(store(), "", "k", "scope", live());
  call_every_operation(store(), too_long, "k", "scope", live());
  // Nothing was written under a truncated scope either.
  EXPECT_EQ(store().get(too_long.substr(0, kMaxScopeBytes), "k"), std::nullopt);
  EXPECT_EQ(store().purge(100), 0u);
}

TEST_P(StoreConformance, InvalidKeyIsRejectedBeforeAnyWrite) {
  const std::string too_long(kMaxKeyBytes + 1, 'k');
  call_every_operation(store(), "s", "", "key", live());
  call_every_operation(store(), "s", too_long, "key", live());
  EXPECT_EQ(store().get("s", too_long.substr(0, kMaxKeyBytes)), std::nullopt);
  EXPECT_EQ(store().purge(100), 0u);
}

std::vector<Duration> invalid_durations() {
  return {Duration{0}, Duration{-1}, Duration{-1000}, kMaxDuration + Duration{1}};
}

TEST_P(StoreConformance, InvalidDurationsAreRejectedBeforeAnyWrite) {
  for (Duration bad : invalid_durations()) {
    SCOPED_TRACE(std::to_string(bad.count()) + " ms");
    expect_invalid([&] { store().acquire("s", "k", bad, live()); }, "lease duration",
                   "acquire lease");
    expect_invalid([&] { store().acquire("s", "k", live(), bad); }, "ttl", "acquire ttl");
  }
  EXPECT_EQ(store().get("s", "k"), std::nullopt);
}

TEST_P(StoreConformance, InvalidDurationsLeaveExistingRecordsUnchanged) {
  const Lease held = acquire_fresh("s", "held", live(), live());
  acquire_fresh("s", "abandoned", ticks(2), live());
  pass(ticks(3));
  const Record held_before = expect_record("s", "held");
  const Record abandoned_before = expect_record("s", "abandoned");

  for (Duration bad : invalid_durations()) {
    SCOPED_TRACE(std::to_string(bad.count()) + " ms");
    // A bad acquire must not steal, a bad complete must not complete, a bad extend must
    // not move the deadline.
    expect_invalid([&] { store().acquire("s", "abandoned", bad, live()); }, "lease duration",
                   "acquire lease");
    expect_invalid([&] { store().acquire("s", "abandoned", live(), bad); }, "ttl", "acquire ttl");
    expect_invalid([&] { (void)store().complete("s", "held", held.token, "p", bad); }, "ttl",
                   "complete ttl");
    expect_invalid([&] { (void)store().extend("s", "held", held.token, bad); }, "lease duration",
                   "extend lease");
  }
  expect_same_record(held_before, expect_record("s", "held"));
  expect_same_record(abandoned_before, expect_record("s", "abandoned"));
  EXPECT_THAT(store().complete("s", "held", held.token, "p", live()), IsDone());
}

TEST_P(StoreConformance, LargestDurationsAreAccepted) {
  // SPEC §10: at most 365 days, inclusive.
  const AcquireResult r = store().acquire("s", "k", kMaxDuration, kMaxDuration);
  ASSERT_THAT(r, IsFreshlyAcquired());
  const Lease lease = std::get<Acquired>(r).lease;
  expect_lease_shape(lease, kMaxDuration, kMaxDuration);
  EXPECT_THAT(store().extend("s", "k", lease.token, kMaxDuration), IsDone());
  EXPECT_THAT(store().complete("s", "k", lease.token, "p", kMaxDuration), IsDone());
  EXPECT_THAT(store().acquire("s", "k", Duration{1}, Duration{1}), IsReplay("p"));
}

TEST_P(StoreConformance, PurgeLimitZeroIsRejected) {
  acquire_and_complete("s", "k", "p", ticks(2));
  pass(ticks(3));
  expect_invalid([&] { store().purge(0); }, "purge limit", "purge");
  if (!native_expiry()) {
    // The expired record is still there for a real purge to delete.
    EXPECT_TRUE(store().get("s", "k").has_value());
    EXPECT_EQ(store().purge(1), 1u);
  }
}

TEST_P(StoreConformance, OversizePayloadIsRejectedBeforeAnyWrite) {
  const Lease lease = acquire_fresh("s", "k", live(), live());
  const Record before = expect_record("s", "k");
  const std::string too_big(kMaxPayloadBytes + 1, 'x');
  try {
    (void)store().complete("s", "k", lease.token, too_big, live());
    ADD_FAILURE() << "a payload over " << kMaxPayloadBytes << " bytes was accepted";
  } catch (const PayloadTooLarge& e) {
    // SPEC §10: the error says the size.
    EXPECT_EQ(e.argument(), "payload");
    EXPECT_EQ(e.size(), kMaxPayloadBytes + 1);
    EXPECT_EQ(e.limit(), kMaxPayloadBytes);
  }
  expect_same_record(before, expect_record("s", "k"));
  // The lease is intact, so the owner can still store a result that fits.
  EXPECT_THAT(store().complete("s", "k", lease.token, "fits", live()), IsDone());
}

}  // namespace
}  // namespace idem::testing
