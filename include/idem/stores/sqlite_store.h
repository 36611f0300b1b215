#pragma once

// The SQLite store: embedded and durable; several processes on one machine share the file.
// Opened by sqlite:///absolute/path.db or sqlite:relative/path.db (see open_store.h).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "idem/clock.h"
#include "idem/store.h"
#include "idem/transaction.h"

namespace idem {

struct SqliteStoreOptions {
  // The database file; created with its schema when missing (unless create_if_missing is
  // false or read_only is true). A relative path is resolved against the working directory
  // when the store is opened.
  std::string path;
  // PRAGMA synchronous: "normal" (default; durable across process crashes, may lose the
  // last transactions on power loss) or "full" (also durable across power loss; each write
  // transaction waits for an fsync, and concurrent writes share one).
  std::string synchronous = "normal";
  // How long a transaction waits for another process's (or store object's) lock before
  // failing with StoreUnavailable; this store's own writes queue in memory instead. A write
  // queued behind batches that are waiting too waits for them first, so it may take longer
  // (about twice this with one batch ahead). 0: fail at once.
  Duration busy_timeout{5000};
  // The clock expiry is judged by. Null: the system clock (wall milliseconds), which every
  // process on the machine shares.
  std::shared_ptr<const Clock> clock{};
  // Open the file read-only (OpenOptions::read_only): nothing is created or written, and
  // every writing operation fails with StoreUnavailable. When the WAL index beside the file
  // cannot be created (a read-only directory, no other connection open), the file is read
  // as it is on disk (SQLite's immutable mode).
  bool read_only = false;
  // Create the file and its schema when missing (OpenOptions::create_if_missing). false: a
  // missing file, or one without idem's schema, is refused with StoreUnavailable.
  bool create_if_missing = true;
  // The file is the application's own database too (URL: shared=1), so that a caller's
  // transaction can hold idem's records with its own writes (SPEC §14): idem's tables
  // (idem_records, idem_meta) are created beside the application's, the file's header
  // (PRAGMA application_id, user_version) stays the application's, and the file is switched
  // to the WAL journal, which idem needs. false: the file must be idem's alone (or new).
  bool shared = false;
  // SPEC §7: wake waiters on this machine when a record completes or is released, through
  // a page of counters in a file beside the database (`<path>-wake`, created on open with
  // the database's permission bits; a read-only store neither creates nor uses it).
  // false: this store object neither signals nor listens, and waiters poll.
  bool notify = true;
};

// What the group commit did so far (SqliteStore::write_stats): every write of a store
// object queues in memory and runs in a batch, one write transaction per batch.
struct SqliteWriteStats {
  std::uint64_t transactions = 0;  // batches applied (one write transaction each)
  std::uint64_t operations = 0;    // operations in them; an extend_many counts each lease
  std::size_t in_flight = 0;       // writes in the transaction running now
  std::size_t queued = 0;          // writes waiting for the next one
};

// Also a TransactionalStore (SPEC §14): a caller's sqlite3* on the same file can hold the
// records' writes in its own transaction (not for a read-only store).
class SqliteStore final : public Store, public TransactionalStore {
 public:
  // Opens (creating if needed and allowed) the database. Throws StoreUnavailable naming the
  // file and the cause when it cannot be opened, does not exist and may not be created, is
  // not an idem database, or was written by a newer version of idem.
  explicit SqliteStore(SqliteStoreOptions options);
  ~SqliteStore() override;

  std::string describe() const override;
  TransactionalStore* transactions() noexcept override;

  // A snapshot of the group commit's counters, for metrics: operations / transactions is
  // the mean batch size.
  SqliteWriteStats write_stats() const;

 protected:
  AcquireResult do_acquire(std::string_view scope, std::string_view key, Duration lease,
                           Duration ttl, std::optional<std::string_view> fingerprint) override;
  WriteResult do_complete(std::string_view scope, std::string_view key, Token token,
                          std::string_view payload, Duration ttl) override;
  WriteResult do_release(std::string_view scope, std::string_view key, Token token) override;
  ExtendResult do_extend(std::string_view scope, std::string_view key, Token token,
                         Duration lease) override;
  // All the extends in one write transaction (through the group commit, like every write).
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
  bool do_outside_transaction(const SqlConnection& conn) const noexcept override;
  SqlConnection::Kind connection_kind() const noexcept override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
