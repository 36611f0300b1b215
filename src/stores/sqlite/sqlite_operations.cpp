#include "stores/sqlite/sqlite_operations.h"

namespace idem::sqlite {

std::optional<std::string> fingerprint_of(const Query& q) {
  if (q.column_is_null(kColFingerprint)) return std::nullopt;
  return std::string(q.column_bytes(kColFingerprint));
}

PooledConnection::PooledConnection(const std::string& path, const std::string& store,
                                   Duration busy_timeout, const std::string& synchronous,
                                   OpenMode mode, bool first, bool shared)
    : conn(path, store, busy_timeout, mode) {
  // The first connection checks the file before anything else touches it.
  if (first) prepare_file(conn, mode, shared);
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

}  // namespace idem::sqlite
