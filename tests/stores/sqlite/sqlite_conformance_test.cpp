// The shared store suite (SPEC §3–§8), unchanged, on a fresh SQLite file per test with a
// fake clock.

#include <memory>

#include "conformance/store_conformance.h"
#include "idem/stores/sqlite_store.h"
#include "stores/sqlite/sqlite_test_util.h"

namespace idem::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(
    Sqlite, StoreConformance,
    ::testing::Values(StoreTestContext{
        .name = "sqlite",
        .make = [](std::shared_ptr<ManualClock> clock) -> std::shared_ptr<Store> {
          return std::make_shared<SqliteStore>(
              SqliteStoreOptions{.path = fresh_db_path("conformance"), .clock = std::move(clock)});
        },
        .fake_clock = true}),
    ContextName{});

}  // namespace
}  // namespace idem::testing
