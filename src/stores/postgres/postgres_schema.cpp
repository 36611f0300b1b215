#include "stores/postgres/postgres_schema.h"

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/error.h"

namespace idem::postgres {
namespace {

// Replaces every {name} in `text`.
std::string fill(std::string text,
                 std::initializer_list<std::pair<std::string_view, std::string>> values) {
  for (const auto& [name, value] : values) {
    const std::string marker = "{" + std::string(name) + "}";
    for (std::size_t at = text.find(marker); at != std::string::npos;
         at = text.find(marker, at + value.size())) {
      text.replace(at, marker.size(), value);
    }
  }
  return text;
}

// The server's clock, once per statement, in whole milliseconds (see postgres_schema.h).
constexpr const char* kNow = "date_trunc('milliseconds', statement_timestamp())";
// A duration parameter in milliseconds as an interval.
constexpr const char* kMs = "* interval '1 millisecond'";
// Lets this statement's transaction commit without waiting for its WAL to reach disk: for
// statements whose loss in a server crash is harmless (an extend or release lost only ends
// a lease early, and fencing then refuses its old owner; a lost purge only leaves expired
// records). Evaluated in RETURNING, so only for statements that changed a row.
constexpr const char* kRelaxed = "set_config('synchronous_commit', 'off', true)";

// The upsert's conflict clause, shared by acquire and acquire_many: an existing record is
// taken over only when, by its latest committed version, it is expired (COMPLETE) or its
// lease passed (IN_PROGRESS, a steal: attempt + 1). Otherwise nothing is written.
constexpr const char* kTakeOver = R"sql(  ON CONFLICT (scope, key) DO UPDATE SET
    state = 0, token = excluded.token,
    attempt = CASE WHEN r.state = 0 THEN r.attempt + 1 ELSE 1 END,
    acquired_at = excluded.acquired_at, lease_expires_at = excluded.lease_expires_at,
    completed_at = NULL, expires_at = excluded.expires_at, purge_after = excluded.purge_after,
    fingerprint = excluded.fingerprint, payload = NULL
  WHERE CASE WHEN r.state = 1 THEN r.expires_at <= {now} ELSE r.lease_expires_at <= {now} END)sql";

constexpr const char* kRecordColumns =
    "state, token, attempt, acquired_at, lease_expires_at, completed_at, expires_at, "
    "fingerprint, payload";

// SPEC §4: the record is live, so acquire answers Replay or Busy without writing.
constexpr const char* kLive =
    "CASE WHEN state = 1 THEN expires_at > {now} ELSE lease_expires_at > {now} END";

}  // namespace

