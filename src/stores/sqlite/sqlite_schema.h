#pragma once

// The SQLite store's layout: the schema, the marks of an idem file, and the statements the
// store prepares on every connection. Private to the store; the benchmark's raw SQLite side
// prepares these very strings, so the two cannot drift apart. Parameters: ?1 scope, ?2 key
// (BLOBs); times are ms since the epoch by the store's clock.

#include <cstdint>

namespace idem::sqlite {

class Connection;
enum class OpenMode;

// PRAGMA application_id marks the file as ours ("idem" in ASCII); PRAGMA user_version is the
// schema version. A file with another application id, or with tables but no id, is not an
// idem database and is never touched.
inline constexpr std::int64_t kApplicationId = 0x6964656d;
inline constexpr std::int64_t kSchemaVersion = 1;

// Times are milliseconds since the epoch by the store's clock. purge_after is the moment
// the record becomes purgeable (SPEC §4): expires_at for a COMPLETE record and
// max(expires_at, lease_expires_at) for an IN_PROGRESS one; every write keeps it so, and
// the purge index makes a bounded purge batch cheap.
inline constexpr const char* kSqlSchema = R"sql(
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
inline constexpr const char* kSqlMarkFile = R"sql(
PRAGMA application_id = 1768187245;
PRAGMA user_version = 1;
)sql";

inline constexpr int kComplete = 1;

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

// Checks the file is ours (or empty), switches it to WAL and creates the schema when
// missing. A foreign or newer file is refused before anything is written to it; so is an
// empty one when the store may not create its schema, and a read-only store writes
// nothing at all. The first connection of a store runs it before anything else.
void prepare_file(Connection& conn, OpenMode open_mode, bool shared);

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
