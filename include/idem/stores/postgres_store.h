#pragma once

// The PostgreSQL store: one record table shared by many processes and machines, every
// expiry judged by the server's clock (SPEC §6). Opened by a libpq URI (see open_store.h and
// docs/stores/postgres.md):
//
//   postgresql://user:password@host:5432/db?sslmode=require&table=idem_records&pool_size=16
//   postgresql:///db?host=/var/run/postgresql
//
// Does not include libpq-fe.h: libpq is a private dependency of the idem::postgres target.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "idem/store.h"
#include "idem/transaction.h"

namespace idem {

// How acquire reaches the record (docs/stores/postgres.md, "Round trips").
enum class PostgresAcquire {
  // Reads first while recent acquires mostly found a live record (replays, busy keys), and
  // sends the conditional upsert directly while they mostly found none (fresh keys).
  kAdaptive,
  // Always one read-only SELECT first; the upsert only for an absent, expired or
  // stealable record. A replay is then always a plain SELECT.
  kReadFirst,
  // Always the conditional upsert; it writes nothing (no row lock, no WAL) when it finds a
  // live record, and reports it instead.
  kWriteFirst,
};

// What answers the store's connections (docs/stores/postgres.md, "Deploying").
enum class PostgresPooler {
  // The server itself when the backend pid libpq was given at startup is the server's
  // pg_backend_pid() (kNone); otherwise a pooler answered in its place (kTransaction).
  kAuto,
  // A direct connection: each connection keeps its server session for its life, so the
  // store sets its settings once per connection and prepares each statement once.
  kNone,
  // A pooler in session pooling mode (PgBouncer pool_mode=session): as kNone.
  kSession,
  // A pooler in transaction pooling mode (PgBouncer pool_mode=transaction): consecutive
  // transactions may run on different server sessions, so nothing the store needs is kept
  // in a session: settings go with every call, writes run in BEGIN ISOLATION LEVEL READ
  // COMMITTED ... COMMIT (one round trip), and no prepared statement is taken for granted.
  kTransaction,
};

// How statements reach the server.
enum class PostgresStatements {
  // Named prepared statements, named by a hash of their text: parsed and planned once per
  // server session, then only bound and run. Safe behind PgBouncer's transaction pooling
  // (a missing one is prepared again; one name is one text everywhere).
  kPrepared,
  // Every statement sent with its text and parsed and planned on every call: for poolers
  // that refuse named statements or pin a session for them. Slower (see the docs).
  kUnnamed,
};

struct PostgresStoreOptions {
  // A libpq connection string: a URI ("postgresql://...") or "host=... dbname=..." pairs.
  // Every libpq parameter is honoured (sslmode, connect_timeout, application_name, ...).
  std::string conninfo;
  // The record table, "name" or "schema.name": lowercase letters, digits and '_', at most
  // 48 characters each. An unqualified name lives in the connection's current schema.
  // Created with its token sequence (<name>_token_seq) and purge index when missing.
  std::string table = "idem_records";
  // Connections opened at most; calls beyond that wait for a free one (within `timeout`).
  std::size_t pool_size = 16;
  // The bound on every call: waiting for a free connection, connecting, and each
  // statement (also sent to the server as statement_timeout). Must be positive.
  Duration timeout{10'000};
  // false: acquire, complete and forget commit with the server's synchronous_commit
  // (durable), while extend, release and purge commit with synchronous_commit = off.
  // true: every statement commits with synchronous_commit = off; a server crash can then
  // lose the last acquisitions and completions (see docs/stores/postgres.md).
  bool asynchronous_commit = false;
  PostgresAcquire acquire = PostgresAcquire::kAdaptive;
  // Opens read-only: never creates or migrates the table (a missing one is an error), and
  // every statement runs in a read-only transaction, so acquire, complete, release,
  // extend, purge and forget fail with StoreUnavailable while get works. The only way to
  // open a hot standby (which a writable store refuses); describe() then says so.
  bool read_only = false;
  // Whether a missing table is created. false: a missing table is an error.
  bool create_if_missing = true;
  PostgresPooler pooler = PostgresPooler::kAuto;
  PostgresStatements statements = PostgresStatements::kPrepared;
  // Refuses, when the store opens, a server that is not PostgreSQL 12 or later: one whose
  // version() names another product (CockroachDB, YugabyteDB, Redshift, ...), or whose
  // advisory locks do not show in pg_locks (the store's per-key order rests on them).
  // false: the caller vouches for the server.
  bool check_server = true;
  // SPEC §7: complete, release and forget also send a notification on the table's channel
  // (pg_notify in the same statement, so it is delivered only if the write commits), and
  // watch() wakes waiters through one LISTEN connection per store object, made by the first
  // watch. false: nothing is sent and watch() returns null (waiters poll). See
  // docs/stores/postgres.md, "Waiting without polling".
  bool notify = true;
  // A libpq connection string (a URI or key=value pairs) for the listening connection alone:
  // a direct connection to the same database when `conninfo` goes through a transaction
  // pooler, through which LISTEN does not work. Empty: the listener uses `conninfo`, except
  // behind a transaction pooler, where the store then does not listen (watch() returns null,
  // the notifications are still sent). Refused with `notify` off.
  std::string listen{};
};

// What the store's listener (PostgresStoreOptions::notify) did, for tests and monitoring.
struct PostgresListenerStats {
  std::uint64_t connects = 0;       // connections that were made and listened
  std::uint64_t reconnects = 0;     // of those, the ones made after a connection was lost
  std::uint64_t notifications = 0;  // notifications received on the table's channel
  std::size_t watches = 0;          // watches registered now
  bool listening = false;           // a connection listens now
  int backend_pid = 0;              // its server process (pg_backend_pid()), 0 when none
};

// Also a TransactionalStore (SPEC §14): a caller's PGconn* on the same database can hold the
// records' writes in its own transaction (not for a read-only store).
class PostgresStore final : public Store, public TransactionalStore {
 public:
  // Connects once, checks the server (PostgreSQL, not a hot standby unless read_only) and
  // the table (creating it when missing, under an advisory lock, so processes starting
  // together create it once). Throws InvalidArgument for bad options, StoreUnavailable
  // naming the server and the cause when it cannot connect, when the server is refused, or
  // when the table belongs to something else or to a newer version of idem (left untouched).
  explicit PostgresStore(PostgresStoreOptions options);
  ~PostgresStore() override;

