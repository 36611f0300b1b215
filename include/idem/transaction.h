#pragma once

// Completion inside the caller's own database transaction (SPEC §14).
//
// When the caller's data lives in the same PostgreSQL database or SQLite file as the store's
// records, the COMPLETE record can be written on the caller's connection, inside the
// caller's open transaction, so that the caller's effects and the record commit together or
// not at all: a crash between the two commits of the usual flow can no longer leave the
// effects committed and the key IN_PROGRESS, to be run again by the next caller.
//
// The executor offers three forms on top of the store's steps below (docs/api.md,
// "Completion in your transaction"):
//  - AttemptHandle::complete_in(tx, value), then committed() / rolled_back() / resolve():
//    the lease is taken as usual; only the COMPLETE write joins the caller's transaction.
//  - Executor::run_in_transaction: the same, with BEGIN, the action and COMMIT run for the
//    caller on its connection.
//  - Executor::run_in_open_transaction: the acquire, the action and the complete all in the
//    caller's open transaction, with no lease (a duplicate waits on the record's row lock).
//
// This header declares libpq's and SQLite's connection types without including their
// headers, exactly as they declare them.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "idem/types.h"

typedef struct pg_conn PGconn;   // libpq-fe.h
typedef struct sqlite3 sqlite3;  // sqlite3.h

namespace idem {

// A caller's database connection. The caller owns it (idem never closes it), and uses it
// from one thread at a time: every step below runs on the calling thread.
class SqlConnection {
 public:
  enum class Kind { kPostgres, kSqlite };

  // Throws InvalidArgument for a null connection.
  static SqlConnection postgres(PGconn* conn);
  static SqlConnection sqlite(sqlite3* db);

  Kind kind() const noexcept { return kind_; }
  // The connection, or null when it is of the other kind.
  PGconn* pg() const noexcept { return kind_ == Kind::kPostgres ? pg_ : nullptr; }
  sqlite3* sqlite() const noexcept { return kind_ == Kind::kSqlite ? sqlite_ : nullptr; }
  const char* kind_name() const noexcept {
    return kind_ == Kind::kPostgres ? "PostgreSQL" : "SQLite";
  }

 private:
  SqlConnection(Kind kind, PGconn* pg, sqlite3* db) noexcept : kind_(kind), pg_(pg), sqlite_(db) {}
  Kind kind_;
  PGconn* pg_;
  sqlite3* sqlite_;
};

// The steps a store whose records live in a SQL database can take on a caller's connection
// (Store::transactions()). PostgreSQL and SQLite have them; Redis and the in-memory store do
// not (Store::transactions() is null), and the executor's forms refuse them with
// InvalidArgument before anything is written.
//
// Every step runs on the caller's connection and thread, under the caller's own timeouts
// (PostgreSQL's statement_timeout and lock_timeout, SQLite's busy timeout). A step that
// fails throws StoreUnavailable naming the store and the cause; the caller's transaction
// must then be rolled back. A PostgreSQL transaction at REPEATABLE READ or SERIALIZABLE may
// fail with a serialization failure (the heartbeat updates the record while the caller's
// snapshot is open): StoreUnavailable, retryable; roll back and run the transaction again.
class TransactionalStore {
 public:
  virtual ~TransactionalStore() = default;

  // What idem is about to do with a caller's connection (check_connection).
  enum class ConnectionUse {
    kJoin,   // write in the caller's open transaction (complete_in, acquire_in)
    kBegin,  // begin, and later commit, a transaction on it (run_in_transaction)
  };

  // Checks, before anything is acquired or written, that `conn` can carry this store's
  // records for `use`: a connection of this store's kind, writable, on the store's own
  // database and table (by the identity the store recorded when it opened: PostgreSQL's
  // cluster system identifier and the database's and table's OIDs, SQLite's file device and
  // inode; never by name alone, so a connection on another database that has an idem table
  // of its own is refused), and inside an open transaction (kJoin) or outside any (kBegin).
  // complete_in, acquire_in and begin run it themselves; the executor runs it before it
  // acquires anything for a call on `conn`. PostgreSQL asks the server once per connection
  // session (a query on `conn`, harmless inside the caller's transaction) and remembers the
  // answer for that session. Throws InvalidArgument naming what is wrong (a read-only store
  // included), StoreUnavailable when the connection is broken or cannot be asked.
  void check_connection(const SqlConnection& conn, ConnectionUse use);

