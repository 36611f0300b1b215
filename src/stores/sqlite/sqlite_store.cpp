#include "idem/stores/sqlite_store.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <climits>
#include <filesystem>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"
#include "stores/sqlite/sqlite_db.h"
#include "stores/sqlite/sqlite_sql.h"

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
using sqlite::Statement;
using sqlite::Transaction;

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
PRAGMA application_id = 1768187245;
PRAGMA user_version = 1;
)sql";

constexpr int kComplete = 1;

// Records deleted per purge transaction, so a purge never holds the write lock for long.
constexpr std::size_t kPurgeBatch = 256;
// Idle connections kept open; more are opened under load and closed when returned.
constexpr std::size_t kMaxIdleConnections = 16;

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

  PooledConnection(const std::string& path, const std::string& store, Duration busy_timeout,
                   const std::string& synchronous, OpenMode mode, bool first)
      : conn(path, store, busy_timeout, mode) {
    // The first connection checks the file before anything else touches it.
    if (first) prepare_file(mode);
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
  }

  Transaction write_transaction() { return Transaction(conn, begin, commit, rollback); }

 private:
  struct Header {
    std::int64_t application_id = 0;
    std::int64_t version = 0;
    std::int64_t objects = 0;
  };

  Header read_header() {
    return Header{
        conn.query_int("PRAGMA application_id", "cannot read the database header"),
        conn.query_int("PRAGMA user_version", "cannot read the database header"),
        conn.query_int("SELECT count(*) FROM sqlite_schema", "cannot read the database schema")};
  }

  // Throws unless `h` is our schema at a version this build reads; returns false when the
  // file is empty and the schema must be created.
  bool accept(const Header& h) {
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
                                 std::to_string(h.version) + "); refusing to use it");
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
  void prepare_file(OpenMode open_mode) {
    // One read transaction, so the three header values are one consistent snapshot.
    conn.exec("BEGIN", "cannot read the database header");
    Header h = read_header();
    conn.exec("COMMIT", "cannot read the database header");
    const bool ready = accept(h);
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
    if (!accept(read_header())) conn.exec(kSqlSchema, "cannot create the schema");
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
  std::shared_ptr<const Clock> clock;

  std::mutex mu;
  std::vector<std::unique_ptr<PooledConnection>> idle;

  explicit Impl(SqliteStoreOptions options)
      : synchronous(lowercase(std::move(options.synchronous))),
        busy_timeout(options.busy_timeout),
        mode(options.read_only           ? OpenMode::kReadOnly
             : options.create_if_missing ? OpenMode::kCreate
                                         : OpenMode::kExisting),
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
                                              first);
  }

  // A connection borrowed from the pool for one operation.
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

  Borrowed borrow() {
    {
      std::lock_guard lock(mu);
      if (!idle.empty()) {
        std::unique_ptr<PooledConnection> c = std::move(idle.back());
        idle.pop_back();
        return Borrowed(*this, std::move(c));
      }
    }
    // Opening takes a while; other threads keep using the pool meanwhile.
    return Borrowed(*this, open(/*first=*/false));
  }

  void give_back(std::unique_ptr<PooledConnection> c) noexcept {
    // A connection left inside a transaction (a ROLLBACK that failed) is discarded rather
    // than handed to the next caller.
    if (c->conn.in_transaction()) {
      sqlite3_exec(c->conn.db(), "ROLLBACK", nullptr, nullptr, nullptr);
      if (c->conn.in_transaction()) return;
    }
    std::lock_guard lock(mu);
    if (idle.size() >= kMaxIdleConnections) return;
    try {
      idle.push_back(std::move(c));
    } catch (const std::bad_alloc&) {
      // Out of memory: close the connection instead of keeping it.
    }
  }

  Timestamp now() const { return clock->now(); }
};

