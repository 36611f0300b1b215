#include "idem/stores/sqlite_store.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "idem/error.h"
#include "stores/kit/own_copy.h"
#include "stores/sqlite/sqlite_connection.h"
#include "stores/sqlite/sqlite_operations.h"
#include "stores/sqlite/sqlite_schema.h"
#include "stores/sqlite/sqlite_url.h"
#include "stores/sqlite/sqlite_wake.h"
#include "stores/sqlite/sqlite_write_queue.h"

namespace idem {
namespace {

using sqlite::acquire_locked;
using sqlite::complete_locked;
using sqlite::Connection;
using sqlite::fingerprint_of;
using sqlite::judge;
using sqlite::Judgement;
using sqlite::kColAcquiredAt;
using sqlite::kColAttempt;
using sqlite::kColCompletedAt;
using sqlite::kColExpiresAt;
using sqlite::kColLeaseExpiresAt;
using sqlite::kColPayload;
using sqlite::kColState;
using sqlite::kColToken;
using sqlite::kComplete;
using sqlite::kSqlComplete;
using sqlite::kSqlCompletedBy;
using sqlite::kSqlExtend;
using sqlite::kSqlForget;
using sqlite::kSqlNextToken;
using sqlite::kSqlPurge;
using sqlite::kSqlRelease;
using sqlite::kSqlSelectRecord;
using sqlite::kSqlWriteLease;
using sqlite::lowercase;
using sqlite::OpenMode;
using sqlite::PooledConnection;
using sqlite::Query;
using sqlite::QueuedWrite;
using sqlite::run_locked;
using sqlite::Statement;
using sqlite::Transaction;
using sqlite::WriteOp;
using sqlite::WriteQueue;

// Records deleted per purge transaction, so a purge never holds the write lock for long.
constexpr std::size_t kPurgeBatch = 256;
// Idle connections kept open for reads; more are opened under load and closed when
// returned. Writes all go through the one writer connection.
constexpr std::size_t kMaxIdleConnections = 16;
// The group commit's bounds: operations and payload bytes in one write transaction. A
// transaction of 64 small operations holds the write lock for well under a millisecond.
constexpr WriteQueue::Limits kBatchLimits{.max_operations = 64, .max_bytes = std::size_t{1} << 20};
// A checkpoint copies the WAL back into the database file once the WAL holds this many
// frames (SQLite's own default for PRAGMA wal_autocheckpoint).
constexpr int kCheckpointFrames = 1000;

}  // namespace

namespace {

// The statements one operation on a caller's connection needs, prepared on it for that call
// or, for run_in_transaction, from its begin() to its commit() or rollback() (a caller's
// connection may close at any time after, so nothing outlives that).
struct CallerStatements {
  Connection conn;
  Statement select_record, next_token, write_lease, complete, completed_by;
  CallerStatements(sqlite3* db, const std::string& store) : conn(db, store) {}
  void prepare_completed_by() {
    if (!completed_by.handle) {
      completed_by = conn.prepare(kSqlCompletedBy, "complete in the caller's transaction: check");
    }
  }
};

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

  // The turns of this process's writers on the file: the group commit's transactions and
  // run_in_transaction's (TransactionalStore::begin to commit or rollback) take turns here,
  // each woken the moment the one before ends, instead of in SQLite's busy handler, which
  // sleeps 1 to 100 ms between tries whoever holds the lock (issue 36: 8 callers of
  // run_in_transaction ran at half the two-commit flow's rate). Waited for up to the busy
  // timeout, then the write goes ahead without its turn (and meets SQLite's lock as
  // before), so a writer that waits for itself (an action that writes through this store
  // inside its transaction) fails after the busy timeout as it always did, never hangs.
  // Other processes still meet SQLite's lock.
  class WriteTurns {
   public:
    // Whether `who` got the turn (false: the wait ran out, or `who` holds it already).
    bool enter(const void* who, Duration timeout) {
      std::unique_lock lock(mu_);
      if (holder_ == who) return false;
      if (!cv_.wait_for(lock, timeout, [&] { return holder_ == nullptr; })) return false;
      holder_ = who;
      return true;
    }
    void leave(const void* who) noexcept {
      {
        std::lock_guard lock(mu_);
        if (holder_ != who) return;
        holder_ = nullptr;
      }
      cv_.notify_one();
    }

