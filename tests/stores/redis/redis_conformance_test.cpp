// The shared store suite (SPEC §3–§8), unchanged, on the shared Redis server with a fresh
// key prefix per test (so each test starts from an empty store). Redis judges time by its
// own clock, so the suite sleeps in real ticks; records expire natively; tokens increase
// across the whole store (its token key, SPEC §2).

#include <memory>

#include "idem/stores/redis_store.h"
#include "idem/testing/store_conformance.h"
#include "stores/redis/redis_test_util.h"

namespace idem::testing {
namespace {

// Without IDEM_TEST_REDIS_URL every test of this executable skips, or the executable exits
// 1 under IDEM_REQUIRE_SERVERS=1 (scripts/test.sh sets both).
::testing::Environment* const kRedisEnvironment =
    ::testing::AddGlobalTestEnvironment(new ServerEnvironment(
        "IDEM_TEST_REDIS_URL", "source scripts/servers.sh and run idem_start_redis"));

IDEM_INSTANTIATE_STORE_CONFORMANCE(
    Redis, StoreTestContext{.name = "redis",
                            .make = [](std::shared_ptr<ManualClock>) -> std::shared_ptr<Store> {
                              return std::make_shared<RedisStore>(shared_options());
                            },
                            .fake_clock = false,
                            .tick = Duration{200},
                            .native_expiry = true,
                            .store_wide_tokens = true});

}  // namespace
}  // namespace idem::testing
