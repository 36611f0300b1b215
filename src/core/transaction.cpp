#include "idem/transaction.h"

#include <string>

#include "idem/error.h"
#include "idem/store.h"

namespace idem {

SqlConnection SqlConnection::postgres(PGconn* conn) {
  if (conn == nullptr) throw InvalidArgument("connection", "must not be null (a PGconn*)");
  return SqlConnection(Kind::kPostgres, conn, nullptr);
}

SqlConnection SqlConnection::sqlite(sqlite3* db) {
  if (db == nullptr) throw InvalidArgument("connection", "must not be null (a sqlite3*)");
  return SqlConnection(Kind::kSqlite, nullptr, db);
}

void TransactionalStore::check_kind(const SqlConnection& conn) const {
  if (conn.kind() == connection_kind()) return;
  throw InvalidArgument("connection", std::string("is a ") + conn.kind_name() +
                                          " connection, and the store " + describe() +
                                          " keeps its records elsewhere");
}

WriteResult TransactionalStore::complete_in(const SqlConnection& conn, std::string_view scope,
                                            std::string_view key, Token token,
                                            std::string_view payload, Duration ttl) {
  validate_scope(scope);
  validate_key(key);
  validate_payload_size(payload.size(), kMaxPayloadBytes);
  validate_duration("ttl", ttl);
  check_connection(conn, ConnectionUse::kJoin);
  return do_complete_in(conn, scope, key, token, payload, ttl);
}

AcquireResult TransactionalStore::acquire_in(const SqlConnection& conn, std::string_view scope,
                                             std::string_view key, Duration lease, Duration ttl,
                                             std::optional<std::string_view> fingerprint,
                                             bool nowait) {
  validate_scope(scope);
  validate_key(key);
  validate_duration("lease duration", lease);
  validate_duration("ttl", ttl);
  check_connection(conn, ConnectionUse::kJoin);
  return do_acquire_in(conn, scope, key, lease, ttl, fingerprint, nowait);
}

void TransactionalStore::check_connection(const SqlConnection& conn, ConnectionUse use) {
  check_kind(conn);
  do_check_connection(conn, use);
}

bool TransactionalStore::outside_transaction(const SqlConnection& conn) const noexcept {
  return conn.kind() == connection_kind() && do_outside_transaction(conn);
}

void TransactionalStore::begin(const SqlConnection& conn) {
  check_connection(conn, ConnectionUse::kBegin);
  do_begin(conn);
}

void TransactionalStore::commit(const SqlConnection& conn) {
  check_kind(conn);
  do_commit(conn);
}

void TransactionalStore::rollback(const SqlConnection& conn) noexcept {
  if (conn.kind() != connection_kind()) return;
  do_rollback(conn);
}

}  // namespace idem
