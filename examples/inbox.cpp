// A queue consumer that applies each message at most once, however often it is delivered
// (idem/inbox.h, SPEC §14). The queue is a table in the application's database; a consumer
// takes a message, applies it to the ledger through the inbox, and deletes it, all in one
// transaction. Redelivered messages (the same message id twice in the queue, as a broker
// that lost an acknowledgement would send) are skipped, and a consumer that dies mid-way
// leaves the message in the queue and nothing else.
//
//   inbox sqlite:/tmp/app.db              (one consumer: SQLite has one writer at a time)
//   inbox postgresql://user@host/db       (three consumers, FOR UPDATE SKIP LOCKED)
//
// Exits 1 unless the ledger holds every message id exactly once.

#include <sqlite3.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/idem.h"

#ifdef IDEM_EXAMPLE_WITH_POSTGRES
#include <libpq-fe.h>
#endif

namespace {

// The application's connection: SQL in, the first column of the first row out.
class Db {
 public:
  virtual ~Db() = default;
  virtual idem::SqlConnection conn() = 0;
  // Runs `sql` and returns the first column of its first row ("" when none).
  virtual std::string query(const std::string& sql) = 0;
  virtual std::string begin_sql() const = 0;
  virtual std::string take_sql() const = 0;  // the next message: id, message_id, amount
};

class SqliteDb final : public Db {
 public:
  explicit SqliteDb(const std::string& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK)
      throw std::runtime_error(sqlite3_errmsg(db_));
    sqlite3_busy_timeout(db_, 10000);
  }
  ~SqliteDb() override { sqlite3_close_v2(db_); }
  idem::SqlConnection conn() override { return idem::SqlConnection::sqlite(db_); }
  std::string query(const std::string& sql) override {
    std::string first;
    char* error = nullptr;
    auto keep = [](void* out, int n, char** values, char**) {
      auto& s = *static_cast<std::string*>(out);
      if (s.empty() && n > 0 && values[0] != nullptr) s = values[0];
      return 0;
    };
    if (sqlite3_exec(db_, sql.c_str(), keep, &first, &error) != SQLITE_OK) {
      const std::string why = error ? error : "?";
      sqlite3_free(error);
      throw std::runtime_error(sql + ": " + why);
    }
    return first;
  }
  std::string begin_sql() const override { return "BEGIN IMMEDIATE"; }
  std::string take_sql() const override {
    return "SELECT id || ' ' || message_id || ' ' || amount FROM queue ORDER BY id LIMIT 1";
  }

 private:
  sqlite3* db_ = nullptr;
};

#ifdef IDEM_EXAMPLE_WITH_POSTGRES
class PgDb final : public Db {
 public:
  explicit PgDb(const std::string& url) : conn_(PQconnectdb(url.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) throw std::runtime_error(PQerrorMessage(conn_));
  }
  ~PgDb() override { PQfinish(conn_); }
  idem::SqlConnection conn() override { return idem::SqlConnection::postgres(conn_); }
  std::string query(const std::string& sql) override {
    std::unique_ptr<PGresult, decltype(&PQclear)> r(PQexec(conn_, sql.c_str()), &PQclear);
    const ExecStatusType s = PQresultStatus(r.get());
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
      throw std::runtime_error(sql + ": " + PQerrorMessage(conn_));
    }
    return s == PGRES_TUPLES_OK && PQntuples(r.get()) > 0 ? PQgetvalue(r.get(), 0, 0) : "";
  }
  std::string begin_sql() const override { return "BEGIN"; }
  std::string take_sql() const override {
    // Consumers skip each other's messages instead of queueing behind them.
    return "SELECT id || ' ' || message_id || ' ' || amount FROM queue ORDER BY id LIMIT 1 "
           "FOR UPDATE SKIP LOCKED";
  }

 private:
  PGconn* conn_;
};
#endif

std::unique_ptr<Db> connect(const std::string& where) {
  if (where.rfind("sqlite:", 0) == 0) return std::make_unique<SqliteDb>(where.substr(7));
#ifdef IDEM_EXAMPLE_WITH_POSTGRES
  return std::make_unique<PgDb>(where);
#else
  throw std::runtime_error("this build has no PostgreSQL store: " + where);
#endif
}

