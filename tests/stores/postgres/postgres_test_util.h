#pragma once

// Helpers for the PostgreSQL store tests: the server URL from the environment (the test
// script starts the server and sets IDEM_TEST_POSTGRES_URL), a table name nobody has used,
// stores that drop their table when released, and a raw libpq connection to inspect or
// tamper with the server behind the store's back.
//
// Without the URL every test skips, unless IDEM_REQUIRE_SERVERS=1 (set by scripts/test.sh),
// which makes every test fail instead.

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "idem/error.h"
#include "idem/stores/postgres_store.h"
#include "support/require_server.h"

namespace idem::testing {

inline std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

inline std::string postgres_url() { return env_or_empty("IDEM_TEST_POSTGRES_URL"); }

// Skips every test of the executable when the server URL is missing (exits 1 under
// IDEM_REQUIRE_SERVERS=1). Registered by each test source through kPostgresEnvironment.
inline ::testing::Environment* const kPostgresEnvironment =
    ::testing::AddGlobalTestEnvironment(new ServerEnvironment(
        "IDEM_TEST_POSTGRES_URL", "source scripts/servers.sh and run idem_start_postgres"));

// A table name no other test (in any process) has used: the process id and a counter.
inline std::string fresh_table(const std::string& stem = "t") {
  static std::atomic<int> counter{0};
  return "idem_test_" + stem + "_" + std::to_string(::getpid()) + "_" +
         std::to_string(counter.fetch_add(1));
}

// A raw connection for tests: runs SQL directly.
class RawPg {
 public:
  explicit RawPg(const std::string& conninfo) : conn_(PQconnectdb(conninfo.c_str()), &PQfinish) {
    if (PQstatus(conn_.get()) != CONNECTION_OK) {
      ADD_FAILURE() << "cannot connect to " << conninfo << ": " << PQerrorMessage(conn_.get());
    }
  }

  // Runs statements; records a failure unless they succeed or `expect_ok` is false.
  // Returns the error's SQLSTATE, or "" on success.
  std::string exec(const std::string& sql, bool expect_ok = true) {
    std::unique_ptr<PGresult, decltype(&PQclear)> r(PQexec(conn_.get(), sql.c_str()), &PQclear);
    const ExecStatusType s = PQresultStatus(r.get());
    if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK) return "";
    if (expect_ok) ADD_FAILURE() << sql << ": " << PQerrorMessage(conn_.get());
    const char* state = PQresultErrorField(r.get(), PG_DIAG_SQLSTATE);
    return state ? state : "?";
  }

  // The first column of every row, as text ("" for NULL).
  std::vector<std::string> column(const std::string& sql) {
    std::unique_ptr<PGresult, decltype(&PQclear)> r(PQexec(conn_.get(), sql.c_str()), &PQclear);
    std::vector<std::string> out;
    if (PQresultStatus(r.get()) != PGRES_TUPLES_OK) {
      ADD_FAILURE() << sql << ": " << PQerrorMessage(conn_.get());
      return out;
    }
    for (int i = 0; i < PQntuples(r.get()); ++i) out.emplace_back(PQgetvalue(r.get(), i, 0));
    return out;
  }

  // The first column of the first row, or "" when there is none.
  std::string value(const std::string& sql) {
    std::vector<std::string> c = column(sql);
    return c.empty() ? std::string() : c.front();
  }

  PGconn* raw() const { return conn_.get(); }

 private:
  std::unique_ptr<PGconn, decltype(&PQfinish)> conn_{nullptr, &PQfinish};
};

// Drops a test table and its token sequence.
inline void drop_table(const std::string& conninfo, const std::string& table) {
  RawPg raw(conninfo);
  raw.exec("DROP TABLE IF EXISTS " + table + "; DROP SEQUENCE IF EXISTS " + table + "_token_seq",
           /*expect_ok=*/false);
}

// A store on a fresh table of the test server, which drops the table when the last
// reference goes.
inline std::shared_ptr<PostgresStore> make_postgres_store(PostgresStoreOptions o) {
  const std::string conninfo = o.conninfo;
  const std::string table = o.table;
  auto* store = new PostgresStore(std::move(o));
  return std::shared_ptr<PostgresStore>(store, [conninfo, table](PostgresStore* s) {
    delete s;
    drop_table(conninfo, table);
  });
}

inline std::shared_ptr<PostgresStore> fresh_postgres_store(PostgresStoreOptions o = {}) {
  if (o.conninfo.empty()) o.conninfo = postgres_url();
  if (o.table == PostgresStoreOptions{}.table) o.table = fresh_table();
  return make_postgres_store(std::move(o));
}

// `url` with its database replaced by `database`.
inline std::string with_database(const std::string& url, const std::string& database) {
  const std::size_t query = url.find('?');
  const std::size_t slash = url.rfind('/', query);
  return url.substr(0, slash + 1) + database +
         (query == std::string::npos ? "" : url.substr(query));
}

// A database of the test server made for one test, with a default of its own (ALTER
// DATABASE ... SET, as a managed server's parameter group sets one for everyone), dropped
// at the end. Reachable through the test PgBouncers too: they send any database name on.
class ScratchDatabase {
 public:
  // e.g. ScratchDatabase("default_transaction_isolation", "serializable").
  ScratchDatabase(const std::string& setting, const std::string& value) {
    static std::atomic<int> counter{0};
    name_ = "idem_scratch_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
    RawPg raw(postgres_url());
    raw.exec("CREATE DATABASE " + name_);
    raw.exec("ALTER DATABASE " + name_ + " SET " + setting + " = '" + value + "'");
  }
  ~ScratchDatabase() {
    RawPg raw(postgres_url());
    raw.exec("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)", /*expect_ok=*/false);
  }
  ScratchDatabase(const ScratchDatabase&) = delete;
  ScratchDatabase& operator=(const ScratchDatabase&) = delete;

  // `url` (the test server's, or a PgBouncer's in front of it) naming this database.
  std::string url(const std::string& base) const { return with_database(base, name_); }

 private:
  std::string name_;
};

// 16 threads on two keys, with every kind of write the store makes (acquire, steals of
// short leases, complete, release, extend, purge, forget): the contention under which a
// server default of repeatable read or serializable makes writes fail with 40001. Returns
// the reason of every StoreUnavailable (none is expected; the store before issue 17 had 4
// to 16 at repeatable read).
inline std::vector<std::string> contend(Store& s, int threads = 16, int rounds = 400) {
  using namespace std::chrono_literals;
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 17u);
      for (int i = 0; i < rounds; ++i) {
        const std::string key = "key" + std::to_string(rng() % 2);
        try {
          AcquireResult r = s.acquire("contend", key, 20ms, 20ms);
          if (const auto* a = std::get_if<Acquired>(&r)) {
            const Token token = a->lease.token;
            switch (rng() % 5) {
              case 0:
                (void)s.release("contend", key, token);
                break;
              case 1:
                (void)s.extend("contend", key, token, 20ms);
                (void)s.complete("contend", key, token, "v", 1ms);
                break;
              case 2:
                (void)s.forget("contend", key);
                break;
              case 3:
                break;  // abandoned: stolen once its lease passes
              default:
                (void)s.complete("contend", key, token, "v", 1ms);
            }
          } else if (rng() % 4 == 0) {
            (void)s.purge(10);
          }
        } catch (const StoreUnavailable& e) {
          std::lock_guard lock(mu);
          errors.push_back(e.reason());
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  return errors;
}

}  // namespace idem::testing