SqliteStore::SqliteStore(SqliteStoreOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

SqliteStore::~SqliteStore() = default;

std::string SqliteStore::describe() const { return impl_->describe; }

AcquireResult SqliteStore::do_acquire(std::string_view scope, std::string_view key, Duration lease,
                                      Duration ttl, std::optional<std::string_view> fingerprint) {
  auto c = impl_->borrow();
  // A replay or a busy answer must not take the write lock: read first, in autocommit,
  // which in WAL never waits for a writer.
  {
    Query q(c->conn, c->select_record);
    const bool found = q.bind(1, scope).bind(2, key).step();
    Judgement j = judge(q, found, impl_->now());
    if (j.answer) return std::move(*j.answer);
  }
  // Absent, expired or stealable: decide again under the write lock, since another
  // connection may have written the record since the read.
  Transaction tx = c->write_transaction();
  const Timestamp now = impl_->now();
  Judgement j;
  {
    Query q(c->conn, c->select_record);
    const bool found = q.bind(1, scope).bind(2, key).step();
    j = judge(q, found, now);
  }
  if (j.answer) {
    tx.commit();
    return std::move(*j.answer);
  }
  Token token = 0;
  {
    Query q(c->conn, c->next_token);
    if (!q.step()) {
      c->conn.fail(SQLITE_CORRUPT, "next token: the idem_meta row is missing");
    }
    token = static_cast<Token>(q.column_int(0));
    while (q.step()) {
    }
  }
  const Timestamp lease_expires_at = now + lease;
  const Timestamp expires_at = now + ttl;
  {
    Query q(c->conn, c->write_lease);
    q.bind(1, scope)
        .bind(2, key)
        .bind(3, static_cast<std::int64_t>(token))
        .bind(4, static_cast<std::int64_t>(j.attempt))
        .bind_time(5, now)
        .bind_time(6, lease_expires_at)
        .bind_time(7, expires_at);
    if (fingerprint) {
      q.bind(8, *fingerprint);
    } else {
      q.bind_null(8);
    }
    q.run();
  }
  tx.commit();
  return Acquired{Lease{token, now, lease_expires_at, expires_at, lease, j.attempt}, j.stolen};
}

WriteResult SqliteStore::do_complete(std::string_view scope, std::string_view key, Token token,
                                     std::string_view payload, Duration ttl) {
  auto c = impl_->borrow();
  Transaction tx = c->write_transaction();
  const Timestamp now = impl_->now();
  const auto tok = static_cast<std::int64_t>(token);
  int changed = 0;
  {
    Query q(c->conn, c->complete);
    changed = q.bind(1, scope)
                  .bind(2, key)
                  .bind(3, tok)
                  .bind(4, payload)
                  .bind_time(5, now)
                  .bind_time(6, now + ttl)
                  .run();
  }
  bool done = changed > 0;
  if (!done) {
    // SPEC §4: a complete repeated with the token that completed the record succeeds and
    // changes nothing.
    Query q(c->conn, c->completed_by);
    done = q.bind(1, scope).bind(2, key).bind(3, tok).step();
  }
  tx.commit();
  return done ? WriteResult::kDone : WriteResult::kFenced;
}

WriteResult SqliteStore::do_release(std::string_view scope, std::string_view key, Token token) {
  auto c = impl_->borrow();
  // One statement in autocommit is one write transaction; it takes the write lock before it
  // reads, exactly as BEGIN IMMEDIATE would.
  Query q(c->conn, c->release);
  const int changed = q.bind(1, scope).bind(2, key).bind(3, static_cast<std::int64_t>(token)).run();
  return changed > 0 ? WriteResult::kDone : WriteResult::kFenced;
}

ExtendResult SqliteStore::do_extend(std::string_view scope, std::string_view key, Token token,
                                    Duration lease) {
  auto c = impl_->borrow();
  const Timestamp now = impl_->now();
  const Timestamp deadline = now + lease;
  Query q(c->conn, c->extend);
  const int changed = q.bind(1, scope)
                          .bind(2, key)
                          .bind(3, static_cast<std::int64_t>(token))
                          .bind_time(4, deadline)
                          .run();
  if (changed == 0) return ExtendResult{};
  return ExtendResult{WriteResult::kDone, deadline, lease};
}

std::size_t SqliteStore::do_purge(std::size_t limit) {
  auto c = impl_->borrow();
  std::size_t deleted = 0;
  while (deleted < limit) {
    // Each batch is its own short write transaction, so acquisitions run between batches.
    const std::size_t batch = std::min(limit - deleted, kPurgeBatch);
    Query q(c->conn, c->purge);
    const int n = q.bind_time(1, impl_->now()).bind(2, static_cast<std::int64_t>(batch)).run();
    deleted += static_cast<std::size_t>(n);
    if (static_cast<std::size_t>(n) < batch) break;
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
  auto c = impl_->borrow();
  Query q(c->conn, c->forget);
  return q.bind(1, scope).bind(2, key).run() > 0;
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
    } else {
      throw InvalidArgument("store URL", "unknown parameter '" + name +
                                             "' for sqlite: (known: busy_timeout, synchronous)");
    }
  }
  return std::make_shared<SqliteStore>(std::move(o));
}

}  // namespace detail

}  // namespace idem