Sql::Sql(const TableNames& names, std::string notify_channel) : channel(std::move(notify_channel)) {
  // SPEC §7: the notification for a changed record, as an expression of its hash; the
  // channel is letters, digits and "_.:" only (notify_channel()), so it is quoted as is.
  const auto notify = [&](const std::string& hash) {
    return "pg_notify('" + channel + "', to_hex(" + hash + "))";
  };
  const bool notifying = !channel.empty();

  const std::initializer_list<std::pair<std::string_view, std::string>> common = {
      {"live", kLive},
      {"t", names.table()},
      {"seq", names.sequence()},
      {"now", kNow},
      {"ms", kMs},
      {"relaxed", kRelaxed},
      {"cols", kRecordColumns},
      {"index", names.purge_index()}};
  auto sql = [&](std::string text) {
    // {live} and {take_over} hold {now}, so they are filled first.
    text = fill(std::move(text), {{"live", kLive}, {"take_over", kTakeOver}});
    return fill(std::move(text), common);
  };

  select_record = sql("SELECT {cols}, {now} FROM {t} WHERE scope = $1 AND key = $2");

  // One statement for every acquire (docs/stores/postgres.md, "Round trips" and "Tokens"):
  //  - cur/live read the record from the statement's snapshot; a live one is returned as it
  //    is and nothing below runs: no row lock, no WAL, no transaction id.
  //  - otherwise `turn` takes the key's transaction-scoped advisory lock, and only then
  //    does `drawn` take a token from the sequence: every token of a key is drawn under
  //    that lock, which is held until the write commits, so tokens reach a key in the
  //    order they were drawn, across deletes.
  //  - the upsert writes when the record is absent, or, by its latest committed version,
  //    expired (COMPLETE) or stealable (IN_PROGRESS with a passed lease). If a concurrent
  //    caller made it live after our snapshot, nothing is returned and the caller runs the
  //    statement again.
  // acquire, and acquire_nowait for a caller's open transaction (SPEC §14), whose `turn`
  // tries the key's lock instead of waiting for it and reports a lock held elsewhere.
  constexpr const char* kAcquire = R"sql(
WITH cur AS MATERIALIZED (
  SELECT {cols} FROM {t} WHERE scope = $1 AND key = $2),
live AS MATERIALIZED (
  SELECT * FROM cur WHERE {live}),
turn AS MATERIALIZED (
  SELECT {lock} WHERE NOT EXISTS (SELECT 1 FROM live)),
drawn AS MATERIALIZED (
  SELECT nextval('{seq}') AS token FROM turn{got}),
won AS (
  INSERT INTO {t} AS r (scope, key, state, token, attempt, acquired_at, lease_expires_at,
                        completed_at, expires_at, purge_after, fingerprint, payload)
  SELECT $1, $2, 0, token, 1, {now}, {now} + $3 {ms}, NULL, {now} + $4 {ms},
         {now} + greatest($3, $4) {ms}, $5, NULL
  FROM drawn
{take_over}
  RETURNING r.state, r.token, r.attempt, r.acquired_at, r.lease_expires_at, r.completed_at,
            r.expires_at, r.fingerprint, r.payload)
SELECT {cols}, {now}, 0::smallint FROM won
UNION ALL
SELECT {cols}, {now}, 1::smallint FROM live{locked})sql";
  acquire =
      sql(fill(kAcquire, {{"lock", "pg_advisory_xact_lock($6)"}, {"got", ""}, {"locked", ""}}));
  acquire_nowait = sql(fill(
      kAcquire,
      {{"lock", "pg_try_advisory_xact_lock($6) AS got"}, {"got", " WHERE got"}, {"locked", R"sql(
UNION ALL
SELECT NULL::smallint, NULL::bigint, NULL::integer, NULL::timestamptz, NULL::timestamptz,
       NULL::timestamptz, NULL::timestamptz, NULL::bytea, NULL::bytea, {now}, 2::smallint
FROM turn WHERE NOT got)sql"}}));

  select_many = sql(R"sql(
SELECT t.state, t.token, t.attempt, t.acquired_at, t.lease_expires_at, t.completed_at,
       t.expires_at, t.fingerprint, t.payload, {now}, q.i
FROM unnest($1::bytea[], $2::bytea[]) WITH ORDINALITY AS q(scope, key, i)
JOIN {t} AS t ON t.scope = q.scope AND t.key = q.key)sql");

  // acquire for many keys at once, with the same steps. `queue` holds the requests that
  // found no live record in ascending order of their lock ids, and `turn` takes the locks
  // in that order (a CTE is scanned in the order it was materialized), so two batches never
  // wait for each other's locks in a cycle; `drawn` draws each key's token after its lock.
  acquire_many = sql(R"sql(
WITH req AS MATERIALIZED (
  SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::int8[], $4::int8[], $5::bytea[], $6::int8[])
    WITH ORDINALITY AS q(scope, key, lease, ttl, fingerprint, lock, i)),
cur AS MATERIALIZED (
  SELECT q.i, t.state, t.token, t.attempt, t.acquired_at, t.lease_expires_at, t.completed_at,
         t.expires_at, t.fingerprint, t.payload
  FROM req q JOIN {t} AS t ON t.scope = q.scope AND t.key = q.key),
live AS MATERIALIZED (
  SELECT * FROM cur WHERE {live}),
queue AS MATERIALIZED (
  SELECT * FROM req q WHERE NOT EXISTS (SELECT 1 FROM live WHERE live.i = q.i) ORDER BY lock),
turn AS MATERIALIZED (
  SELECT queue.*, pg_advisory_xact_lock(lock) FROM queue),
drawn AS MATERIALIZED (
  SELECT turn.*, nextval('{seq}') AS token FROM turn),
won AS (
  INSERT INTO {t} AS r (scope, key, state, token, attempt, acquired_at, lease_expires_at,
                        completed_at, expires_at, purge_after, fingerprint, payload)
  SELECT scope, key, 0, token, 1, {now}, {now} + lease {ms}, NULL, {now} + ttl {ms},
         {now} + greatest(lease, ttl) {ms}, fingerprint, NULL
  FROM drawn
{take_over}
  RETURNING r.scope, r.key, r.state, r.token, r.attempt, r.acquired_at, r.lease_expires_at,
            r.completed_at, r.expires_at, r.fingerprint, r.payload)
SELECT w.state, w.token, w.attempt, w.acquired_at, w.lease_expires_at, w.completed_at,
       w.expires_at, w.fingerprint, w.payload, {now}, 0::smallint, q.i
FROM won w JOIN req q ON q.scope = w.scope AND q.key = w.key
UNION ALL
SELECT state, token, attempt, acquired_at, lease_expires_at, completed_at, expires_at,
       fingerprint, payload, {now}, 1::smallint, i
FROM live)sql");

  complete_many = sql(fill(R"sql(
UPDATE {t} AS r SET state = 1, payload = b.payload, completed_at = {now},
                    expires_at = {now} + b.ttl {ms}, purge_after = {now} + b.ttl {ms},
                    acquired_at = NULL, lease_expires_at = NULL
FROM unnest($1::bytea[], $2::bytea[], $3::int8[], $4::bytea[], $5::int8[]{hashes}) WITH ORDINALITY
     AS b(scope, key, token, payload, ttl{hash}, i)
WHERE r.scope = b.scope AND r.key = b.key AND r.token = b.token AND r.state = 0
RETURNING b.i{notify})sql",
                           {{"hashes", notifying ? ", $6::int8[]" : ""},
                            {"hash", notifying ? ", hash" : ""},
                            {"notify", notifying ? ", " + notify("b.hash") : ""}}));

  // SPEC §4: only the lease's token completes an IN_PROGRESS record, whatever its deadline.
  complete_quiet = sql(
      "UPDATE {t} SET state = 1, payload = $4, completed_at = {now}, expires_at = {now} + $5 {ms}, "
      "purge_after = {now} + $5 {ms}, acquired_at = NULL, lease_expires_at = NULL "
      "WHERE scope = $1 AND key = $2 AND token = $3 AND state = 0");
  complete = complete_quiet + (notifying ? " RETURNING " + notify("$6") : std::string());
  if (notifying) this->notify = "SELECT " + notify("$1");

  completed_by =
      sql("SELECT 1 FROM {t} WHERE scope = $1 AND key = $2 AND token = $3 AND state = 1");

  release =
      sql("DELETE FROM {t} WHERE scope = $1 AND key = $2 AND token = $3 AND state = 0 "
          "RETURNING {relaxed}" +
          (notifying ? ", " + notify("$4") : std::string()));

  // SPEC §4: extend does not touch expires_at, but a longer lease can push purge_after out.
  extend =
      sql("UPDATE {t} SET lease_expires_at = {now} + $4 {ms}, "
          "purge_after = greatest(expires_at, {now} + $4 {ms}) "
          "WHERE scope = $1 AND key = $2 AND token = $3 AND state = 0 "
          "RETURNING lease_expires_at, {now}, {relaxed}");

  // The heartbeat's batch in one statement: the arrays are joined to the table through its
  // primary key, so n leases cost one commit, not n.
  extend_many = sql(R"sql(
UPDATE {t} AS r SET lease_expires_at = {now} + b.lease {ms},
                    purge_after = greatest(r.expires_at, {now} + b.lease {ms})
FROM unnest($1::bytea[], $2::bytea[], $3::int8[], $4::int8[]) WITH ORDINALITY
     AS b(scope, key, token, lease, i)
WHERE r.scope = b.scope AND r.key = b.key AND r.token = b.token AND r.state = 0
RETURNING b.i, r.lease_expires_at, {now}, {relaxed})sql");

  // SPEC §4, §8: a bounded batch. The purge index picks candidates, rows another
  // transaction has locked are skipped rather than waited for, and the exact condition is
  // checked again on each locked row before it is deleted.
  purge = sql(R"sql(
DELETE FROM {t} AS r
WHERE r.ctid = ANY (ARRAY(SELECT ctid FROM {t} WHERE purge_after <= {now}
                          LIMIT $1 FOR UPDATE SKIP LOCKED))
  AND r.expires_at <= {now} AND (r.state = 1 OR r.lease_expires_at <= {now})
RETURNING {relaxed})sql");

  forget = sql("DELETE FROM {t} WHERE scope = $1 AND key = $2" +
               (notifying ? " RETURNING " + notify("$3") : std::string()));

  // CACHE 1: every nextval() takes the next value of the one shared counter, so values
  // drawn later are larger, whichever session draws them. The sequence is not owned by the
  // table: dropping the table keeps it, and a table made again continues its tokens.
  create_schema = sql(R"sql(
CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint MINVALUE 1 NO CYCLE CACHE 1;
CREATE TABLE {t} (
  scope            bytea       NOT NULL,
  key              bytea       NOT NULL,
  state            smallint    NOT NULL CHECK (state IN (0, 1)),
  token            bigint      NOT NULL,
  attempt          integer     NOT NULL,
  acquired_at      timestamptz,
  lease_expires_at timestamptz,
  completed_at     timestamptz,
  expires_at       timestamptz NOT NULL,
  purge_after      timestamptz NOT NULL,
  fingerprint      bytea,
  payload          bytea,
  PRIMARY KEY (scope, key));
CREATE INDEX {index} ON {t} (purge_after);
)sql") + "COMMENT ON TABLE " +
                  names.table() + " IS '" + kSchemaCommentPrefix + std::to_string(kSchemaVersion) +
                  "';";
}

