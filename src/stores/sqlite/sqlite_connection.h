#pragma once

// Thin RAII over the SQLite C API, private to the SQLite store. Every C handle lives in a
// unique_ptr with a deleter; every return code goes through Connection::check(), the one
// place that turns an SQLite failure into idem::StoreUnavailable naming the file and the
// cause; a Query resets its statement when it goes out of scope, and a Transaction rolls
// back unless it was committed.

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/types.h"

namespace idem::sqlite {

struct DbCloser {
  // False for a caller's connection that the store only borrows (SPEC §14).
  bool owned = true;
  void operator()(sqlite3* db) const noexcept {
    if (owned) sqlite3_close_v2(db);
  }
};
struct StmtFinalizer {
  void operator()(sqlite3_stmt* stmt) const noexcept { sqlite3_finalize(stmt); }
};
using DbHandle = std::unique_ptr<sqlite3, DbCloser>;
using StmtHandle = std::unique_ptr<sqlite3_stmt, StmtFinalizer>;

class Connection;

// A prepared statement and a short name for error messages ("acquire: read").
struct Statement {
  StmtHandle handle;
  const char* name = "";
};

// How a connection opens its file.
enum class OpenMode {
  kCreate,    // read-write, creating the file when missing
  kExisting,  // read-write, the file must exist
  kReadOnly,  // read-only; the file must exist
};

// One open database connection. Used by one thread at a time (the store's pool hands it
// out), so it is opened with SQLITE_OPEN_NOMUTEX.
class Connection {
 public:
  // Opens `path` as `mode` says and sets the busy handler. Throws StoreUnavailable naming
  // `store` when the file cannot be opened. A read-only connection to a WAL file whose
  // shared-memory index cannot be created (a read-only directory with no -wal file, so no
  // other connection is open) reads the file as it is on disk (SQLite's immutable mode).
  Connection(const std::string& path, std::string store, Duration busy_timeout,
             OpenMode mode = OpenMode::kCreate);
  // A caller's open connection (SPEC §14), used as it is: never closed, and its own busy
  // handler or timeout is left alone.
  Connection(sqlite3* borrowed, std::string store);
  // The busy handler keeps a pointer to the connection.
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  sqlite3* db() const noexcept { return db_.get(); }
  const std::string& store() const noexcept { return store_; }

  // Returns rc when it is SQLITE_OK, SQLITE_ROW or SQLITE_DONE; otherwise throws
  // StoreUnavailable with `what` and SQLite's own message.
  int check(int rc, std::string_view what) const;
  [[noreturn]] void fail(int rc, std::string_view what) const;

  Statement prepare(const char* sql, const char* name) const;
  // Runs one or more statements that return no rows we need (pragmas that set, DDL).
  void exec(const char* sql, std::string_view what) const;
  // Runs a statement returning one integer (PRAGMA user_version, count(*)).
  std::int64_t query_int(const char* sql, std::string_view what) const;
  // Runs a statement returning one text value (PRAGMA journal_mode=WAL).
  std::string query_text(const char* sql, std::string_view what) const;
  // The same without throwing: returns SQLite's result code and sets `out` on success.
  int try_query_text(const char* sql, std::string& out) const;

  Duration busy_timeout() const noexcept { return busy_timeout_; }

  bool in_transaction() const noexcept { return sqlite3_get_autocommit(db_.get()) == 0; }

 private:
  // Opens `name` with `flags` in place of the current handle and sets the busy handler.
  void open(const char* name, int flags);
  static int on_busy(void* self, int count) noexcept;

  std::string store_;
  Duration busy_timeout_;
  std::chrono::steady_clock::time_point busy_since_{};
  DbHandle db_;
};

// One use of a prepared statement: bind, step, read columns. Resets the statement and
// clears its bindings when it goes out of scope, so no read transaction stays open and no
// bound pointer outlives the call.
class Query {
 public:
  Query(const Connection& conn, Statement& stmt) noexcept : conn_(conn), stmt_(stmt) {}
  ~Query();
  Query(const Query&) = delete;
  Query& operator=(const Query&) = delete;

  // Bytes are always bound as BLOBs with explicit lengths (never as C strings), so any
  // bytes, NUL included, round-trip. An empty value is bound as a zero-length BLOB, not
  // NULL.
  Query& bind(int index, std::string_view bytes);
  Query& bind(int index, std::int64_t value);
  Query& bind_null(int index);
  Query& bind_time(int index, Timestamp t) { return bind(index, t.time_since_epoch().count()); }

  // Steps once: true when a row is available, false when the statement is done.
  bool step();
  // Steps a statement that writes and returns no row; returns sqlite3_changes().
  int run();

  std::int64_t column_int(int col) const { return sqlite3_column_int64(raw(), col); }
  Timestamp column_time(int col) const { return Timestamp{Duration{column_int(col)}}; }
  bool column_is_null(int col) const { return sqlite3_column_type(raw(), col) == SQLITE_NULL; }
  // The column's bytes; valid until the next step or the end of the Query.
  std::string_view column_bytes(int col) const;

 private:
  sqlite3_stmt* raw() const noexcept { return stmt_.handle.get(); }
  void check_bind(int rc);

  const Connection& conn_;
  Statement& stmt_;
};

// BEGIN IMMEDIATE on construction (waiting up to the busy timeout for the write lock);
// ROLLBACK in the destructor unless commit() succeeded.
class Transaction {
 public:
  Transaction(const Connection& conn, Statement& begin, Statement& commit, Statement& rollback);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  void commit();

 private:
  const Connection& conn_;
  Statement& commit_;
  Statement& rollback_;
  bool open_ = true;
};

}  // namespace idem::sqlite