// Takes messages until the queue is empty; returns how many it applied and skipped.
void consume(const std::string& where, idem::Executor& exec, int& applied, int& skipped) {
  auto db = connect(where);
  idem::Inbox inbox(exec, "ledger");
  for (;;) {
    db->query(db->begin_sql());
    const std::string next = db->query(db->take_sql());
    if (next.empty()) {
      db->query("COMMIT");
      return;
    }
    char message_id[64] = {};
    long long id = 0;
    int amount = 0;
    std::sscanf(next.c_str(), "%lld %63s %d", &id, message_id, &amount);
    try {
      const bool fresh = inbox.process(db->conn(), message_id, [&] {
        db->query("INSERT INTO ledger (message_id, amount) VALUES ('" + std::string(message_id) +
                  "', " + std::to_string(amount) + ")");
      });
      (fresh ? applied : skipped) += 1;
      db->query("DELETE FROM queue WHERE id = " + std::to_string(id));
      db->query("COMMIT");
    } catch (const idem::InProgress&) {
      // Another consumer is applying a copy of this message right now: leave it for later.
      db->query("ROLLBACK");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string where =
      argc > 1 ? argv[1]
               : "sqlite:" + (std::filesystem::temp_directory_path() / "idem_inbox.db").string();
  try {
    const bool sqlite = where.rfind("sqlite:", 0) == 0;
    if (sqlite) std::filesystem::remove(where.substr(7));
    auto db = connect(where);
    db->query("DROP TABLE IF EXISTS queue");
    db->query("DROP TABLE IF EXISTS ledger");
    db->query(sqlite
                  ? "CREATE TABLE queue (id INTEGER PRIMARY KEY, message_id TEXT, amount INT)"
                  : "CREATE TABLE queue (id bigserial PRIMARY KEY, message_id text, amount int)");
    db->query("CREATE TABLE ledger (message_id TEXT, amount INT)");
    // 40 messages; every fifth is delivered twice.
    int expected_total = 0;
    int deliveries = 0;
    for (int m = 0; m < 40; ++m) {
      for (int copy = 0; copy < (m % 5 == 0 ? 2 : 1); ++copy) {
        db->query("INSERT INTO queue (message_id, amount) VALUES ('m" + std::to_string(m) + "', " +
                  std::to_string(m + 1) + ")");
        ++deliveries;
      }
      expected_total += m + 1;
    }
    // idem's records live in the same database, so they commit with the ledger's rows.
    const std::string store_url = sqlite
                                      ? "sqlite://" + where.substr(7) + "?shared=1"
                                      : where + (where.find('?') == std::string::npos ? "?" : "&") +
                                            "table=idem_inbox_example";
    idem::Executor exec(idem::open_store(store_url));
    (void)exec.store().forget("inbox:ledger", "m0");  // a clean slate on PostgreSQL reruns
    for (int m = 1; m < 40; ++m) (void)exec.store().forget("inbox:ledger", "m" + std::to_string(m));

    const int consumers = sqlite ? 1 : 3;
    std::vector<int> applied(static_cast<std::size_t>(consumers));
    std::vector<int> skipped(static_cast<std::size_t>(consumers));
    std::vector<std::thread> threads;
    for (int c = 0; c < consumers; ++c) {
      threads.emplace_back([&, c] {
        consume(where, exec, applied[static_cast<std::size_t>(c)],
                skipped[static_cast<std::size_t>(c)]);
      });
    }
    for (auto& t : threads) t.join();
    int total_applied = 0;
    int total_skipped = 0;
    for (int c = 0; c < consumers; ++c) {
      total_applied += applied[static_cast<std::size_t>(c)];
      total_skipped += skipped[static_cast<std::size_t>(c)];
    }
    const int rows = std::stoi(db->query("SELECT count(*) FROM ledger"));
    const int distinct = std::stoi(db->query("SELECT count(DISTINCT message_id) FROM ledger"));
    const int total = std::stoi(db->query("SELECT coalesce(sum(amount), 0) FROM ledger"));
    std::printf(
        "%d deliveries of 40 messages, %d consumer(s): %d applied, %d redeliveries "
        "skipped; ledger: %d rows, %d message ids, total %d (expected %d)\n",
        deliveries, consumers, total_applied, total_skipped, rows, distinct, total, expected_total);
    return rows == 40 && distinct == 40 && total == expected_total ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "inbox: %s\n", e.what());
    return 1;
  }
}
