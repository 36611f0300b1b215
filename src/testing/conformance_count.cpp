#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "idem/testing/store_conformance.h"

namespace idem::testing {

// Counted by src/testing/conformance/CMakeLists.txt. Kept out of the suite's files, so that
// asking does not link them.
int store_conformance_test_count() { return IDEM_CONFORMANCE_TEST_COUNT; }

int instantiated_conformance_tests(std::string_view prefix) {
  const std::string suite = std::string(prefix) + "/StoreConformance";
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    if (unit.GetTestSuite(i)->name() == suite) return unit.GetTestSuite(i)->total_test_count();
  }
  return 0;
}

}  // namespace idem::testing
