#include "stores/sqlite/sqlite_connection.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>

#include "core/percent_encoding.h"
#include "idem/error.h"

namespace idem::sqlite {

namespace {

// `path` as an SQLite URI ("file:/a%20b.db?immutable=1"): everything but unreserved
// characters and '/' is percent-encoded, so no byte of the path reads as URI syntax.
std::string immutable_uri(const std::string& path) {
  std::string uri = "file:";
  detail::append_percent_encoded(uri, path, [](unsigned char u) {
    return std::isalnum(u) != 0 || u == '/' || u == '.' || u == '_' || u == '-' || u == '~';
  });
  return uri + "?immutable=1";
}

}  // namespace

Connection::Connection(const std::string& path, std::string store, Duration busy_timeout,
                       OpenMode mode)
    : store_(std::move(store)), busy_timeout_(busy_timeout) {
  // NOMUTEX: the pool gives a connection to one thread at a time. No SQLITE_OPEN_URI, so
  // the (absolute) path is always a plain file name.
  int flags = SQLITE_OPEN_NOMUTEX;
  if (mode == OpenMode::kReadOnly) {
    flags |= SQLITE_OPEN_READONLY;
  } else {
    flags |= SQLITE_OPEN_READWRITE | (mode == OpenMode::kCreate ? SQLITE_OPEN_CREATE : 0);
  }
  open(path.c_str(), flags);
  if (mode != OpenMode::kReadOnly) return;
  // A read-only connection reads a WAL file through its shared-memory index, which it
  // cannot create in a directory it may not write. With no -wal file there is no other
  // connection and nothing beyond the main file to read, so read that as it is on disk.
  std::string mode_name;
  const int rc = try_query_text("PRAGMA journal_mode", mode_name);
  const int primary = rc & 0xff;
  if ((primary == SQLITE_READONLY || primary == SQLITE_CANTOPEN) &&
      !std::filesystem::exists(path + "-wal")) {
    open(immutable_uri(path).c_str(), flags | SQLITE_OPEN_URI);
  }
}

Connection::Connection(sqlite3* borrowed, std::string store)
    : store_(std::move(store)), busy_timeout_(0), db_(borrowed, DbCloser{.owned = false}) {}

void Connection::open(const char* name, int flags) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(name, &raw, flags, nullptr);
  db_.reset(raw);  // sqlite3_open_v2 hands out a handle even on failure; it must be closed.
  if (raw == nullptr) throw StoreUnavailable(store_, "cannot open: out of memory");
  check(rc, "cannot open the database file");
  check(sqlite3_busy_handler(raw, &Connection::on_busy, this), "cannot set the busy handler");
}

// Called by SQLite while another connection holds a lock this one needs; returns 0 to give
// up (SQLITE_BUSY) once the busy timeout has passed. SQLite's own handler sleeps in steps
// that grow to 100 ms, so a waiter mostly sleeps through the short gaps between another
// process's transactions and a process writing hard can starve it past the timeout. This
// one tries again after 50 us, doubling the pause up to 1 ms: a waiter gets in within a
// transaction or two of the other process's, and each try is one failed lock call.
int Connection::on_busy(void* self, int count) noexcept {
  constexpr auto kFirstPause = std::chrono::microseconds(50);
  constexpr auto kMaxPause = std::chrono::microseconds(1000);
  auto* c = static_cast<Connection*>(self);
  const auto now = std::chrono::steady_clock::now();
  if (count == 0) c->busy_since_ = now;
  const auto waited = now - c->busy_since_;
  if (waited >= c->busy_timeout_) return 0;
  const auto pause = count >= 5 ? kMaxPause : std::min(kFirstPause * (1 << count), kMaxPause);
  std::this_thread::sleep_for(
      std::min<std::chrono::steady_clock::duration>(pause, c->busy_timeout_ - waited));
  return 1;
}

int Connection::check(int rc, std::string_view what) const {
  if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE) return rc;
  fail(rc, what);
}

