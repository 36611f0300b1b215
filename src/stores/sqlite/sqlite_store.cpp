#include "idem/stores/sqlite_store.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <climits>
#include <filesystem>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"
#include "stores/sqlite/sqlite_db.h"
#include "stores/sqlite/sqlite_sql.h"
#include "stores/sqlite/sqlite_write_queue.h"

namespace idem {
namespace {

using sqlite::Connection;
using sqlite::OpenMode;
using sqlite::kSqlSelectRecord;
using sqlite::kSqlNextToken;
using sqlite::kSqlWriteLease;
using sqlite::kSqlComplete;
using sqlite::kSqlCompletedBy;
using sqlite::kSqlRelease;
using sqlite::kSqlExtend;
using sqlite::kSqlPurge;
using sqlite::kSqlForget;
using sqlite::Query;
using sqlite::QueuedWrite;
using sqlite::Statement;
using sqlite::Transaction;
using sqlite::WriteQueue;

// PRAGMA application_id marks the file as ours ("idem" in ASCII); PRAGMA user_version is the
// schema version. A file with another application id, or with tables but no id, is not an
// idem database and is never touched.
constexpr std::int64_t kApplicationId = 0x6964656d;
constexpr std::int64_t kSchemaVersion = 1;

// Times are milliseconds since the epoch by the store's clock. purge_after is the moment
// the record becomes purgeable (SPEC §4): expires_at for a COMPLETE record and
// max(expires_at, lease_expires_at) for an IN_PROGRESS one; every write keeps it so, and
// the purge index makes a bounded purge batch cheap.
constexpr const char* kSqlSchema = R"sql(
CREATE TABLE idem_records (
  scope            BLOB    NOT NULL,
  key              BLOB    NOT NULL,
  state            INTEGER NOT NULL,  -- 0: IN_PROGRESS, 1: COMPLETE
  token            INTEGER NOT NULL,
  attempt          INTEGER NOT NULL,
  acquired_at      INTEGER NOT NULL,
  lease_expires_at INTEGER NOT NULL,
  completed_at     INTEGER NOT NULL,
  expires_at       INTEGER NOT NULL,
  purge_after      INTEGER NOT NULL,
  fingerprint      BLOB,
  payload          BLOB,
  PRIMARY KEY (scope, key)
);
CREATE INDEX idem_records_purge ON idem_records (purge_after);
CREATE TABLE idem_meta (
  id         INTEGER PRIMARY KEY CHECK (id = 1),
  last_token INTEGER NOT NULL
);
INSERT INTO idem_meta (id, last_token) VALUES (1, 0);
)sql";
// The marks of a file that is idem's alone. A shared file (SqliteStoreOptions::shared) is
// the application's: its header stays the application's, and idem's schema is known by
// its two tables.
constexpr const char* kSqlMarkFile = R"sql(
PRAGMA application_id = 1768187245;
PRAGMA user_version = 1;
)sql";

constexpr int kComplete = 1;

// Records deleted per purge transaction, so a purge never holds the write lock for long.
constexpr std::size_t kPurgeBatch = 256;
// Idle connections kept open for reads; more are opened under load and closed when
// returned. Writes all go through the one writer connection.
constexpr std::size_t kMaxIdleConnections = 16;
// The group commit's bounds: operations and payload bytes in one write transaction. A
// transaction of 64 small operations holds the write lock for well under a millisecond.
constexpr WriteQueue::Limits kBatchLimits{.max_operations = 64,
                                          .max_bytes = std::size_t{1} << 20};
// A checkpoint copies the WAL back into the database file once the WAL holds this many
// frames (SQLite's own default for PRAGMA wal_autocheckpoint).
constexpr int kCheckpointFrames = 1000;

// Columns of kSqlSelectRecord, in order.
enum Col {
  kColState,
  kColToken,
  kColAttempt,
  kColAcquiredAt,
  kColLeaseExpiresAt,
  kColCompletedAt,
  kColExpiresAt,
  kColFingerprint,
  kColPayload
};


// One pooled connection with its prepared statements.
struct PooledConnection {
  Connection conn;
  Statement select_record;
  Statement next_token;
  Statement write_lease;
  Statement complete;
  Statement completed_by;
  Statement release;
  Statement extend;
  Statement purge;
  Statement forget;
  Statement begin;
  Statement commit;
  Statement rollback;
  Statement savepoint;
  Statement release_savepoint;
  Statement rollback_to_savepoint;

