#pragma once

// The SQLite store's operations: a pooled connection with its prepared statements, and the
// steps each write runs inside a write transaction (on the store's writer, or on a caller's
// connection, SPEC §14). Private to the store.

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/store.h"
#include "stores/sqlite/sqlite_connection.h"
#include "stores/sqlite/sqlite_schema.h"
#include "stores/sqlite/sqlite_write_queue.h"

namespace idem::sqlite {

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
                   const std::string& synchronous, OpenMode mode, bool first, bool shared);

  Transaction write_transaction() { return Transaction(conn, begin, commit, rollback); }
};

// The fingerprint column of a record read with kSqlSelectRecord.
std::optional<std::string> fingerprint_of(const Query& q);

// What acquire does with the record it read (SPEC §4). Returns Busy or Replay when the
// answer needs no write; otherwise leaves the answer empty and says whether it is a steal.
struct Judgement {
  std::optional<AcquireResult> answer;
  bool stolen = false;
  std::uint32_t attempt = 1;
};

Judgement judge(const Query& q, bool found, Timestamp now);

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
  std::size_t limit = 0;                   // purge
  std::span<const ExtendRequest> extends;  // extend_many

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
  // changes nothing. (A caller's connection prepares this check only when it is needed.)
  if constexpr (requires { c.prepare_completed_by(); }) c.prepare_completed_by();
  Query q(c.conn, c.completed_by);
  return q.bind(1, op.scope).bind(2, op.key).bind(3, tok).step() ? WriteResult::kDone
                                                                 : WriteResult::kFenced;
}

WriteResult release_locked(PooledConnection& c, const WriteOp& op);
ExtendResult extend_locked(PooledConnection& c, std::string_view scope, std::string_view key,
                           Token token, Duration lease, Timestamp now);
std::size_t purge_locked(PooledConnection& c, const WriteOp& op, Timestamp now);
std::size_t forget_locked(PooledConnection& c, const WriteOp& op);

// Runs one queued write. `now` is read per operation (and per extend of an extend_many), as
// if each ran alone.
void run_locked(PooledConnection& c, WriteOp& op, const Clock& clock);

}  // namespace idem::sqlite
