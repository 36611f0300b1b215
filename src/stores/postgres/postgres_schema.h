#pragma once

// The PostgreSQL store's schema and statements, built once per table. Private to the store;
// the benchmark's raw libpq side prepares the same SELECT and reads the same table, so the
// two cannot drift apart.
//
// Time (SPEC §6): every statement reads the server's clock once, as
// date_trunc('milliseconds', statement_timestamp()): the moment the statement arrived, in
// whole milliseconds (SPEC durations have millisecond resolution), the same value wherever
// it appears in one statement. Stored times are whole milliseconds too, so a time read back
// compares with `now` exactly as the server compared it.

#include <string>

#include "idem/types.h"

namespace idem::postgres {

// The version written in the table's comment: "idem records, schema version N".
inline constexpr int kSchemaVersion = 1;
inline constexpr const char* kSchemaCommentPrefix = "idem records, schema version ";

// A validated table name and the objects named after it.
struct TableNames {
  std::string schema;  // lowercase letters, digits, '_'
  std::string name;    // likewise

  // "schema"."name"
  std::string table() const { return quote(schema) + "." + quote(name); }
  // "schema"."name_token_seq": the token sequence (SPEC §2).
  std::string sequence() const { return quote(schema) + "." + quote(name + "_token_seq"); }
  // "name_purge_idx" (an index lives in its table's schema).
  std::string purge_index() const { return quote(name + "_purge_idx"); }
  // schema.name, or name while the schema is not known yet, for messages.
  std::string display() const { return schema.empty() ? name : schema + "." + name; }

  static std::string quote(const std::string& identifier) { return "\"" + identifier + "\""; }
};

// Columns of Sql::select_record, and of Sql::acquire before its last column.
enum Col {
  kColState,           // smallint: 0 IN_PROGRESS, 1 COMPLETE
  kColToken,           // bigint
  kColAttempt,         // integer
  kColAcquiredAt,      // timestamptz, IN_PROGRESS only
  kColLeaseExpiresAt,  // timestamptz, IN_PROGRESS only
  kColCompletedAt,     // timestamptz, COMPLETE only
  kColExpiresAt,       // timestamptz
  kColFingerprint,     // bytea or NULL
  kColPayload,         // bytea, COMPLETE only
  kColNow,             // timestamptz: the statement's reading of the server's clock
  kColOutcome,         // acquire only: 0 the caller took the lease, 1 a live record was found
};

// The 1-based position of the request a row answers, in the *_many statements: the column
// after kColNow (select_many) or after kColOutcome (acquire_many).
inline constexpr int kColSelectPosition = kColOutcome;
inline constexpr int kColAcquirePosition = kColOutcome + 1;

inline constexpr int kStateInProgress = 0;
inline constexpr int kStateComplete = 1;
inline constexpr int kOutcomeWon = 0;
inline constexpr int kOutcomeLive = 1;
// acquire_nowait only: another open transaction holds the key's lock (every column but
// kColNow and kColOutcome is NULL).
inline constexpr int kOutcomeLocked = 2;

// The statements, with the table's names filled in. Parameters are binary: scope and key
// bytea, tokens and durations (milliseconds) int8.
//
// With a notification channel (SPEC §7, postgres_listener.h), complete, complete_many,
// release and forget take one more parameter, the record's stable_record_hash as int8 (an
// int8[] for complete_many), and send pg_notify(channel, to_hex(hash)) for each record they
// changed, in the same statement, so the notification commits with the write.
struct Sql {
  explicit Sql(const TableNames& names, std::string notify_channel = {});

  // The channel the writes notify on; empty: they do not notify.
  std::string channel;

