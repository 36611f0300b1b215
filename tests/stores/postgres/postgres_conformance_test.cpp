// The shared store suite (SPEC §3–§8), unchanged, on a fresh table of the test server per
// test, judged by the server's clock.

#include <memory>

#include "idem/stores/postgres_store.h"
#include "idem/testing/store_conformance.h"
#include "stores/postgres/postgres_test_util.h"

namespace idem::testing {
namespace {

IDEM_INSTANTIATE_STORE_CONFORMANCE(
    Postgres, StoreTestContext{.name = "postgres",
                               .make = [](std::shared_ptr<ManualClock>) -> std::shared_ptr<Store> {
                                 return fresh_postgres_store();
                               },
                               .fake_clock = false,
                               .tick = Duration{200}});

}  // namespace
}  // namespace idem::testing