  PooledConnection(const std::string& path, const std::string& store, Duration busy_timeout,
                   const std::string& synchronous, OpenMode mode, bool first, bool shared)
      : conn(path, store, busy_timeout, mode) {
    // The first connection checks the file before anything else touches it.
    if (first) prepare_file(mode, shared);
    conn.exec(synchronous == "full" ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL",
              "cannot set PRAGMA synchronous");
    select_record = conn.prepare(kSqlSelectRecord, "read record");
    next_token = conn.prepare(kSqlNextToken, "next token");
    write_lease = conn.prepare(kSqlWriteLease, "write lease");
    complete = conn.prepare(kSqlComplete, "complete");
    completed_by = conn.prepare(kSqlCompletedBy, "complete: check");
    release = conn.prepare(kSqlRelease, "release");
    extend = conn.prepare(kSqlExtend, "extend");
    purge = conn.prepare(kSqlPurge, "purge");
    forget = conn.prepare(kSqlForget, "forget");
    begin = conn.prepare("BEGIN IMMEDIATE", "begin write transaction");
    commit = conn.prepare("COMMIT", "commit");
    rollback = conn.prepare("ROLLBACK", "rollback");
    savepoint = conn.prepare("SAVEPOINT op", "savepoint");
    release_savepoint = conn.prepare("RELEASE op", "release savepoint");
    rollback_to_savepoint = conn.prepare("ROLLBACK TO op", "rollback to savepoint");
  }

  Transaction write_transaction() { return Transaction(conn, begin, commit, rollback); }

 private:
  struct Header {
    std::int64_t application_id = 0;
    std::int64_t version = 0;
    std::int64_t objects = 0;
    std::int64_t idem_tables = 0;  // idem_records and idem_meta
  };

