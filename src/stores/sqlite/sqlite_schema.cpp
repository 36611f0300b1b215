#include "stores/sqlite/sqlite_schema.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "idem/error.h"
#include "stores/sqlite/sqlite_connection.h"

namespace idem::sqlite {
namespace {

struct Header {
  std::int64_t application_id = 0;
  std::int64_t version = 0;
  std::int64_t objects = 0;
  std::int64_t idem_tables = 0;  // idem_records and idem_meta
};

Header read_header(Connection& conn) {
  return Header{
      conn.query_int("PRAGMA application_id", "cannot read the database header"),
      conn.query_int("PRAGMA user_version", "cannot read the database header"),
      conn.query_int("SELECT count(*) FROM sqlite_schema", "cannot read the database schema"),
      conn.query_int("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name IN "
                     "('idem_records', 'idem_meta')",
                     "cannot read the database schema")};
}

// Throws unless `h` is our schema at a version this build reads; returns false when the
// file is empty (or, shared, holds no idem tables yet) and the schema must be created.
bool accept(Connection& conn, const Header& h, bool shared) {
  if (shared && h.application_id != kApplicationId) {
    // The application's file: its header is its own; idem's schema is its two tables.
    if (h.idem_tables == 2) return true;
    if (h.idem_tables == 0) return false;
    throw StoreUnavailable(conn.store(),
                           "the file holds one of idem's tables (idem_records, idem_meta) but "
                           "not the other; refusing to use it");
  }
  if (h.application_id == kApplicationId) {
    if (h.version > kSchemaVersion) {
      throw StoreUnavailable(conn.store(),
                             "the file was written by a newer version of idem (schema version " +
                                 std::to_string(h.version) + "; this build reads version " +
                                 std::to_string(kSchemaVersion) + ")");
    }
    if (h.version != kSchemaVersion) {
      throw StoreUnavailable(conn.store(), "unknown idem schema version " +
                                               std::to_string(h.version) + " in the file");
    }
    return true;
  }
  if (h.application_id != 0 || h.version != 0 || h.objects != 0) {
    throw StoreUnavailable(conn.store(),
                           "not an idem database (it holds " + std::to_string(h.objects) +
                               " other schema objects, application_id " +
                               std::to_string(h.application_id) + ", user_version " +
                               std::to_string(h.version) +
                               "); refusing to use it. To keep idem's records in your "
                               "application's own database, open it with shared=1");
  }
  return false;
}

// Switching a file to WAL needs it to itself for a moment, and SQLite answers SQLITE_BUSY
// at once rather than calling the busy handler when another process is reading it (as
// processes opening a new file together do). So wait here, up to the busy timeout.
std::string switch_to_wal(Connection& conn) {
  const auto give_up = std::chrono::steady_clock::now() + conn.busy_timeout();
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    std::string mode;
    const int rc = conn.try_query_text("PRAGMA journal_mode = WAL", mode);
    if ((rc & 0xff) != SQLITE_BUSY || std::chrono::steady_clock::now() >= give_up) {
      conn.check(rc, "cannot switch to the WAL journal");
      return mode;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

}  // namespace

void prepare_file(Connection& conn, OpenMode open_mode, bool shared) {
  // One read transaction, so the header values are one consistent snapshot.
  conn.exec("BEGIN", "cannot read the database header");
  Header h = read_header(conn);
  conn.exec("COMMIT", "cannot read the database header");
  const bool ready = accept(conn, h, shared);
  if (!ready && open_mode != OpenMode::kCreate) {
    throw StoreUnavailable(
        conn.store(),
        "the file holds no idem schema yet, and the store was opened " +
            std::string(open_mode == OpenMode::kReadOnly ? "read-only" : "without creating it"));
  }
  if (open_mode == OpenMode::kReadOnly) return;
  // Creating the schema needs no fsync per step; the connection's own setting follows.
  conn.exec("PRAGMA synchronous = NORMAL", "cannot set PRAGMA synchronous");

  const std::string mode = switch_to_wal(conn);
  if (mode != "wal") {
    throw StoreUnavailable(
        conn.store(), "cannot switch to the WAL journal (the journal mode stayed '" + mode + "')");
  }
  if (ready) return;

  // Another process may be creating the schema right now: decide again under the write
  // lock.
  Statement b = conn.prepare("BEGIN IMMEDIATE", "begin write transaction");
  Statement c = conn.prepare("COMMIT", "commit");
  Statement r = conn.prepare("ROLLBACK", "rollback");
  Transaction tx(conn, b, c, r);
  if (!accept(conn, read_header(conn), shared)) {
    conn.exec(kSqlSchema, "cannot create the schema");
    if (!shared) conn.exec(kSqlMarkFile, "cannot create the schema");
  }
  tx.commit();
}

}  // namespace idem::sqlite