  // Whether `conn` is healthy and outside any transaction: after an action that was to run
  // inside a transaction idem began, it means the action ended that transaction itself (a
  // COMMIT or ROLLBACK of its own). False for a connection of another kind.
  bool outside_transaction(const SqlConnection& conn) const noexcept;

  // Store::complete on the caller's open transaction: the record goes from IN_PROGRESS with
  // `token` to COMPLETE, visible to others when the caller commits. kFenced: the token no
  // longer owns the record (nothing was written); the caller must roll back.
  // Throws InvalidArgument when check_connection(conn, kJoin) refuses `conn`.
  [[nodiscard]] WriteResult complete_in(const SqlConnection& conn, std::string_view scope,
                                        std::string_view key, Token token, std::string_view payload,
                                        Duration ttl);

  // Store::acquire on the caller's open transaction (SPEC §14's one-transaction form). A
  // record another open transaction is writing is waited for (its row lock, or SQLite's
  // write lock) and judged as that transaction leaves it; with `nowait`, a record another
  // PostgreSQL transaction holds answers Busy instead (SQLite has no row locks: the
  // caller's BEGIN IMMEDIATE is where a duplicate waits). The executor asks with `nowait`
  // and waits under its own policy.
  AcquireResult acquire_in(const SqlConnection& conn, std::string_view scope, std::string_view key,
                           Duration lease, Duration ttl,
                           std::optional<std::string_view> fingerprint, bool nowait);

  // BEGIN (SQLite: BEGIN IMMEDIATE, so the write lock is taken at once and never upgraded),
  // COMMIT and ROLLBACK on the caller's connection, for the executor's run_in_transaction.
  // Every begin() that returned is ended by commit() or rollback() on the same thread
  // (rollback() also when the transaction ended some other way): SQLite's begin() takes
  // this process's turn to write the file and prepares the complete's statement, which they
  // give back.
  void begin(const SqlConnection& conn);
  // Throws StoreUnavailable when the COMMIT failed (a transaction the failure left open is
  // rolled back first) or its answer was lost: whether it committed is then known only
  // from the record (AttemptHandle::resolve).
  void commit(const SqlConnection& conn);
  // Best effort: a failure is ignored (a lost connection rolls back on its own).
  void rollback(const SqlConnection& conn) noexcept;

  // The caller's transaction that holds a complete_in() write committed: tells the store's
  // waiters in other processes (SPEC §7) on the store's own connection. The write itself
  // does not notify (PostgreSQL: a notifying transaction holds the server's one lock on the
  // notification queue through its commit's flush, so concurrent callers' commits would
  // queue one behind another), so waiters of a run_in_open_transaction key, whose commit
  // idem does not see, poll instead. Best effort: a failure is ignored (polling is the
  // fallback). Called by the executor.
  void notify_committed(std::string_view scope, std::string_view key) noexcept {
    do_notify_committed(scope, key);
  }

  // Whether a duplicate may wait for a busy key inside the caller's open transaction
  // (Executor::run_in_open_transaction's waiting policy): PostgreSQL's row locks let it;
  // SQLite's caller holds the file's one write lock, which the key's owner needs to finish.
  virtual bool can_wait_in_transaction() const noexcept { return false; }

  // Names the store for messages (Store::describe overrides it in a store with both).
  virtual std::string describe() const = 0;

 protected:
  virtual WriteResult do_complete_in(const SqlConnection& conn, std::string_view scope,
                                     std::string_view key, Token token, std::string_view payload,
                                     Duration ttl) = 0;
  virtual AcquireResult do_acquire_in(const SqlConnection& conn, std::string_view scope,
                                      std::string_view key, Duration lease, Duration ttl,
                                      std::optional<std::string_view> fingerprint, bool nowait) = 0;
  virtual void do_begin(const SqlConnection& conn) = 0;
  virtual void do_commit(const SqlConnection& conn) = 0;
  virtual void do_rollback(const SqlConnection& conn) noexcept = 0;
  virtual void do_notify_committed(std::string_view /*scope*/, std::string_view /*key*/) noexcept {}
  // The store's part of check_connection (the kind is checked already).
  virtual void do_check_connection(const SqlConnection& conn, ConnectionUse use) = 0;
  virtual bool do_outside_transaction(const SqlConnection& conn) const noexcept = 0;
  // The kind of connection this store joins.
  virtual SqlConnection::Kind connection_kind() const noexcept = 0;

 private:
  void check_kind(const SqlConnection& conn) const;
};

}  // namespace idem