  Header read_header() {
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
  bool accept(const Header& h, bool shared) {
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
  std::string switch_to_wal() {
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

  // Checks the file is ours (or empty), switches it to WAL and creates the schema when
  // missing. A foreign or newer file is refused before anything is written to it; so is an
  // empty one when the store may not create its schema, and a read-only store writes
  // nothing at all.
  void prepare_file(OpenMode open_mode, bool shared) {
    // One read transaction, so the header values are one consistent snapshot.
    conn.exec("BEGIN", "cannot read the database header");
    Header h = read_header();
    conn.exec("COMMIT", "cannot read the database header");
    const bool ready = accept(h, shared);
    if (!ready && open_mode != OpenMode::kCreate) {
      throw StoreUnavailable(conn.store(),
                             "the file holds no idem schema yet, and the store was opened " +
                                 std::string(open_mode == OpenMode::kReadOnly
                                                 ? "read-only"
                                                 : "without creating it"));
    }
    if (open_mode == OpenMode::kReadOnly) return;
    // Creating the schema needs no fsync per step; the connection's own setting follows.
    conn.exec("PRAGMA synchronous = NORMAL", "cannot set PRAGMA synchronous");

    const std::string mode = switch_to_wal();
    if (mode != "wal") {
      throw StoreUnavailable(
          conn.store(),
          "cannot switch to the WAL journal (the journal mode stayed '" + mode + "')");
    }
    if (ready) return;

    // Another process may be creating the schema right now: decide again under the write
    // lock.
    Statement b = conn.prepare("BEGIN IMMEDIATE", "begin write transaction");
    Statement c = conn.prepare("COMMIT", "commit");
    Statement r = conn.prepare("ROLLBACK", "rollback");
    Transaction tx(conn, b, c, r);
    if (!accept(read_header(), shared)) {
      conn.exec(kSqlSchema, "cannot create the schema");
      if (!shared) conn.exec(kSqlMarkFile, "cannot create the schema");
    }
    tx.commit();
  }
};

std::optional<std::string> fingerprint_of(const Query& q) {
  if (q.column_is_null(kColFingerprint)) return std::nullopt;
  return std::string(q.column_bytes(kColFingerprint));
}

// What acquire does with the record it read (SPEC §4). Returns Busy or Replay when the
// answer needs no write; otherwise leaves the answer empty and says whether it is a steal.
struct Judgement {
  std::optional<AcquireResult> answer;
  bool stolen = false;
  std::uint32_t attempt = 1;
};

Judgement judge(const Query& q, bool found, Timestamp now) {
  Judgement j;
  if (!found) return j;
  const Timestamp expires_at = q.column_time(kColExpiresAt);
  if (q.column_int(kColState) == kComplete) {
    if (expires_at > now) {
      j.answer = Replay{std::string(q.column_bytes(kColPayload)), q.column_time(kColCompletedAt),
                        expires_at, fingerprint_of(q)};
    }
    // SPEC §4: an expired COMPLETE is replaced as if absent.
    return j;
  }
  const Timestamp lease_expires_at = q.column_time(kColLeaseExpiresAt);
  if (lease_expires_at > now) {
    j.answer = Busy{lease_expires_at, lease_expires_at - now, fingerprint_of(q)};
    return j;
  }
  // SPEC §4: an IN_PROGRESS record whose lease deadline passed is stolen.
  j.stolen = true;
  j.attempt = static_cast<std::uint32_t>(q.column_int(kColAttempt)) + 1;
  return j;
}

// One write queued for the group commit: its inputs, then its result.
struct WriteOp : QueuedWrite {
  enum class Kind { kAcquire, kComplete, kRelease, kExtend, kExtendMany, kPurge, kForget };
  explicit WriteOp(Kind k) : kind(k) {}

  const Kind kind;
  std::string_view scope;
  std::string_view key;
  Token token = 0;
  std::string_view payload;
  Duration lease{0};
  Duration ttl{0};
  std::optional<std::string_view> fingerprint;
  std::size_t limit = 0;                     // purge
  std::span<const ExtendRequest> extends;    // extend_many

  std::optional<AcquireResult> acquired;
  WriteResult written = WriteResult::kFenced;
  ExtendResult extended;
  std::vector<ExtendResult> extended_many;
  std::size_t deleted = 0;  // purge, forget
};

// The operations as they run inside a write transaction, each judged at its own `now`.

// Absent, expired or stealable when read before queueing: decide again under the write
// lock, since another process, or an earlier write of this batch, may have written the
// record since the read.
// (A template: the same steps run on a pooled connection and on a caller's, SPEC §14.)
template <typename C>
AcquireResult acquire_locked(C& c, const WriteOp& op, Timestamp now) {
  Judgement j;
  {
    Query q(c.conn, c.select_record);
    const bool found = q.bind(1, op.scope).bind(2, op.key).step();
    j = judge(q, found, now);
  }
  if (j.answer) return std::move(*j.answer);
  Token token = 0;
  {
    Query q(c.conn, c.next_token);
    if (!q.step()) c.conn.fail(SQLITE_CORRUPT, "next token: the idem_meta row is missing");
    token = static_cast<Token>(q.column_int(0));
    while (q.step()) {
    }
  }
  const Timestamp lease_expires_at = now + op.lease;
  const Timestamp expires_at = now + op.ttl;
  {
    Query q(c.conn, c.write_lease);
    q.bind(1, op.scope)
        .bind(2, op.key)
        .bind(3, static_cast<std::int64_t>(token))
        .bind(4, static_cast<std::int64_t>(j.attempt))
        .bind_time(5, now)
        .bind_time(6, lease_expires_at)
        .bind_time(7, expires_at);
    if (op.fingerprint) {
      q.bind(8, *op.fingerprint);
    } else {
      q.bind_null(8);
    }
    q.run();
  }
  return Acquired{Lease{token, now, lease_expires_at, expires_at, op.lease, j.attempt}, j.stolen};
}

template <typename C>
WriteResult complete_locked(C& c, const WriteOp& op, Timestamp now) {
  const auto tok = static_cast<std::int64_t>(op.token);
  int changed = 0;
  {
    Query q(c.conn, c.complete);
    changed = q.bind(1, op.scope)
                  .bind(2, op.key)
                  .bind(3, tok)
                  .bind(4, op.payload)
                  .bind_time(5, now)
                  .bind_time(6, now + op.ttl)
                  .run();
  }
  if (changed > 0) return WriteResult::kDone;
  // SPEC §4: a complete repeated with the token that completed the record succeeds and
  // changes nothing.
  Query q(c.conn, c.completed_by);
  return q.bind(1, op.scope).bind(2, op.key).bind(3, tok).step() ? WriteResult::kDone
                                                                  : WriteResult::kFenced;
}

WriteResult release_locked(PooledConnection& c, const WriteOp& op) {
  Query q(c.conn, c.release);
  const int changed =
      q.bind(1, op.scope).bind(2, op.key).bind(3, static_cast<std::int64_t>(op.token)).run();
  return changed > 0 ? WriteResult::kDone : WriteResult::kFenced;
}

ExtendResult extend_locked(PooledConnection& c, std::string_view scope, std::string_view key,
                           Token token, Duration lease, Timestamp now) {
  const Timestamp deadline = now + lease;
  Query q(c.conn, c.extend);
  const int changed = q.bind(1, scope)
                          .bind(2, key)
                          .bind(3, static_cast<std::int64_t>(token))
                          .bind_time(4, deadline)
                          .run();
  if (changed == 0) return ExtendResult{};
  return ExtendResult{WriteResult::kDone, deadline, lease};
}

std::size_t purge_locked(PooledConnection& c, const WriteOp& op, Timestamp now) {
  Query q(c.conn, c.purge);
  return static_cast<std::size_t>(
      q.bind_time(1, now).bind(2, static_cast<std::int64_t>(op.limit)).run());
}

std::size_t forget_locked(PooledConnection& c, const WriteOp& op) {
  Query q(c.conn, c.forget);
  return static_cast<std::size_t>(q.bind(1, op.scope).bind(2, op.key).run());
}

// `now` is read per operation (and per extend of an extend_many), as if each ran alone.
void run_locked(PooledConnection& c, WriteOp& op, const Clock& clock) {
  const Timestamp now = clock.now();
  switch (op.kind) {
    case WriteOp::Kind::kAcquire:
      op.acquired = acquire_locked(c, op, now);
      break;
    case WriteOp::Kind::kComplete:
      op.written = complete_locked(c, op, now);
      break;
    case WriteOp::Kind::kRelease:
      op.written = release_locked(c, op);
      break;
    case WriteOp::Kind::kExtend:
      op.extended = extend_locked(c, op.scope, op.key, op.token, op.lease, now);
      break;
    case WriteOp::Kind::kExtendMany:
      op.extended_many.clear();  // a batch that ran again starts over
      op.extended_many.reserve(op.extends.size());
      for (const ExtendRequest& r : op.extends) {
        op.extended_many.push_back(extend_locked(c, r.scope, r.key, r.token, r.lease,
                                                 op.extended_many.empty() ? now : clock.now()));
      }
      break;
    case WriteOp::Kind::kPurge:
      op.deleted = purge_locked(c, op, now);
      break;
    case WriteOp::Kind::kForget:
      op.deleted = forget_locked(c, op);
      break;
  }
}

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

struct SqliteStore::Impl {
  std::string path;      // absolute, so connections opened later ignore the working directory
  std::string describe;  // "sqlite:///abs/path.db"
  std::string synchronous;
  Duration busy_timeout;
  OpenMode mode;
  bool shared;
  std::shared_ptr<const Clock> clock;

  // Connections for reads.
  std::mutex mu;
  std::vector<std::unique_ptr<PooledConnection>> idle;

  // Every write of this store goes through `writes` and runs on `writer`, which only the
  // leader of the batch in flight touches (WriteQueue calls apply() for one batch at a time).
  std::unique_ptr<PooledConnection> writer;
  // Held by the leader while it applies a batch; a read may use `writer` while it is free.
  std::mutex writer_mu;
  WriteQueue writes{kBatchLimits, [this](std::span<QueuedWrite* const> batch) { apply(batch); }};

  // Checkpoints. SQLite's automatic checkpoint would run inside the COMMIT of the writer that
  // filled the WAL, copying a thousand pages and syncing both files while every writer
  // queued behind it waits. Instead the writer connection only counts the WAL's frames, and
  // once there are enough, a writer whose batch is done (its own call waits for this, nobody
  // else's) checkpoints on a connection of its own while the queue keeps committing. Frames
  // committed during that pass are copied by the next leader before its BEGIN (a short
  // catch-up), so the WAL is wholly copied and its next transaction writes it from the
  // start again instead of growing it.
  enum class Checkpoint { kIdle, kPassRunning, kCatchUpDue };
  std::atomic<Checkpoint> checkpoint{Checkpoint::kIdle};
  std::atomic<int> wal_frames{0};  // frames in the WAL after the writer's last commit

  explicit Impl(SqliteStoreOptions options)
      : synchronous(lowercase(std::move(options.synchronous))),
        busy_timeout(options.busy_timeout),
        mode(options.read_only           ? OpenMode::kReadOnly
             : options.create_if_missing ? OpenMode::kCreate
                                         : OpenMode::kExisting),
        shared(options.shared),
        clock(options.clock ? std::move(options.clock) : SystemClock::instance()) {
    if (options.path.empty()) throw InvalidArgument("SQLite path", "must not be empty");
    if (synchronous != "normal" && synchronous != "full") {
      throw InvalidArgument("synchronous",
                            "must be 'normal' or 'full', got '" + options.synchronous + "'");
    }
    if (busy_timeout < Duration::zero() || busy_timeout.count() > INT_MAX) {
      throw InvalidArgument("busy_timeout", "must be 0 to " + std::to_string(INT_MAX) +
                                                " ms, got " + std::to_string(busy_timeout.count()) +
                                                " ms");
    }
    std::error_code ec;
    std::filesystem::path abs = std::filesystem::absolute(options.path, ec);
    if (ec) {
      throw StoreUnavailable("sqlite:" + options.path, "cannot resolve the path: " + ec.message());
    }
    path = abs.lexically_normal().string();
    describe = "sqlite://" + path;
    if (mode != OpenMode::kCreate && !std::filesystem::exists(path, ec) && !ec) {
      throw StoreUnavailable(describe, std::string("the database file does not exist, and the "
                                                   "store was opened ") +
                                           (mode == OpenMode::kReadOnly ? "read-only"
                                                                        : "without creating it"));
    }
    idle.push_back(open(/*first=*/true));
  }

  std::unique_ptr<PooledConnection> open(bool first) {
    return std::make_unique<PooledConnection>(path, describe, busy_timeout, synchronous, mode,
                                              first, shared);
  }

  // A connection borrowed from the pool for one read.
  class Borrowed {
   public:
    Borrowed(Impl& impl, std::unique_ptr<PooledConnection> c) : impl_(impl), c_(std::move(c)) {}
    ~Borrowed() { impl_.give_back(std::move(c_)); }
    Borrowed(const Borrowed&) = delete;
    Borrowed& operator=(const Borrowed&) = delete;
    PooledConnection* operator->() const { return c_.get(); }
    PooledConnection& operator*() const { return *c_; }

   private:
    Impl& impl_;
    std::unique_ptr<PooledConnection> c_;
  };

  std::unique_ptr<PooledConnection> take_idle() {
    std::lock_guard lock(mu);
    if (idle.empty()) return nullptr;
    std::unique_ptr<PooledConnection> c = std::move(idle.back());
    idle.pop_back();
    return c;
  }

  Borrowed borrow() {
    std::unique_ptr<PooledConnection> c = take_idle();
    // Opening takes a while; other threads keep using the pool meanwhile.
    return Borrowed(*this, c ? std::move(c) : open(/*first=*/false));
  }

  void give_back(std::unique_ptr<PooledConnection> c) noexcept {
    // A connection left inside a transaction (a ROLLBACK that failed) is discarded rather
    // than handed to the next caller.
    if (!out_of_transaction(*c)) return;
    std::lock_guard lock(mu);
    if (idle.size() >= kMaxIdleConnections) return;
    try {
      idle.push_back(std::move(c));
    } catch (const std::bad_alloc&) {
      // Out of memory: close the connection instead of keeping it.
    }
  }

  // Rolls back a transaction left open; false when even that failed.
  static bool out_of_transaction(PooledConnection& c) noexcept {
    if (c.conn.in_transaction()) sqlite3_exec(c.conn.db(), "ROLLBACK", nullptr, nullptr, nullptr);
    return !c.conn.in_transaction();
  }

  // Queues a write and returns once it was applied; throws its error.
  void write(WriteOp& op) {
    {
      // An acquire is counted from before its read (in do_acquire).
      std::optional<WriteQueue::Caller> caller;
      if (op.kind != WriteOp::Kind::kAcquire) caller.emplace(writes);
      writes.submit(op);
    }
    if (wal_frames.load(std::memory_order_relaxed) >= kCheckpointFrames) checkpoint_pass();
  }

  // SQLite calls this on the writer connection after each commit.
  static int on_commit(void* self, sqlite3* /*db*/, const char* /*schema*/, int frames) {
    static_cast<Impl*>(self)->wal_frames.store(frames, std::memory_order_relaxed);
    return SQLITE_OK;
  }

  // A PASSIVE checkpoint never waits for readers or writers: it copies what no reader still
  // needs. Its errors are not the caller's (SQLITE_BUSY: another process is checkpointing);
  // the next commit asks again.
  static bool checkpoint_passive(sqlite3* db) noexcept {
    int frames = 0;
    int copied = 0;
    const int rc =
        sqlite3_wal_checkpoint_v2(db, nullptr, SQLITE_CHECKPOINT_PASSIVE, &frames, &copied);
    return rc == SQLITE_OK && copied >= frames;
  }

  void checkpoint_pass() noexcept {
    Checkpoint idle = Checkpoint::kIdle;
    if (!checkpoint.compare_exchange_strong(idle, Checkpoint::kPassRunning)) return;
    bool complete = true;
    try {
      auto c = borrow();
      complete = checkpoint_passive(c->conn.db());
    } catch (...) {
      // No connection to checkpoint with: the next commit asks again.
    }
    if (complete) wal_frames.store(0, std::memory_order_relaxed);
    checkpoint.store(complete ? Checkpoint::kIdle : Checkpoint::kCatchUpDue);
  }

  // The leader's part, before it begins a transaction on `c`.
  void checkpoint_catch_up(PooledConnection& c) noexcept {
    if (checkpoint.load() != Checkpoint::kCatchUpDue) return;
    if (checkpoint_passive(c.conn.db())) wal_frames.store(0, std::memory_order_relaxed);
    checkpoint.store(Checkpoint::kIdle);
  }

  // The group commit (WriteQueue's leader calls this): applies a batch in one write
  // transaction, each operation exactly as if it ran alone. Inside a batch of several, each
  // runs in a savepoint: an operation that fails is rolled back alone and reports its own
  // error while the others go on. When an error ends the whole transaction (SQLite rolls
  // back on some I/O and out-of-memory errors), that operation fails and the others run again
  // in a new transaction: nothing of the first one was committed or reported. A failure of
  // BEGIN or COMMIT fails every operation of the batch that had not already failed.
  void apply(std::span<QueuedWrite* const> batch) noexcept {
    std::lock_guard own_writer(writer_mu);
    const bool alone = batch.size() == 1;
    for (bool again = true; again;) {
      again = false;
      try {
        PooledConnection& c = writer_connection();
        checkpoint_catch_up(c);
        Transaction tx = c.write_transaction();
        for (QueuedWrite* q : batch) {
          auto& op = static_cast<WriteOp&>(*q);
          if (op.error) continue;
          if (alone) {
            // An error rolls back the transaction, which holds this operation only.
            run_locked(c, op, *clock);
            continue;
          }
          Query(c.conn, c.savepoint).run();
          try {
            run_locked(c, op, *clock);
          } catch (...) {
            op.error = std::current_exception();
            if (!c.conn.in_transaction()) {
              again = true;
              break;
            }
            Query(c.conn, c.rollback_to_savepoint).run();
          }
          Query(c.conn, c.release_savepoint).run();
        }
        if (!again) tx.commit();
      } catch (...) {
        for (QueuedWrite* q : batch) {
          if (!q->error) q->error = std::current_exception();
        }
      }
    }
    if (writer && !out_of_transaction(*writer)) writer.reset();
  }

  PooledConnection& writer_connection() {
    if (!writer) {
      std::unique_ptr<PooledConnection> c = take_idle();
      if (!c) c = open(/*first=*/false);
      // Replaces SQLite's automatic checkpoint on this connection (see `checkpoint`).
      sqlite3_wal_hook(c->conn.db(), &Impl::on_commit, this);
      writer = std::move(c);
    }
    return *writer;
  }

  Timestamp now() const { return clock->now(); }
};

SqliteStore::SqliteStore(SqliteStoreOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

SqliteStore::~SqliteStore() = default;

std::string SqliteStore::describe() const { return impl_->describe; }

SqliteWriteStats SqliteStore::write_stats() const {
  const WriteQueue::Counts c = impl_->writes.counts();
  return SqliteWriteStats{c.batches, c.operations, c.in_flight, c.queued};
}

AcquireResult SqliteStore::do_acquire(std::string_view scope, std::string_view key, Duration lease,
                                      Duration ttl, std::optional<std::string_view> fingerprint) {
  // A replay or a busy answer must not queue for the write lock: read first, in autocommit,
  // which in WAL never waits for a writer.
  const WriteQueue::Caller caller(impl_->writes);
  auto pre_read = [&](PooledConnection& c) {
    Query q(c.conn, c.select_record);
    const bool found = q.bind(1, scope).bind(2, key).step();
    return judge(q, found, impl_->now());
  };
  Judgement j;
  if (std::unique_lock idle_writer(impl_->writer_mu, std::try_to_lock);
      idle_writer.owns_lock() && impl_->writer) {
    // No batch in flight: read on the writer connection, whose page cache is current (a
    // pooled connection rereads the pages that the last commits changed).
    j = pre_read(*impl_->writer);
  } else {
    idle_writer = {};
    j = pre_read(*impl_->borrow());
  }
  if (j.answer) return std::move(*j.answer);
  WriteOp op(WriteOp::Kind::kAcquire);
  op.scope = scope;
  op.key = key;
  op.lease = lease;
  op.ttl = ttl;
  op.fingerprint = fingerprint;
  op.bytes = fingerprint ? fingerprint->size() : 0;
  impl_->write(op);
  return std::move(*op.acquired);
}

WriteResult SqliteStore::do_complete(std::string_view scope, std::string_view key, Token token,
                                     std::string_view payload, Duration ttl) {
  WriteOp op(WriteOp::Kind::kComplete);
  op.scope = scope;
  op.key = key;
  op.token = token;
  op.payload = payload;
  op.ttl = ttl;
  op.bytes = payload.size();
  impl_->write(op);
  return op.written;
}

WriteResult SqliteStore::do_release(std::string_view scope, std::string_view key, Token token) {
  WriteOp op(WriteOp::Kind::kRelease);
  op.scope = scope;
  op.key = key;
  op.token = token;
  impl_->write(op);
  return op.written;
}

ExtendResult SqliteStore::do_extend(std::string_view scope, std::string_view key, Token token,
                                    Duration lease) {
  WriteOp op(WriteOp::Kind::kExtend);
  op.scope = scope;
  op.key = key;
  op.token = token;
  op.lease = lease;
  impl_->write(op);
  return op.extended;
}

std::vector<ExtendResult> SqliteStore::do_extend_many(std::span<const ExtendRequest> requests) {
  WriteOp op(WriteOp::Kind::kExtendMany);
  op.extends = requests;
  op.operations = requests.size();
  impl_->write(op);
  return std::move(op.extended_many);
}

std::size_t SqliteStore::do_purge(std::size_t limit) {
  std::size_t deleted = 0;
  while (deleted < limit) {
    // Each chunk is its own write, so acquisitions run between chunks.
    WriteOp op(WriteOp::Kind::kPurge);
    op.limit = std::min(limit - deleted, kPurgeBatch);
    impl_->write(op);
    deleted += op.deleted;
    if (op.deleted < op.limit) break;
  }
  return deleted;
}

std::optional<Record> SqliteStore::do_get(std::string_view scope, std::string_view key) {
  auto c = impl_->borrow();
  Query q(c->conn, c->select_record);
  if (!q.bind(1, scope).bind(2, key).step()) return std::nullopt;
  Record r;
  r.state =
      q.column_int(kColState) == kComplete ? RecordState::kComplete : RecordState::kInProgress;
  r.token = static_cast<Token>(q.column_int(kColToken));
  r.attempt = static_cast<std::uint32_t>(q.column_int(kColAttempt));
  r.acquired_at = q.column_time(kColAcquiredAt);
  r.lease_expires_at = q.column_time(kColLeaseExpiresAt);
  r.completed_at = q.column_time(kColCompletedAt);
  r.expires_at = q.column_time(kColExpiresAt);
  r.payload = std::string(q.column_bytes(kColPayload));
  r.fingerprint = fingerprint_of(q);
  r.now = impl_->now();
  return r;
}

bool SqliteStore::do_forget(std::string_view scope, std::string_view key) {
  WriteOp op(WriteOp::Kind::kForget);
  op.scope = scope;
  op.key = key;
  impl_->write(op);
  return op.deleted > 0;
}

// --- SPEC §14: the caller's transaction ---------------------------------------------------

namespace {

// The statements one operation on a caller's connection needs, prepared on it for that call
// (a caller's connection may close at any time after, so nothing is cached on it).
struct CallerStatements {
  Connection conn;
  Statement select_record, next_token, write_lease, complete, completed_by;
  CallerStatements(sqlite3* db, const std::string& store) : conn(db, store) {}
};

// The same file, whatever path each was opened by.
bool same_file(const std::string& a, const char* b) {
  if (b == nullptr || *b == '\0') return false;  // a temporary or in-memory database
  std::error_code ec;
  const bool same = std::filesystem::equivalent(a, b, ec);
  return !ec && same;
}

}  // namespace

TransactionalStore* SqliteStore::transactions() noexcept {
  return impl_->mode == OpenMode::kReadOnly ? nullptr : this;
}

SqlConnection::Kind SqliteStore::connection_kind() const noexcept {
  return SqlConnection::Kind::kSqlite;
}

namespace {

// A connection the store may write on: inside a transaction, on the store's own file.
void check_caller(sqlite3* db, const std::string& path, bool in_transaction) {
  if (!same_file(path, sqlite3_db_filename(db, "main"))) {
    const char* theirs = sqlite3_db_filename(db, "main");
    throw InvalidArgument("connection", std::string("is on ") +
                                            (theirs && *theirs ? theirs : "a temporary database") +
                                            ", not on the store's file " + path);
  }
  if (in_transaction && sqlite3_get_autocommit(db) != 0) {
    throw InvalidArgument("connection",
                          "is not inside a transaction: BEGIN IMMEDIATE on it first, so that "
                          "the record commits with your writes");
  }
}

}  // namespace

WriteResult SqliteStore::do_complete_in(const SqlConnection& conn, std::string_view scope,
                                        std::string_view key, Token token,
                                        std::string_view payload, Duration ttl) {
  check_caller(conn.sqlite(), impl_->path, true);
  CallerStatements c(conn.sqlite(), impl_->describe);
  c.complete = c.conn.prepare(kSqlComplete, "complete in the caller's transaction");
  c.completed_by = c.conn.prepare(kSqlCompletedBy, "complete in the caller's transaction: check");
  WriteOp op(WriteOp::Kind::kComplete);
  op.scope = scope;
  op.key = key;
  op.token = token;
  op.payload = payload;
  op.ttl = ttl;
  return complete_locked(c, op, impl_->now());
}

AcquireResult SqliteStore::do_acquire_in(const SqlConnection& conn, std::string_view scope,
                                         std::string_view key, Duration lease, Duration ttl,
                                         std::optional<std::string_view> fingerprint,
                                         bool /*nowait: the caller's BEGIN IMMEDIATE waited*/) {
  check_caller(conn.sqlite(), impl_->path, true);
  CallerStatements c(conn.sqlite(), impl_->describe);
  c.select_record = c.conn.prepare(kSqlSelectRecord, "acquire in the caller's transaction: read");
  c.next_token = c.conn.prepare(kSqlNextToken, "acquire in the caller's transaction: token");
  c.write_lease = c.conn.prepare(kSqlWriteLease, "acquire in the caller's transaction: write");
  WriteOp op(WriteOp::Kind::kAcquire);
  op.scope = scope;
  op.key = key;
  op.lease = lease;
  op.ttl = ttl;
  op.fingerprint = fingerprint;
  return acquire_locked(c, op, impl_->now());
}

void SqliteStore::do_begin(const SqlConnection& conn) {
  check_caller(conn.sqlite(), impl_->path, false);
  const Connection c(conn.sqlite(), impl_->describe);
  if (c.in_transaction()) {
    throw InvalidArgument("connection", "is inside a transaction already; run_in_transaction "
                                        "begins and commits its own");
  }
  c.exec("BEGIN IMMEDIATE", "cannot begin the caller's transaction");
}

void SqliteStore::do_commit(const SqlConnection& conn) {
  const Connection c(conn.sqlite(), impl_->describe);
  try {
    c.exec("COMMIT", "cannot commit the caller's transaction");
  } catch (...) {
    // A COMMIT that failed with SQLITE_BUSY leaves the transaction open: end it, so that
    // the outcome is known (rolled back).
    if (c.in_transaction()) do_rollback(conn);
    throw;
  }
}

void SqliteStore::do_rollback(const SqlConnection& conn) noexcept {
  if (sqlite3_get_autocommit(conn.sqlite()) != 0) return;
  (void)sqlite3_exec(conn.sqlite(), "ROLLBACK", nullptr, nullptr, nullptr);
}

namespace detail {

std::shared_ptr<Store> open_sqlite_store(const Url& url, const OpenOptions& options) {
  if (!url.host.empty() || !url.user.empty() || !url.password.empty() || url.port != 0) {
    throw InvalidArgument("store URL", "'sqlite:' takes a file, not a host ('" + url.host +
                                           "'); use sqlite:///absolute/path.db or "
                                           "sqlite:relative/path.db");
  }
  if (url.path.empty()) {
    throw InvalidArgument("store URL",
                          "'sqlite:' needs a database file: sqlite:///absolute/path.db or "
                          "sqlite:relative/path.db");
  }
  SqliteStoreOptions o{.path = url.path,
                       .clock = options.clock,
                       .read_only = options.read_only,
                       .create_if_missing = options.create_if_missing};
  for (const auto& [name, value] : url.query) {
    if (name == "synchronous") {
      o.synchronous = lowercase(value);
      if (o.synchronous != "normal" && o.synchronous != "full") {
        throw InvalidArgument("store URL",
                              "parameter 'synchronous' must be 'normal' or "
                              "'full', got '" +
                                  value + "'");
      }
    } else if (name == "busy_timeout") {
      int ms = -1;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), ms);
      if (ec != std::errc{} || end != value.data() + value.size() || ms < 0) {
        throw InvalidArgument("store URL",
                              "parameter 'busy_timeout' must be a whole number "
                              "of milliseconds, got '" +
                                  value + "'");
      }
      o.busy_timeout = Duration{ms};
    } else if (name == "shared") {
      if (value != "0" && value != "1") {
        throw InvalidArgument("store URL", "parameter 'shared' must be 0 or 1, got '" + value + "'");
      }
      o.shared = value == "1";
    } else {
      throw InvalidArgument("store URL", "unknown parameter '" + name +
                                             "' for sqlite: (known: busy_timeout, shared, "
                                             "synchronous)");
    }
  }
  return std::make_shared<SqliteStore>(std::move(o));
}

}  // namespace detail

}  // namespace idem
