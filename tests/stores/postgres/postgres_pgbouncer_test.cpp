// The PostgreSQL store behind PgBouncer 1.18 with its default settings (scripts/servers.sh
// starts one in transaction pooling, IDEM_TEST_PGBOUNCER_TX_URL, and one in session
// pooling, IDEM_TEST_PGBOUNCER_SESSION_URL, in front of the test server): the shared
// conformance suite through each, two stores on different tables behind one transaction
// pool, server defaults that are not read committed, and a pooler whose pool is smaller
// than the store's (a PgBouncer of the test's own, pgbouncer.sh).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"
#include "idem/stores/postgres_store.h"
#include "idem/testing/matchers.h"
#include "idem/testing/store_conformance.h"
#include "stores/postgres/postgres_test_util.h"
#include "support/eventually.h"
#include "support/server_script.h"

#ifndef IDEM_PGBOUNCER_SCRIPT
#error "IDEM_PGBOUNCER_SCRIPT is set by tests/stores/postgres/CMakeLists.txt"
#endif

namespace idem::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string tx_url() { return env_or_empty("IDEM_TEST_PGBOUNCER_TX_URL"); }
std::string session_url() { return env_or_empty("IDEM_TEST_PGBOUNCER_SESSION_URL"); }

::testing::Environment* const kTxEnvironment =
    ::testing::AddGlobalTestEnvironment(new ServerEnvironment(
        "IDEM_TEST_PGBOUNCER_TX_URL",
        "source scripts/servers.sh; idem_start_postgres; idem_start_pgbouncer transaction"));
::testing::Environment* const kSessionEnvironment =
    ::testing::AddGlobalTestEnvironment(new ServerEnvironment(
        "IDEM_TEST_PGBOUNCER_SESSION_URL",
        "source scripts/servers.sh; idem_start_postgres; idem_start_pgbouncer session"));

// --- the shared suite through each pooler ---

// Transaction pooling with the store's defaults: it sees a pooler (the backend pid PgBouncer
// made up is not the server's) and keeps nothing in a server session.
IDEM_INSTANTIATE_STORE_CONFORMANCE(
    PgbouncerTransaction,
    StoreTestContext{.name = "postgres_pgbouncer_transaction",
                     .make = [](std::shared_ptr<ManualClock>) -> std::shared_ptr<Store> {
                       return fresh_postgres_store(PostgresStoreOptions{.conninfo = tx_url()});
                     },
                     .fake_clock = false,
                     .tick = Duration{200}});

// Session pooling, declared (pooler=session): settings made once per connection and
// statements prepared once per server session, as on a direct connection. Each connection
// holds one of PgBouncer's 20 server connections (default_pool_size) for its life, so the
// store's pool is kept small enough for two tests at once (docs/stores/postgres.md,
// "Sizing a pooler").
IDEM_INSTANTIATE_STORE_CONFORMANCE(
    PgbouncerSession,
    StoreTestContext{
        .name = "postgres_pgbouncer_session",
        .make = [](std::shared_ptr<ManualClock>) -> std::shared_ptr<Store> {
          return fresh_postgres_store(PostgresStoreOptions{
              .conninfo = session_url(), .pool_size = 4, .pooler = PostgresPooler::kSession});
        },
        .fake_clock = false,
        .tick = Duration{200}});

// --- two stores, one pool ---

// Issue 17: behind one transaction pool, prepared statements collided across server
// connections (42P05, 26000), and a store on table b ran a statement that a store on table a
// had prepared, writing its lease into a. Here two stores on two tables share the pool,
// interleaved on the same scopes and keys, while another client of the pool drops every
// prepared statement of the server session it lands on (DEALLOCATE ALL, as some frameworks
// do between uses), so statements go missing under the stores all the time.
class PgbouncerTwoTables : public ::testing::TestWithParam<std::string> {};

