// The shared store suite (SPEC §3–§8), unchanged, on a fresh SQLite file per test with a
// fake clock.

#include <memory>

#include "idem/stores/sqlite_store.h"
#include "idem/testing/store_conformance.h"
#include "stores/sqlite/sqlite_test_util.h"

namespace idem::testing {
namespace {

IDEM_INSTANTIATE_STORE_CONFORMANCE(
    Sqlite,
    StoreTestContext{.name = "sqlite",
                     .make = [](std::shared_ptr<ManualClock> clock) -> std::shared_ptr<Store> {
                       return std::make_shared<SqliteStore>(SqliteStoreOptions{
                           .path = fresh_db_path("conformance"), .clock = std::move(clock)});
                     },
                     .fake_clock = true});

}  // namespace
}  // namespace idem::testing
