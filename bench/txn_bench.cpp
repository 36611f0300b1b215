// Transactional completion (SPEC §14) against the usual two commits, on the same workload:
// each operation is one fresh key whose action inserts one row into the application's own
// table, on the application's connection.
//
//   two  run(): the action's INSERT commits on its own, then the executor's complete (a
//        second commit, on the store's connection).
//   tx   run_in_transaction(): BEGIN, the INSERT, the COMPLETE record, COMMIT on the
//        application's connection (the lease is still taken on the store's connection).
//   open run_in_open_transaction() inside the caller's BEGIN ... COMMIT: the acquire, the
//        INSERT and the complete in one transaction, no lease.
//
// The three take turns in slices of 250 ms (bench/taking_turns.h), so their ratios come
// from the same minutes of a shared machine.
//
//   txn_bench sqlite:/path/app.db CALLERS SECONDS [normal|full]   (synchronous, both sides;
//                                                                  full by default)
//   txn_bench postgresql://... CALLERS SECONDS         (the server's synchronous_commit)
//
// Prints operations per second of each and the ratios tx/two and open/two. TXN_ONLY=0|1|2
// runs one of them alone (two, tx, open), for a profiler.

#include <sqlite3.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "idem/idem.h"
#include "taking_turns.h"

#ifdef IDEM_BENCH_WITH_POSTGRES
#include <libpq-fe.h>
#endif

namespace {

class Conn {
 public:
  virtual ~Conn() = default;
  virtual idem::SqlConnection conn() = 0;
  virtual void exec(const std::string& sql) = 0;
};

class SqliteConn final : public Conn {
 public:
  SqliteConn(const std::string& path, const std::string& synchronous) {
    sqlite3_open(path.c_str(), &db_);
    sqlite3_busy_timeout(db_, 30000);
    exec("PRAGMA synchronous = " + synchronous);
  }
  ~SqliteConn() override { sqlite3_close_v2(db_); }
  idem::SqlConnection conn() override { return idem::SqlConnection::sqlite(db_); }
  void exec(const std::string& sql) override {
    char* error = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
      std::fprintf(stderr, "%s: %s\n", sql.c_str(), error ? error : "?");
      std::exit(1);
    }
  }

 private:
  sqlite3* db_ = nullptr;
};

#ifdef IDEM_BENCH_WITH_POSTGRES
class PgConn final : public Conn {
 public:
  explicit PgConn(const std::string& url) : conn_(PQconnectdb(url.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) {
      std::fprintf(stderr, "%s\n", PQerrorMessage(conn_));
      std::exit(1);
    }
  }
  ~PgConn() override { PQfinish(conn_); }
  idem::SqlConnection conn() override { return idem::SqlConnection::postgres(conn_); }
  void exec(const std::string& sql) override {
    PGresult* r = PQexec(conn_, sql.c_str());
    const ExecStatusType s = PQresultStatus(r);
    PQclear(r);
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
      std::fprintf(stderr, "%s: %s\n", sql.c_str(), PQerrorMessage(conn_));
      std::exit(1);
    }
  }

 private:
  PGconn* conn_;
};
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: %s sqlite:/path|postgresql://... CALLERS SECONDS [normal|full]\n",
                 argv[0]);
    return 2;
  }
  const std::string synchronous = argc == 5 ? argv[4] : "full";
  const std::string where = argv[1];
  const int callers = std::atoi(argv[2]);
  const double seconds = std::atof(argv[3]);
  const bool sqlite = where.rfind("sqlite:", 0) == 0;
#ifndef IDEM_BENCH_WITH_POSTGRES
  if (!sqlite) {
    std::fprintf(stderr, "this build has no PostgreSQL\n");
    return 2;
  }
#endif
  auto connect = [&]() -> std::unique_ptr<Conn> {
    if (sqlite) return std::make_unique<SqliteConn>(where.substr(7), synchronous);
#ifdef IDEM_BENCH_WITH_POSTGRES
    return std::make_unique<PgConn>(where);
#else
    return nullptr;
#endif
  };
  if (sqlite) std::filesystem::remove(where.substr(7));
  connect()->exec("DROP TABLE IF EXISTS bench_effects");
  connect()->exec("CREATE TABLE bench_effects (k TEXT, v TEXT)");
  const std::string store_url =
      sqlite ? "sqlite://" + where.substr(7) + "?shared=1&synchronous=" + synchronous
             : where + (where.find('?') == std::string::npos ? "?" : "&") + "table=idem_txn_bench";
  idem::Executor exec(idem::open_store(store_url));
  std::vector<std::unique_ptr<Conn>> conns;
  for (int c = 0; c < callers; ++c) conns.push_back(connect());
  std::atomic<long> next{0};
  auto key = [&] { return "k" + std::to_string(next.fetch_add(1)); };
  auto effect = [&](int t, const std::string& k) {
    conns[static_cast<std::size_t>(t)]->exec("INSERT INTO bench_effects VALUES ('" + k + "', 'v')");
  };
  const char* names[] = {"two", "tx", "open"};
  auto op = [&](int mode) {
    return [&, mode](int t, long) {
      const std::string k = key();
      Conn& c = *conns[static_cast<std::size_t>(t)];
      auto action = [&](const idem::Attempt&) {
        effect(t, k);
        return std::string("done");
      };
      if (mode == 0) {
        (void)exec.run("bench", k, action);
      } else if (mode == 1) {
        (void)exec.run_in_transaction(c.conn(), "bench", k, action);
      } else {
        c.exec(sqlite ? "BEGIN IMMEDIATE" : "BEGIN");
        (void)exec.run_in_open_transaction(c.conn(), "bench", k, action);
        c.exec("COMMIT");
      }
    };
  };
  long ops[3] = {0, 0, 0};
  double secs[3] = {0, 0, 0};
  for (int mode = 0; mode < 3; ++mode) (void)idem::bench::slice(callers, op(mode));  // warm up
  const char* only = std::getenv("TXN_ONLY");  // profiling: one mode alone (0, 1, 2)
  for (double spent = 0; spent < seconds;) {
    for (int mode = 0; mode < 3; ++mode) {
      if (only != nullptr && mode != std::atoi(only)) continue;
      auto [n, s] = idem::bench::slice(callers, op(mode));
      ops[mode] += n;
      secs[mode] += s;
      spent += s;
    }
  }
  double rate[3];
  for (int mode = 0; mode < 3; ++mode) rate[mode] = static_cast<double>(ops[mode]) / secs[mode];
  std::printf("%s, %d caller(s):",
              sqlite ? ("SQLite synchronous=" + synchronous).c_str() : "PostgreSQL", callers);
  for (int mode = 0; mode < 3; ++mode) std::printf(" %s %.0f/s", names[mode], rate[mode]);
  std::printf("; tx/two %.2f, open/two %.2f\n", rate[1] / rate[0], rate[2] / rate[0]);
  return 0;
}
