#pragma once

// The one conformance suite every store runs unchanged (SPEC §3–§8), part of the testing
// kit (docs/testing.md). A store's test program links `idem::testing` and instantiates the
// suite with one or more contexts, at namespace scope:
//
//   IDEM_INSTANTIATE_STORE_CONFORMANCE(
//       Memory, idem::testing::StoreTestContext{
//                   .name = "memory",
//                   .make = [](std::shared_ptr<idem::ManualClock> clock) {...},
//                   .fake_clock = true});

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "idem/clock.h"
#include "idem/store.h"
#include "idem/types.h"

namespace idem::testing {

// How a store under test is made and how time passes for it.
struct StoreTestContext {
  // Shown in test names: letters and digits only.
  std::string name;
  // Returns a fresh, empty store. When fake_clock is true the store must judge time by
  // `clock`; otherwise `clock` is null and the store uses its own (server) clock.
  std::function<std::shared_ptr<Store>(std::shared_ptr<ManualClock> clock)> make;
  // True when the store takes an injectable clock: the suite then moves time instantly.
  // False for stores judged by a server's clock: the suite sleeps instead, with every
  // duration a multiple of `tick`.
  bool fake_clock = true;
  // One unit of test time for a store with a real clock. Every lease or TTL in the suite is
  // a small multiple of it; make it comfortably larger than a store round trip. A live lease
  // is 100 ticks, and a stall of more than about 7 ticks inside the randomised test would
  // break it, so do not go much below 100 ms. The whole suite sleeps about 190 ticks (38 s at
  // 200 ms, spread over parallel ctest processes).
  Duration tick{200};
  // Multiplies the operation count of the randomised concurrent test. A fast store may
  // raise it; a store with slow writes may keep it at 1.
  int stress_scale = 1;
  // True for a store that drops expired records by itself (SPEC §8, Redis): its purge may
  // return 0, and a record whose deadlines have all passed may vanish before any purge.
  bool native_expiry = false;
  // True for a store that claims SPEC §2's optional promise: tokens unique across every
  // key of the store, not only increasing per key (memory, SQLite, PostgreSQL). A store
  // whose records live on many shards (Redis) sets false; the suite then checks per-key
  // order only.
  bool store_wide_tokens = true;
};

// Failure messages name the context instead of dumping its bytes.
inline void PrintTo(const StoreTestContext& context, std::ostream* os) { *os << context.name; }

struct ContextName {
  std::string operator()(const ::testing::TestParamInfo<StoreTestContext>& info) const {
    return info.param.name;
  }
};

// The fixture: a fresh store per test and a way to let time pass.
class StoreConformance : public ::testing::TestWithParam<StoreTestContext> {
 protected:
  void SetUp() override;

  Store& store() { return *store_; }
  std::shared_ptr<Store> shared_store() { return store_; }
  // `n` units of test time: 1 s each on a fake clock, `tick` each on a real one.
  Duration ticks(int n) const;
  // Lets `d` pass by the store's clock: moves the fake clock, or sleeps a little longer
  // than `d` on a real one.
  void pass(Duration d);
  bool fake_clock() const { return GetParam().fake_clock; }
  bool native_expiry() const { return GetParam().native_expiry; }
  bool store_wide_tokens() const { return GetParam().store_wide_tokens; }

  // A lease or TTL that outlives anything a test lets pass.
  Duration live() const { return ticks(100); }
  // The fake clock's reading; only meaningful when fake_clock().
  Timestamp now() const;

  // Expects `r` to be Acquired and returns it; otherwise records a failure naming `what`
  // and aborts the test (a failed precondition makes the rest meaningless).
  Acquired expect_acquired(const AcquireResult& r, std::string_view what);
  // Acquires (scope, key) and expects a fresh lease (stolen=false, attempt 1).
  Lease acquire_fresh(std::string_view scope, std::string_view key, Duration lease, Duration ttl,
                      std::optional<std::string_view> fingerprint = std::nullopt);
  // Acquires and completes (scope, key) with `payload`; returns the completing token.
  Token acquire_and_complete(std::string_view scope, std::string_view key, std::string_view payload,
                             Duration ttl,
                             std::optional<std::string_view> fingerprint = std::nullopt);
  // Expects get() to find a record and returns it; otherwise fails and aborts the test.
  Record expect_record(std::string_view scope, std::string_view key);

  // Two readings of one instant by the store's clock: equal on a fake clock; within a
  // millisecond on a real one, whose store may keep finer timestamps than it reports.
  void expect_same_instant(Timestamp a, Timestamp b, std::string_view what) const;
  // Two snapshots of one record that nothing changed in between (Record::now aside).
  void expect_same_record(const Record& before, const Record& after) const;
  // A lease reported by the store: deadlines follow from one reading of its clock.
  void expect_lease_shape(const Lease& lease, Duration lease_duration, Duration ttl) const;

  std::shared_ptr<ManualClock> clock_;
  std::shared_ptr<Store> store_;
};

// Thrown by the expect_* helpers after recording a failure, to end the test early.
struct AbortTest : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
// Calls into every file of the suite, so a program that instantiates the suite links all
// of them out of the static library (and a program that does not, none). Returns true.
bool link_store_conformance();
}  // namespace detail

// How many tests the suite gives each context, counted when the library was built.
int store_conformance_test_count();
// How many tests of the suite this program registered under `prefix` (every context's): a
// program can check it got them all, contexts * store_conformance_test_count().
int instantiated_conformance_tests(std::string_view prefix);

}  // namespace idem::testing

// Instantiates the suite as `prefix/StoreConformance.Test/context-name` for each context
// (one or more StoreTestContext values), at namespace scope, once per prefix. GoogleTest
// needs the fixture's unqualified name, so the macro brings `StoreConformance` into the
// namespace where it is used.
#define IDEM_INSTANTIATE_STORE_CONFORMANCE(prefix, ...)                              \
  using ::idem::testing::StoreConformance;                                           \
  INSTANTIATE_TEST_SUITE_P(prefix, StoreConformance, ::testing::Values(__VA_ARGS__), \
                           ::idem::testing::ContextName{});                          \
  [[maybe_unused]] static const bool idem_store_conformance_linked_##prefix =        \
      ::idem::testing::detail::link_store_conformance()

#ifdef IDEM_CONFORMANCE_UNIT
// Only in the suite's own files, whose build defines IDEM_CONFORMANCE_UNIT to a name of
// their own (src/testing/conformance/CMakeLists.txt): the function through which
// link_store_conformance() reaches the file.
namespace idem::testing::detail {
void IDEM_CONFORMANCE_UNIT();
void IDEM_CONFORMANCE_UNIT() {}
}  // namespace idem::testing::detail
#endif