  // "postgresql://user@host:port/db", never with a password; "?table=..." when not the
  // default table; " (read-only hot standby: ...)" when opened on a standby.
  std::string describe() const override;
  TransactionalStore* transactions() noexcept override;

  // The listener's counters; all zero while no watch has started it.
  PostgresListenerStats listener_stats() const;

 protected:
  AcquireResult do_acquire(std::string_view scope, std::string_view key, Duration lease,
                           Duration ttl, std::optional<std::string_view> fingerprint) override;
  WriteResult do_complete(std::string_view scope, std::string_view key, Token token,
                          std::string_view payload, Duration ttl) override;
  WriteResult do_release(std::string_view scope, std::string_view key, Token token) override;
  ExtendResult do_extend(std::string_view scope, std::string_view key, Token token,
                         Duration lease) override;
  std::vector<ExtendResult> do_extend_many(std::span<const ExtendRequest> requests) override;
  std::size_t do_purge(std::size_t limit) override;
  std::optional<Record> do_get(std::string_view scope, std::string_view key) override;
  bool do_forget(std::string_view scope, std::string_view key) override;
  std::unique_ptr<RecordWatch> do_watch(std::string_view scope, std::string_view key,
                                        std::function<void()> changed) override;

  WriteResult do_complete_in(const SqlConnection& conn, std::string_view scope,
                             std::string_view key, Token token, std::string_view payload,
                             Duration ttl) override;
  AcquireResult do_acquire_in(const SqlConnection& conn, std::string_view scope,
                              std::string_view key, Duration lease, Duration ttl,
                              std::optional<std::string_view> fingerprint, bool nowait) override;
  void do_begin(const SqlConnection& conn) override;
  void do_commit(const SqlConnection& conn) override;
  void do_rollback(const SqlConnection& conn) noexcept override;
  void do_check_connection(const SqlConnection& conn, ConnectionUse use) override;
  bool can_wait_in_transaction() const noexcept override { return true; }
  void do_notify_committed(std::string_view scope, std::string_view key) noexcept override;
  bool do_outside_transaction(const SqlConnection& conn) const noexcept override;
  SqlConnection::Kind connection_kind() const noexcept override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