void Connection::fail(int rc, std::string_view what) const {
  std::string reason(what);
  reason += ": ";
  const char* msg = db_ ? sqlite3_errmsg(db_.get()) : nullptr;
  reason += msg != nullptr ? msg : sqlite3_errstr(rc);
  const int primary = rc & 0xff;
  if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED) {
    reason += " (another connection held the lock for longer than the busy timeout of " +
              std::to_string(busy_timeout_.count()) + " ms)";
  }
  // The operating system's reason is what tells "not a directory" from "permission denied".
  const int sys = db_ ? sqlite3_system_errno(db_.get()) : 0;
  if (sys != 0 && (primary == SQLITE_CANTOPEN || primary == SQLITE_IOERR ||
                   primary == SQLITE_READONLY || primary == SQLITE_FULL)) {
    reason += " (";
    reason += std::strerror(sys);
    reason += ")";
  }
  throw StoreUnavailable(store_, std::move(reason));
}

Statement Connection::prepare(const char* sql, const char* name) const {
  sqlite3_stmt* raw = nullptr;
  const int rc = sqlite3_prepare_v3(db_.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
  Statement stmt{StmtHandle(raw), name};
  check(rc, std::string("cannot prepare ") + name);
  return stmt;
}

void Connection::exec(const char* sql, std::string_view what) const {
  check(sqlite3_exec(db_.get(), sql, nullptr, nullptr, nullptr), what);
}

std::int64_t Connection::query_int(const char* sql, std::string_view what) const {
  Statement stmt = prepare(sql, "query");
  const int rc = check(sqlite3_step(stmt.handle.get()), what);
  return rc == SQLITE_ROW ? sqlite3_column_int64(stmt.handle.get(), 0) : 0;
}

std::string Connection::query_text(const char* sql, std::string_view what) const {
  std::string out;
  check(try_query_text(sql, out), what);
  return out;
}

int Connection::try_query_text(const char* sql, std::string& out) const {
  sqlite3_stmt* raw = nullptr;
  const int prepared = sqlite3_prepare_v2(db_.get(), sql, -1, &raw, nullptr);
  const StmtHandle stmt(raw);
  if (prepared != SQLITE_OK) return prepared;
  const int rc = sqlite3_step(raw);
  if (rc == SQLITE_ROW) {
    const auto* text = sqlite3_column_text(raw, 0);
    out = text == nullptr ? std::string{} : std::string(reinterpret_cast<const char*>(text));
  }
  return rc == SQLITE_ROW ? SQLITE_DONE : rc;
}

Query::~Query() {
  // Errors of the last step were already reported by step(); reset only repeats them.
  sqlite3_reset(raw());
  sqlite3_clear_bindings(raw());
}

void Query::check_bind(int rc) {
  if (rc != SQLITE_OK) conn_.fail(rc, std::string(stmt_.name) + ": cannot bind a parameter");
}

Query& Query::bind(int index, std::string_view bytes) {
  // A null data pointer would bind NULL, so an empty value is a zero-length BLOB instead.
  // SQLITE_STATIC is safe: the Query clears its bindings before the caller's bytes go away.
  check_bind(bytes.empty()
                 ? sqlite3_bind_zeroblob(raw(), index, 0)
                 : sqlite3_bind_blob64(raw(), index, bytes.data(), bytes.size(), SQLITE_STATIC));
  return *this;
}

Query& Query::bind(int index, std::int64_t value) {
  check_bind(sqlite3_bind_int64(raw(), index, value));
  return *this;
}

Query& Query::bind_null(int index) {
  check_bind(sqlite3_bind_null(raw(), index));
  return *this;
}

bool Query::step() { return conn_.check(sqlite3_step(raw()), stmt_.name) == SQLITE_ROW; }

int Query::run() {
  while (step()) {
  }
  return sqlite3_changes(conn_.db());
}

std::string_view Query::column_bytes(int col) const {
  const void* data = sqlite3_column_blob(raw(), col);
  const int size = sqlite3_column_bytes(raw(), col);
  if (data == nullptr || size <= 0) return {};
  return std::string_view(static_cast<const char*>(data), static_cast<std::size_t>(size));
}

Transaction::Transaction(const Connection& conn, Statement& begin, Statement& commit,
                         Statement& rollback)
    : conn_(conn), commit_(commit), rollback_(rollback) {
  Query(conn_, begin).run();
}

Transaction::~Transaction() {
  if (!open_) return;
  // Best effort: if ROLLBACK itself fails the pool sees the connection still inside a
  // transaction and discards it.
  sqlite3_step(rollback_.handle.get());
  sqlite3_reset(rollback_.handle.get());
}

void Transaction::commit() {
  Query(conn_, commit_).run();
  open_ = false;
}

}  // namespace idem::sqlite