TEST_P(PgbouncerTwoTables, StoresOnTwoTablesBehindOnePoolNeverSeeEachOthersRecords) {
  const std::string statements = GetParam();
  struct Side {
    std::string name;
    std::string table;
    std::shared_ptr<Store> store;
  };
  std::vector<Side> sides = {{"a", fresh_table("pool_a"), nullptr},
                             {"b", fresh_table("pool_b"), nullptr}};
  for (Side& side : sides) {
    side.store = open_store(tx_url() + "?table=" + side.table + "&statements=" + statements);
  }
  std::atomic<bool> done{false};
  std::thread disrupter([&] {
    RawPg other(tx_url());
    while (!done) {
      other.exec("DEALLOCATE ALL");
      std::this_thread::sleep_for(2ms);
    }
  });
  constexpr int kThreads = 8;
  constexpr int kKeys = 12;
  std::mutex mu;
  std::vector<std::string> wrong;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) + 1u);
      for (int i = 0; i < 60; ++i) {
        const Side& side = sides[static_cast<std::size_t>((t + i) % 2)];
        const std::string key = "k" + std::to_string(rng() % kKeys);
        try {
          AcquireResult r = side.store->acquire("s", key, 1h, 1h);
          if (const auto* a = std::get_if<Acquired>(&r)) {
            if (side.store->complete("s", key, a->lease.token, side.name + ":" + key, 1h) !=
                WriteResult::kDone) {
              std::lock_guard lock(mu);
              wrong.push_back(side.name + " lost its lease on " + key);
            }
          } else if (const auto* replay = std::get_if<Replay>(&r)) {
            if (replay->payload != side.name + ":" + key) {
              std::lock_guard lock(mu);
              wrong.push_back(side.name + " replayed '" + replay->payload + "' for " + key);
            }
          }
        } catch (const std::exception& e) {
          std::lock_guard lock(mu);
          wrong.push_back(side.name + ": " + e.what());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  disrupter.join();
  EXPECT_THAT(wrong, ::testing::IsEmpty());
  RawPg direct(postgres_url());
  for (const Side& side : sides) {
    // Every row of a table is its own store's, and nothing else is in it.
    EXPECT_EQ(
        direct.value("SELECT count(*) FROM " + side.table + " WHERE payload <> convert_to('" +
                     side.name + ":' || convert_from(key, 'UTF8'), 'UTF8') OR payload IS NULL"),
        "0")
        << side.table;
    for (int k = 0; k < kKeys; ++k) {
      const std::string key = "k" + std::to_string(k);
      std::optional<Record> r = side.store->get("s", key);
      if (r) {
        EXPECT_EQ(r->payload, side.name + ":" + key);
      }
    }
  }
  for (Side& side : sides) {
    side.store.reset();
    drop_table(postgres_url(), side.table);
  }
}

INSTANTIATE_TEST_SUITE_P(Statements, PgbouncerTwoTables, ::testing::Values("prepared", "unnamed"));

// --- server settings through the pooler ---

// Issue 17, behind a transaction pooler: the isolation cannot be a session's default
// there, so each write carries BEGIN ISOLATION LEVEL READ COMMITTED.
TEST(PgbouncerServerIsolation, ConcurrentWritesNeverFailUnderASerializableDefault) {
  ScratchDatabase db("default_transaction_isolation", "serializable");
  std::shared_ptr<Store> s = open_store(db.url(tx_url()));
  EXPECT_THAT(contend(*s), ::testing::IsEmpty());
}

// --- sizing ---

// Issue 17: with session pooling and a pooler smaller than the store's pool, calls failed
// with "timed out preparing a statement". A PgBouncer of the test's own in session pooling
// with one server connection for the database: the store's first connection holds it for
// its life. A call that waits for a lock keeps that connection busy, so a second call opens
// a connection of its own, which PgBouncer queues for a server connection. Then the lock
// goes and the first call ends, but its connection keeps the server connection (session
// pooling), so the second call gets none in time, and its error says so and points at the
// sizes. (Letting the first call time out instead would race: its connection closes just
// before the second call's deadline and hands the server connection over.)
TEST(PgbouncerSizing, APoolerSmallerThanThePoolNamesTheWaitForAServerConnection) {
  IDEM_SKIP_OR_FAIL_UNLESS(::geteuid() == 0, "starting PgBouncer needs root");
  char pattern[] = "/tmp/idem-pgbouncer-test-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  struct Destroy {
    std::string dir;
    ~Destroy() { run_server_script(IDEM_PGBOUNCER_SCRIPT, "destroy", dir); }
  } destroy{dir};
  const std::string port =
      run_server_script(IDEM_PGBOUNCER_SCRIPT, "start", dir,
                        {"session", env_or_empty("IDEM_TEST_POSTGRES_SOCKET_DIR"),
                         env_or_empty("IDEM_TEST_POSTGRES_PORT"), "pool_size=1"});
  ASSERT_FALSE(port.empty());
  const std::string table = fresh_table("sizing");
  open_store(postgres_url() + "?table=" + table).reset();  // made directly, beforehand
  auto store = open_store("postgresql://postgres@127.0.0.1:" + port + "/idem_test?table=" + table +
                          "&pool_size=2&timeout=4000");
  RawPg locker(postgres_url());
  locker.exec("BEGIN; LOCK TABLE " + table + " IN ACCESS EXCLUSIVE MODE");
  std::thread holder([&] {
    EXPECT_NO_THROW((void)store->forget("s", "held"));  // ends once the lock goes
  });
  RawPg watch(postgres_url());
  ASSERT_TRUE(eventually([&] {
    return watch.value(
               "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
               "AND query LIKE '%" +
               table + "%'") != "0";
  }));
  std::string second_error;
  std::thread second([&] {
    try {
      (void)store->forget("s", "second");
      second_error = "a call got a server connection the pooler does not have";
    } catch (const StoreUnavailable& e) {
      second_error = e.reason();
    }
  });
  // PgBouncer's own console: the second call's connection waits for a server connection.
  RawPg console("postgresql://postgres@127.0.0.1:" + port + "/pgbouncer");
  EXPECT_TRUE(eventually([&] {
    std::unique_ptr<PGresult, decltype(&PQclear)> r(PQexec(console.raw(), "SHOW POOLS"), &PQclear);
    const int db = PQfnumber(r.get(), "database");
    const int waiting = PQfnumber(r.get(), "cl_waiting");
    if (PQresultStatus(r.get()) != PGRES_TUPLES_OK || db < 0 || waiting < 0) return false;
    for (int i = 0; i < PQntuples(r.get()); ++i) {
      if (std::string(PQgetvalue(r.get(), i, db)) == "idem_test" &&
          std::string(PQgetvalue(r.get(), i, waiting)) != "0") {
        return true;
      }
    }
    return false;
  }));
  locker.exec("ROLLBACK");
  holder.join();
  second.join();
  EXPECT_THAT(second_error, AllOf(HasSubstr("server connection"), HasSubstr("pool_size=2"),
                                  HasSubstr("Sizing a pooler")));
  store.reset();
  drop_table(postgres_url(), table);
}

}  // namespace
}  // namespace idem::testing
