#pragma once

// The one conformance suite every store runs unchanged (SPEC §3–§8). A store's test
// executable links the `idem_conformance` object library and instantiates the suite:
//
//   INSTANTIATE_TEST_SUITE_P(Memory, StoreConformance,
//                            ::testing::Values(idem::testing::StoreTestContext{
//                                .name = "memory",
//                                .make = [](std::shared_ptr<idem::ManualClock> clock) {...},
//                                .fake_clock = true}),
//                            idem::testing::ContextName{});

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "idem/clock.h"
#include "idem/store.h"

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
  // a small multiple of it; make it comfortably larger than a store round trip.
  Duration tick{200};
};

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

  std::shared_ptr<ManualClock> clock_;
  std::shared_ptr<Store> store_;
};

}  // namespace idem::testing