namespace {

// (name, value) of the settings both forms share.
std::vector<std::pair<std::string, std::string>> settings(Duration timeout,
                                                          bool asynchronous_commit) {
  std::vector<std::pair<std::string, std::string>> out = {
      {"statement_timeout", std::to_string(timeout.count())},
      {"lock_timeout", "0"},
      {"enable_seqscan", "off"},
  };
  if (asynchronous_commit) out.emplace_back("synchronous_commit", "off");
  return out;
}

}  // namespace

std::string session_settings(Duration timeout, bool asynchronous_commit, bool read_only) {
  auto all = settings(timeout, asynchronous_commit);
  all.emplace_back("default_transaction_isolation", "read committed");
  if (read_only) all.emplace_back("default_transaction_read_only", "on");
  std::string out;
  for (const auto& [name, value] : all) out += "SET " + name + " = '" + value + "'; ";
  return out;
}

std::string transaction_settings(Duration timeout, bool asynchronous_commit) {
  std::string out;
  for (const auto& [name, value] : settings(timeout, asynchronous_commit)) {
    out += (out.empty() ? "SELECT " : ", ") + std::string("set_config('") + name + "', '" + value +
           "', true)";
  }
  return out;
}

bool valid_identifier(std::string_view s) {
  if (s.empty() || s.size() > kMaxNameLength) return false;
  if (s.front() >= '0' && s.front() <= '9') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

TableNames parse_table(const std::string& table) {
  TableNames n;
  const std::size_t dot = table.find('.');
  n.name = dot == std::string::npos ? table : table.substr(dot + 1);
  if (dot != std::string::npos) n.schema = table.substr(0, dot);
  const bool ok =
      valid_identifier(n.name) && (dot == std::string::npos || valid_identifier(n.schema));
  if (!ok) {
    throw InvalidArgument("table", "must be 'name' or 'schema.name', each 1 to " +
                                       std::to_string(kMaxNameLength) +
                                       " lowercase letters, digits or '_' (not starting with a "
                                       "digit), got '" +
                                       table + "'");
  }
  return n;
}

}  // namespace idem::postgres
