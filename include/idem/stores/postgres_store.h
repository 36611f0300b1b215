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
#include <memory>
#include <string>

#include "idem/store.h"

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
  // extend, purge and forget fail with StoreUnavailable while get works.
  bool read_only = false;
  // Whether a missing table is created. false: a missing table is an error.
  bool create_if_missing = true;
};

class PostgresStore final : public Store {
 public:
  // Connects once, checks the table (creating it when missing, under an advisory lock, so
  // processes starting together create it once). Throws InvalidArgument for bad options,
  // StoreUnavailable naming the server and the cause when it cannot connect, or when the
  // table belongs to something else or to a newer version of idem (left untouched).
  explicit PostgresStore(PostgresStoreOptions options);
  ~PostgresStore() override;

  // "postgresql://user@host:port/db", never with a password; "?table=..." when not the
  // default table.
  std::string describe() const override;

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

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
