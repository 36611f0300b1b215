// The shared store suite (SPEC §3–§8), unchanged, on the shared Redis server with a fresh
// key prefix per test (so each test starts from an empty store). Redis judges time by its
// own clock, so the suite sleeps in real ticks; records expire natively; tokens increase
// per key but are not unique across keys (SPEC §2).
//
// The test list is read when ctest runs (DISCOVERY_MODE PRE_TEST), so the suite exists
// exactly when a server is there: without IDEM_TEST_REDIS_URL it is left out (and a
// missing server fails the run when IDEM_REQUIRE_SERVERS=1).

#include <memory>
#include <stdexcept>
#include <vector>

#include "conformance/store_conformance.h"
#include "idem/stores/redis_store.h"
#include "stores/redis/redis_test_util.h"

namespace idem::testing {
namespace {

std::vector<StoreTestContext> contexts() {
  if (!shared_redis_url() && !servers_required()) return {};
  return {StoreTestContext{
      .name = "redis",
      .make = [](std::shared_ptr<ManualClock>) -> std::shared_ptr<Store> {
        if (!shared_redis_url()) {
          throw std::runtime_error("IDEM_REQUIRE_SERVERS=1 but IDEM_TEST_REDIS_URL is not set");
        }
        return std::make_shared<RedisStore>(shared_options());
      },
      .fake_clock = false,
      .tick = Duration{200},
      .native_expiry = true,
      .store_wide_tokens = false}};
}

INSTANTIATE_TEST_SUITE_P(Redis, StoreConformance, ::testing::ValuesIn(contexts()), ContextName{});
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StoreConformance);

}  // namespace
}  // namespace idem::testing