   private:
    std::mutex mu_;
    std::condition_variable cv_;
    const void* holder_ = nullptr;  // guarded by mu_
  };
  WriteTurns turns;
  // The complete's statement of each caller transaction that run_in_transaction began,
  // prepared before its turn to write (so that preparing is not done while every other
  // writer of the process waits), finalized at its commit or rollback.
  std::mutex prepared_mu;
  std::vector<std::unique_ptr<CallerStatements>> prepared;  // guarded by prepared_mu
  std::unique_ptr<CallerStatements> take_prepared(sqlite3* db) {
    std::lock_guard lock(prepared_mu);
    for (auto& p : prepared) {
      if (p->conn.db() != db) continue;
      std::unique_ptr<CallerStatements> out = std::move(p);
      p = std::move(prepared.back());
      prepared.pop_back();
      return out;
    }
    return nullptr;
  }
  // One turn, given back when it goes out of scope.
  struct Turn {
    WriteTurns& turns;
    const void* who;
    bool held;
    Turn(WriteTurns& t, const void* w, Duration timeout)
        : turns(t), who(w), held(t.enter(w, timeout)) {}
    ~Turn() {
      if (held) turns.leave(who);
    }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;
  };
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

  // The store's file as the operating system names it (device, inode), for SPEC §14's check
  // that a caller's connection is on it; unset only if the file could not be stat()ed.
  struct FileId {
    dev_t dev;
    ino_t ino;
  };
  std::optional<FileId> file_id;

