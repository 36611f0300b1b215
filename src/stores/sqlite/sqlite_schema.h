#pragma once

// The statements the SQLite store prepares on every connection. Private to the store; the
// benchmark's raw SQLite side prepares these very strings, so the two cannot drift apart.
// Parameters: ?1 scope, ?2 key (BLOBs); times are ms since the epoch by the store's clock.

namespace idem::sqlite {

inline constexpr const char* kSqlSelectRecord =
    "SELECT state, token, attempt, acquired_at, lease_expires_at, completed_at, expires_at, "
    "fingerprint, payload FROM idem_records WHERE scope = ?1 AND key = ?2";

// SPEC §2: the token comes from one counter in the file, incremented in the same write
// transaction as the record, so it is unique in the file and only grows, across release,
// purge, forget, processes and restarts.
inline constexpr const char* kSqlNextToken =
    "UPDATE idem_meta SET last_token = last_token + 1 WHERE id = 1 RETURNING last_token";

inline constexpr const char* kSqlWriteLease =
    "INSERT INTO idem_records (scope, key, state, token, attempt, acquired_at, "
    "lease_expires_at, completed_at, expires_at, purge_after, fingerprint, payload) "
    "VALUES (?1, ?2, 0, ?3, ?4, ?5, ?6, 0, ?7, max(?6, ?7), ?8, NULL) "
    "ON CONFLICT (scope, key) DO UPDATE SET state = 0, token = excluded.token, "
    "attempt = excluded.attempt, acquired_at = excluded.acquired_at, "
    "lease_expires_at = excluded.lease_expires_at, completed_at = 0, "
    "expires_at = excluded.expires_at, purge_after = excluded.purge_after, "
    "fingerprint = excluded.fingerprint, payload = NULL";

inline constexpr const char* kSqlComplete =
    "UPDATE idem_records SET state = 1, payload = ?4, completed_at = ?5, expires_at = ?6, "
    "purge_after = ?6, acquired_at = 0, lease_expires_at = 0 "
    "WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 0";

inline constexpr const char* kSqlCompletedBy =
    "SELECT 1 FROM idem_records WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 1";

inline constexpr const char* kSqlRelease =
    "DELETE FROM idem_records WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 0";

// SPEC §4: extend does not touch expires_at, but a longer lease can push purge_after out.
inline constexpr const char* kSqlExtend =
    "UPDATE idem_records SET lease_expires_at = ?4, purge_after = max(expires_at, ?4) "
    "WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 0";

// SPEC §4: the index finds candidates; the precise purge condition is checked again on each.
inline constexpr const char* kSqlPurge =
    "DELETE FROM idem_records WHERE rowid IN "
    "(SELECT rowid FROM idem_records WHERE purge_after <= ?1 LIMIT ?2) "
    "AND expires_at <= ?1 AND (state = 1 OR lease_expires_at <= ?1)";

inline constexpr const char* kSqlForget = "DELETE FROM idem_records WHERE scope = ?1 AND key = ?2";

}  // namespace idem::sqlite
