#pragma once

// The PostgreSQL store's operations: the statements it runs, each named by a hash of its
// text, the rows they return, and the requests its batchers group (postgres_batcher.h).
// Private to the store.

#include <libpq-fe.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/store.h"
#include "idem/stores/postgres_store.h"
#include "stores/postgres/postgres_batcher.h"
#include "stores/postgres/postgres_connection.h"
#include "stores/postgres/postgres_schema.h"

namespace idem::postgres {

// FNV-1a, 64 bits: stable across processes, machines and builds, which std::hash is not.
// Advisory lock ids only need to spread keys; two keys sharing an id merely take turns.
class Fnv1a {
 public:
  Fnv1a& add(std::string_view bytes) {
    for (char c : bytes) {
      h_ ^= static_cast<unsigned char>(c);
      h_ *= 0x100000001b3ULL;
    }
    return *this;
  }
  Fnv1a& add_length(std::size_t n) {
    const char bytes[4] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                           static_cast<char>(n >> 8), static_cast<char>(n)};
    return add(std::string_view(bytes, 4));
  }
  std::int64_t value() const { return static_cast<std::int64_t>(h_); }

 private:
  std::uint64_t h_ = 0xcbf29ce484222325ULL;
};

// One record as a statement returned it (select_record's columns, and acquire's outcome).
struct Row {
  int state = 0;
  Token token = 0;
  std::uint32_t attempt = 0;
  Timestamp acquired_at{};
  Timestamp lease_expires_at{};
  Timestamp completed_at{};
  Timestamp expires_at{};
  std::optional<std::string> fingerprint;
  std::string payload;
  Timestamp now{};
  int outcome = -1;  // acquire only
};

// A row of select_record's columns (and acquire's outcome, `with_outcome`).
Row row_of(const Result& r, int row, bool with_outcome);

// SPEC §4: a live record (COMPLETE and not expired, or IN_PROGRESS with a live lease)
// answers acquire without a write. nullopt when the record is not live.
std::optional<AcquireResult> live_answer(Row& r);

// The record a request is about, as one string: two requests for one record never share a
// batch.
std::string record_id(std::string_view scope, std::string_view key);

struct ReadRequest {
  std::string_view scope;
  std::string_view key;
  std::string id;
};

struct AcquireRequest {
  std::string_view scope;
  std::string_view key;
  Duration lease;
  Duration ttl;
  std::optional<std::string_view> fingerprint;
  std::int64_t lock;
  std::string id;
};

struct CompleteRequest {
  std::string_view scope;
  std::string_view key;
  Token token;
  std::string_view payload;
  Duration ttl;
  std::string id;
};

// nullopt: no record (reads), or a lost race to run again (acquires).
using ReadBatcher = Batcher<ReadRequest, std::optional<Row>>;
using AcquireBatcher = Batcher<AcquireRequest, std::optional<Row>>;
using CompleteBatcher = Batcher<CompleteRequest, bool>;

template <typename R>
std::string_view id_of(const R& r) {
  return r.id;
}

// The store's statements, each named by a hash of its text, and the ones that carry its
// settings into a transaction when no server session is its own.
struct Statements {
  Statements(const Sql& sql, const std::string& table, const PostgresStoreOptions& o)
      : select_record(table, sql.select_record, {kBytea, kBytea}),
        acquire(table, sql.acquire, {kBytea, kBytea, kInt8, kInt8, kBytea, kInt8}),
        complete(table, sql.complete, with_hash(sql, {kBytea, kBytea, kInt8, kBytea, kInt8})),
        complete_quiet(table, sql.complete_quiet, {kBytea, kBytea, kInt8, kBytea, kInt8}),
        notify(table, sql.notify.empty() ? "SELECT 1" : sql.notify,
               sql.notify.empty() ? std::vector<Oid>{} : std::vector<Oid>{kInt8}),
        completed_by(table, sql.completed_by, {kBytea, kBytea, kInt8}),
        release(table, sql.release, with_hash(sql, {kBytea, kBytea, kInt8})),
        extend(table, sql.extend, {kBytea, kBytea, kInt8, kInt8}),
        extend_many(table, sql.extend_many, {kByteas, kByteas, kInt8s, kInt8s}),
        purge(table, sql.purge, {kInt8}),
        forget(table, sql.forget, with_hash(sql, {kBytea, kBytea})),
        select_many(table, sql.select_many, {kByteas, kByteas}),
        acquire_many(table, sql.acquire_many, {kByteas, kByteas, kInt8s, kInt8s, kByteas, kInt8s}),
        complete_many(table, sql.complete_many,
                      with_hash(sql, {kByteas, kByteas, kInt8s, kByteas, kInt8s}, kInt8s)),
        begin(table, std::string("BEGIN ISOLATION LEVEL READ COMMITTED") +
                         (o.read_only ? " READ ONLY" : "")),
        commit(table, "COMMIT"),
        settings(table, transaction_settings(o.timeout, o.asynchronous_commit)),
        acquire_nowait(table, sql.acquire_nowait, {kBytea, kBytea, kInt8, kInt8, kBytea, kInt8}) {}

  // The types of a statement that notifies when the store does (Sql): one more, the hash.
  static std::vector<Oid> with_hash(const Sql& sql, std::vector<Oid> types, Oid hash = kInt8) {
    if (!sql.channel.empty()) types.push_back(hash);
    return types;
  }

  static constexpr Oid kBytea = kByteaOid;
  static constexpr Oid kInt8 = kInt8Oid;
  static constexpr Oid kByteas = kByteaArrayOid;
  static constexpr Oid kInt8s = kInt8ArrayOid;
  Statement select_record, acquire, complete, complete_quiet, notify, completed_by, release, extend,
      extend_many, purge, forget, select_many, acquire_many, complete_many;
  Statement begin, commit, settings;
  // Only on a caller's connection (SPEC §14).
  Statement acquire_nowait;
};

}  // namespace idem::postgres
