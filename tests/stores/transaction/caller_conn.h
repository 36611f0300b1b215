#pragma once

// The caller's side of SPEC §14 in the tests: one connection of the application's own, a
// real sqlite3* or PGconn*, with the few things the tests and the crash workers run on it.
// A statement that fails throws std::runtime_error with the SQL and the database's message.

#include <sqlite3.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "idem/transaction.h"

#ifdef IDEM_TEST_WITH_POSTGRES
#include <libpq-fe.h>
#endif

namespace idem::testing {

class CallerConn {
 public:
  virtual ~CallerConn() = default;
  virtual SqlConnection conn() = 0;
  virtual void exec(const std::string& sql) = 0;
  // The first column of the first row, as an integer.
  virtual long long count(const std::string& sql) = 0;
  // The kind of BEGIN the application uses for a write transaction.
  virtual std::string begin_sql() const = 0;
  void begin() { exec(begin_sql()); }
  void commit() { exec("COMMIT"); }
  void rollback() { exec("ROLLBACK"); }
};

class SqliteConn final : public CallerConn {
 public:
  explicit SqliteConn(const std::string& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) {
      throw std::runtime_error("cannot open " + path + ": " + sqlite3_errmsg(db_));
    }
    sqlite3_busy_timeout(db_, 20000);
  }
  ~SqliteConn() override { sqlite3_close_v2(db_); }
  SqliteConn(const SqliteConn&) = delete;
  SqliteConn& operator=(const SqliteConn&) = delete;

  SqlConnection conn() override { return SqlConnection::sqlite(db_); }
  void exec(const std::string& sql) override {
    char* error = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
      const std::string why = error ? error : "?";
      sqlite3_free(error);
      throw std::runtime_error(sql + ": " + why);
    }
  }
  long long count(const std::string& sql) override {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
      const std::string why = sqlite3_errmsg(db_);
      sqlite3_finalize(st);
      throw std::runtime_error(sql + ": " + why);
    }
    const long long n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
  }
  std::string begin_sql() const override { return "BEGIN IMMEDIATE"; }

 private:
  sqlite3* db_ = nullptr;
};

#ifdef IDEM_TEST_WITH_POSTGRES
class PgConn final : public CallerConn {
 public:
  explicit PgConn(const std::string& url) : conn_(PQconnectdb(url.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) {
      const std::string why = PQerrorMessage(conn_);
      PQfinish(conn_);
      throw std::runtime_error("cannot connect to " + url + ": " + why);
    }
  }
  ~PgConn() override { PQfinish(conn_); }
  PgConn(const PgConn&) = delete;
  PgConn& operator=(const PgConn&) = delete;

  SqlConnection conn() override { return SqlConnection::postgres(conn_); }
  void exec(const std::string& sql) override {
    PGresult* r = PQexec(conn_, sql.c_str());
    const ExecStatusType s = PQresultStatus(r);
    PQclear(r);
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
      throw std::runtime_error(sql + ": " + PQerrorMessage(conn_));
    }
  }
  long long count(const std::string& sql) override {
    PGresult* r = PQexec(conn_, sql.c_str());
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) == 0) {
      PQclear(r);
      throw std::runtime_error(sql + ": " + PQerrorMessage(conn_));
    }
    const long long n = std::stoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    return n;
  }
  std::string begin_sql() const override { return "BEGIN"; }

 private:
  PGconn* conn_;
};
#endif

// "sqlite:/path" or a PostgreSQL URL: the application's connection to that database.
inline std::unique_ptr<CallerConn> connect_caller(const std::string& where) {
  if (where.rfind("sqlite:", 0) == 0) return std::make_unique<SqliteConn>(where.substr(7));
#ifdef IDEM_TEST_WITH_POSTGRES
  return std::make_unique<PgConn>(where);
#else
  throw std::runtime_error("this build has no PostgreSQL: " + where);
#endif
}

}  // namespace idem::testing