  // $1 scope, $2 key. The whole record and the server's now. Read-only.
  std::string select_record;
  // $1 scope, $2 key, $3 lease ms, $4 ttl ms, $5 fingerprint (NULL: none), $6 the key's
  // advisory lock id. One statement: takes the lease when the record is absent, expired or
  // stealable (outcome 0, the new record), or returns the live record untouched (outcome 1).
  // No row: another caller wrote a live record meanwhile; run it again.
  std::string acquire;
  // acquire for a caller's open transaction that must not wait (SPEC §14): when another
  // transaction holds the key's advisory lock (a one-transaction caller writing the key),
  // one row with outcome kOutcomeLocked instead of waiting for it.
  std::string acquire_nowait;
  // $1 scope, $2 key, $3 token, $4 payload, $5 ttl ms (, $6 hash). Affects one row when
  // done.
  std::string complete;
  // complete without the notification (no $6), for a caller's transaction (SPEC §14): a
  // transaction that notifies takes the server's one lock on the notification queue at its
  // COMMIT and holds it through the commit's flush, so concurrent callers' commits would
  // queue one behind another instead of sharing a flush (issue 36). Their waiters are told
  // after the commit instead (notify).
  std::string complete_quiet;
  // $1 hash: the notification alone, sent on the store's own connection (empty without a
  // channel).
  std::string notify;
  // $1 scope, $2 key, $3 token: a row when the record is COMPLETE by that token.
  std::string completed_by;
  // $1 scope, $2 key, $3 token (, $4 hash). A row when done. Commits with
  // synchronous_commit = off.
  std::string release;
  // $1 scope, $2 key, $3 token, $4 lease ms. Returns the new deadline and now when done.
  // Commits with synchronous_commit = off.
  std::string extend;
  // $1 scopes, $2 keys, $3 tokens, $4 lease ms (arrays). Returns, per extended lease, its
  // 1-based position in the arrays, the new deadline and now. Commits with
  // synchronous_commit = off.
  std::string extend_many;
  // Batches of concurrent callers (postgres_batcher.h), arrays in the order of the requests:
  //  select_many   $1 scopes, $2 keys: the select_record columns and the request's position
  //                for each record found.
  //  acquire_many  $1 scopes, $2 keys, $3 leases, $4 ttls, $5 fingerprints (NULL elements:
  //                none), $6 advisory lock ids: acquire's columns and the position, one row
  //                per request that took its lease or found a live record. The keys' locks
  //                are taken in ascending order, every one before its key's token is drawn.
  //  complete_many $1 scopes, $2 keys, $3 tokens, $4 payloads, $5 ttls (, $6 hashes): the
  //                position of each request that completed its record.
  std::string select_many;
  std::string acquire_many;
  std::string complete_many;
  // $1 limit. One row per record deleted. Commits with synchronous_commit = off.
  std::string purge;
  // $1 scope, $2 key (, $3 hash). Affects one row when a record was deleted.
  std::string forget;

  // Creates the sequence (kept if it exists, so tokens never restart), the table, the
  // purge index and the version comment. Run inside the migration's transaction.
  std::string create_schema;
};

// The settings the store's statements run under, never sent in the startup packet (poolers
// refuse startup parameters they do not know). statement_timeout = the store's timeout and
// lock_timeout = 0: the store's timeout is the one bound of a call. enable_seqscan = off:
// every statement is built for an index, and a prepared plan made while the table was nearly
// empty would otherwise keep a sequential scan as the table grows (STORE-FACTS).
// synchronous_commit = off only with the store's option of that name.
//
// For a connection whose server session is its own: SET statements, run once when it
// connects, and READ COMMITTED as the session's default isolation (read_only: every
// transaction read-only).
std::string session_settings(Duration timeout, bool asynchronous_commit, bool read_only);
// For a connection through a transaction pooler: one SELECT of set_config(..., true) calls,
// sent before each statement in the same transaction, so the settings end with it.
std::string transaction_settings(Duration timeout, bool asynchronous_commit);

// The longest table or schema name the store takes.
inline constexpr std::size_t kMaxNameLength = 48;

// The table option, "name" or "schema.name" (the schema empty when not given), checked to be
// 1 to kMaxNameLength lowercase letters, digits or '_' each, not starting with a digit.
TableNames parse_table(const std::string& table);

// Whether `s` is such a name.
bool valid_identifier(std::string_view s);

}  // namespace idem::postgres
