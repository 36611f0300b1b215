// The sample store (a TEST_ONLY store, tests/stores/sample/CMakeLists.txt): the conformance
// suite through open_store("sample:"), which proves the store reached the test build's
// registry from its one idem_define_store() call.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "idem/error.h"
#include "idem/open_store.h"
#include "idem/testing/store_conformance.h"

namespace idem::testing {
namespace {

IDEM_INSTANTIATE_STORE_CONFORMANCE(Sample, StoreTestContext{
                                               .name = "ByUrl",
                                               .make =
                                                   [](std::shared_ptr<ManualClock> clock) {
                                                     return open_store(
                                                         "sample:",
                                                         OpenOptions{.clock = std::move(clock)});
                                                   },
                                               .stress_scale = 5});

TEST(SampleStore, InstantiationLinksEveryTestOfTheSuite) {
  EXPECT_EQ(instantiated_conformance_tests("Sample"), store_conformance_test_count());
}

TEST(SampleStore, IsListedAndOpenedByUrl) {
  EXPECT_THAT(available_schemes(), ::testing::Contains("sample"));
  EXPECT_EQ(open_store("sample:")->describe(), "sample:");
  EXPECT_THROW(open_store("sample:x?y=1"), InvalidArgument);
}

}  // namespace
}  // namespace idem::testing