  // SPEC §7's same-machine signal; null when read-only, turned off or unavailable.
  std::unique_ptr<sqlite::WakeSignal> wake;

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
      const std::string why =
          std::string("the database file does not exist, and the store was opened ") +
          (mode == OpenMode::kReadOnly ? "read-only" : "without creating it");
      // StoreNotFound only when nothing is there (ENOENT); a path through a regular file
      // (ENOTDIR) can never be a store and stays an error of the store.
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) throw StoreNotFound(describe, why);
      throw StoreUnavailable(describe, why);
    }
    idle.push_back(open(/*first=*/true));
    // SPEC §14: the file a caller's connection must be on, by identity (device and inode),
    // recorded once the file exists; a name alone can lead elsewhere (a link, a file
    // replaced since, a caller that opened another file by the same relative path).
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) file_id = FileId{st.st_dev, st.st_ino};
    if (options.notify && mode != OpenMode::kReadOnly) wake = sqlite::WakeSignal::open(path);
  }

  // After a committed write that may end a waiter's wait.
  void signal(std::string_view scope, std::string_view key) const noexcept {
    if (wake) wake->notify(scope, key);
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
        const Turn turn(turns, &c, busy_timeout);
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
        const std::exception_ptr error = std::current_exception();
        for (QueuedWrite* q : batch) {
          if (!q->error) q->error = kit::own_copy(error);
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
  if (op.written == WriteResult::kDone) impl_->signal(scope, key);
  return op.written;
}

WriteResult SqliteStore::do_release(std::string_view scope, std::string_view key, Token token) {
  WriteOp op(WriteOp::Kind::kRelease);
  op.scope = scope;
  op.key = key;
  op.token = token;
  impl_->write(op);
  if (op.written == WriteResult::kDone) impl_->signal(scope, key);
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
  if (op.deleted > 0) impl_->signal(scope, key);
  return op.deleted > 0;
}

std::unique_ptr<RecordWatch> SqliteStore::do_watch(std::string_view scope, std::string_view key,
                                                   std::function<void()> changed) {
  if (!impl_->wake) return nullptr;
  return impl_->wake->watch(scope, key, std::move(changed));
}

// --- SPEC §14: the caller's transaction ---------------------------------------------------

TransactionalStore* SqliteStore::transactions() noexcept { return this; }

SqlConnection::Kind SqliteStore::connection_kind() const noexcept {
  return SqlConnection::Kind::kSqlite;
}

void SqliteStore::do_check_connection(const SqlConnection& conn, ConnectionUse use) {
  const Impl& s = *impl_;
  if (s.mode == OpenMode::kReadOnly) {
    throw InvalidArgument("store", s.describe +
                                       " was opened read-only: it cannot write records in your "
                                       "transaction (open it without read_only)");
  }
  sqlite3* db = conn.sqlite();
  // The caller's file, by identity: the same device and inode as the store's file.
  const char* theirs = sqlite3_db_filename(db, "main");
  if (theirs == nullptr || *theirs == '\0') {
    throw InvalidArgument("connection",
                          "is on a temporary or in-memory database, not on the "
                          "store's file " +
                              s.path);
  }
  struct stat st {};
  const bool same = s.file_id && ::stat(theirs, &st) == 0 && st.st_dev == s.file_id->dev &&
                    st.st_ino == s.file_id->ino;
  if (!same) {
    throw InvalidArgument("connection", std::string("is on ") + theirs +
                                            ", not on the store's file " + s.path +
                                            " (compared by device and inode)");
  }
  if (sqlite3_db_readonly(db, "main") == 1) {
    throw InvalidArgument("connection",
                          "is read-only (opened with SQLITE_OPEN_READONLY, or the file is not "
                          "writable by this process): the record cannot be written on it");
  }
  const bool in_transaction = sqlite3_get_autocommit(db) == 0;
  if (use == ConnectionUse::kJoin && !in_transaction) {
    throw InvalidArgument("connection",
                          "is not inside a transaction: BEGIN IMMEDIATE on it first, so that "
                          "the record commits with your writes");
  }
  if (use == ConnectionUse::kBegin && in_transaction) {
    // Refused at once: the store's own write would wait for this transaction's lock.
    throw InvalidArgument("connection",
                          "is inside a transaction already; run_in_transaction begins and "
                          "commits its own (use run_in_open_transaction in a transaction of "
                          "yours)");
  }
}

bool SqliteStore::do_outside_transaction(const SqlConnection& conn) const noexcept {
  return sqlite3_get_autocommit(conn.sqlite()) != 0;
}

WriteResult SqliteStore::do_complete_in(const SqlConnection& conn, std::string_view scope,
                                        std::string_view key, Token token, std::string_view payload,
                                        Duration ttl) {
  Impl& s = *impl_;
  WriteOp op(WriteOp::Kind::kComplete);
  op.scope = scope;
  op.key = key;
  op.token = token;
  op.payload = payload;
  op.ttl = ttl;
  // run_in_transaction's begin() prepared it; it stays until that transaction's end.
  if (std::unique_ptr<CallerStatements> ready = s.take_prepared(conn.sqlite())) {
    const WriteResult written = complete_locked(*ready, op, s.now());
    std::lock_guard lock(s.prepared_mu);
    s.prepared.push_back(std::move(ready));
    return written;
  }
  CallerStatements c(conn.sqlite(), s.describe);
  c.complete = c.conn.prepare(kSqlComplete, "complete in the caller's transaction");
  return complete_locked(c, op, s.now());
}

AcquireResult SqliteStore::do_acquire_in(const SqlConnection& conn, std::string_view scope,
                                         std::string_view key, Duration lease, Duration ttl,
                                         std::optional<std::string_view> fingerprint,
                                         bool /*nowait: the caller's BEGIN IMMEDIATE waited*/) {
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

// The caller's transaction takes this process's write turn (Impl::turns) before its BEGIN
// IMMEDIATE and gives it back at its COMMIT or ROLLBACK.
void SqliteStore::do_begin(const SqlConnection& conn) {
  Impl& s = *impl_;
  auto ready = std::make_unique<CallerStatements>(conn.sqlite(), s.describe);
  ready->complete = ready->conn.prepare(kSqlComplete, "complete in the caller's transaction");
  const bool turn = s.turns.enter(conn.sqlite(), s.busy_timeout);
  try {
    ready->conn.exec("BEGIN IMMEDIATE", "cannot begin the caller's transaction");
  } catch (...) {
    if (turn) s.turns.leave(conn.sqlite());
    throw;
  }
  std::lock_guard lock(s.prepared_mu);
  s.prepared.push_back(std::move(ready));
}

void SqliteStore::do_commit(const SqlConnection& conn) {
  const Connection c(conn.sqlite(), impl_->describe);
  try {
    c.exec("COMMIT", "cannot commit the caller's transaction");
  } catch (...) {
    // A COMMIT that failed with SQLITE_BUSY leaves the transaction open: end it, so that
    // the outcome is known (rolled back).
    do_rollback(conn);
    throw;
  }
  (void)impl_->take_prepared(conn.sqlite());
  impl_->turns.leave(conn.sqlite());
}

void SqliteStore::do_rollback(const SqlConnection& conn) noexcept {
  if (sqlite3_get_autocommit(conn.sqlite()) == 0) {
    (void)sqlite3_exec(conn.sqlite(), "ROLLBACK", nullptr, nullptr, nullptr);
  }
  (void)impl_->take_prepared(conn.sqlite());
  impl_->turns.leave(conn.sqlite());
}

}  // namespace idem
