#pragma once

// Fixtures for tests of code over a store: an in-memory store, wrapped in a FaultStore so
// a test can count calls and inject failures.

#include <gtest/gtest.h>

#include <memory>

#include "idem/clock.h"
#include "idem/stores/memory_store.h"
#include "idem/testing/fault_store.h"

namespace idem::testing {

// The store judges time by a clock that moves only when told to.
class ManualClockStoreTest : public ::testing::Test {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>();
  std::shared_ptr<MemoryStore> memory_ =
      std::make_shared<MemoryStore>(MemoryStoreOptions{.clock = clock_});
  std::shared_ptr<FaultStore> store_ = std::make_shared<FaultStore>(memory_);
};

// The store judges time by the system clock, for a heartbeat to run against for real.
class SystemClockStoreTest : public ::testing::Test {
 protected:
  std::shared_ptr<MemoryStore> memory_ = std::make_shared<MemoryStore>();
  std::shared_ptr<FaultStore> store_ = std::make_shared<FaultStore>(memory_);
};

}  // namespace idem::testing
