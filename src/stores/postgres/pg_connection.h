#pragma once

// Thin RAII over libpq for the PostgreSQL store: one connection, binary parameters and
// results, and every network wait bounded by a deadline. Private to the store (and its
// benchmark and tests); the public header never includes libpq-fe.h.
//
// Every failure becomes idem::StoreUnavailable through one choke point (fail()), naming the
// store (its description, never a password) and the cause: refused, authentication failed,
// database missing, permission denied, timed out, server shutting down, ...

#include <libpq-fe.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/error.h"
#include "idem/types.h"

namespace idem::postgres {

using SteadyClock = std::chrono::steady_clock;
using Deadline = SteadyClock::time_point;

// Type OIDs of the parameters we bind (pg_type.dat).
inline constexpr Oid kInt8Oid = 20;
inline constexpr Oid kByteaOid = 17;
inline constexpr Oid kInt8ArrayOid = 1016;
inline constexpr Oid kByteaArrayOid = 1001;

// Parameters in binary format. Values are copied into owned storage, so a Params outlives
// the views it was built from only as long as it is not moved from.
class Params {
 public:
  Params& bytes(std::string_view v);
  Params& null();
  Params& int8(std::int64_t v);
  // A one-dimensional bytea[] or int8[] in the server's binary array format.
  Params& bytea_array(const std::vector<std::string_view>& v);
  // A bytea[] whose empty elements are NULL.
  Params& bytea_array(const std::vector<std::optional<std::string_view>>& v);
  Params& int8_array(const std::vector<std::int64_t>& v);

  int size() const { return static_cast<int>(lengths_.size()); }
  const Oid* types() const { return types_.data(); }
  // Valid until the next call that adds a parameter.
  const char* const* values() const;
  const int* lengths() const { return lengths_.data(); }
  const int* formats() const { return formats_.data(); }

 private:
  void add(std::string value, bool is_null, Oid type);
  std::vector<std::string> storage_;
  std::vector<Oid> types_;
  std::vector<bool> nulls_;
  std::vector<int> lengths_;
  std::vector<int> formats_;
  mutable std::vector<const char*> pointers_;
};

// A query's result. Binary-format accessors for prepared statements; text() for the few
// simple queries (schema checks) that return text.
class Result {
 public:
  Result() = default;
  explicit Result(PGresult* r) : r_(r) {}
  int rows() const { return r_ ? PQntuples(r_.get()) : 0; }
  // Rows changed by an INSERT, UPDATE or DELETE.
  long affected() const;
  bool is_null(int row, int col) const { return PQgetisnull(r_.get(), row, col) != 0; }
  std::string_view bytes(int row, int col) const;
  std::int64_t int8(int row, int col) const;
  std::int32_t int4(int row, int col) const;
  std::int16_t int2(int row, int col) const;
  // A timestamptz in milliseconds since the Unix epoch (rounded down).
  Timestamp time(int row, int col) const;
  std::string text(int row, int col) const;

 private:
  struct Clear {
    void operator()(PGresult* r) const { PQclear(r); }
  };
  std::unique_ptr<PGresult, Clear> r_;
};

// What a failed call knew, before it became a StoreUnavailable.
struct Failure {
  std::string reason;    // "connection refused: ...", "timed out after 5000 ms", ...
  std::string sqlstate;  // empty when the server sent none
  bool connection_lost = false;
};

// The StoreUnavailable a connection throws, with the SQLSTATE kept for the store's own
// retry decisions (a deadlock or serialization failure was rolled back: safe to repeat).
class PgError : public StoreUnavailable {
 public:
  PgError(std::string store, std::string reason, std::string sqlstate)
      : StoreUnavailable(std::move(store), std::move(reason)), sqlstate_(std::move(sqlstate)) {}
  const std::string& sqlstate() const noexcept { return sqlstate_; }
  // 40001 serialization failure, 40P01 deadlock: the statement had no effect.
  bool rolled_back_conflict() const noexcept {
    return sqlstate_ == "40001" || sqlstate_ == "40P01";
  }

 private:
  std::string sqlstate_;
};

// One server connection. Not thread-safe: the pool lends it to one thread at a time.
class Connection {
 public:
  // Connects without blocking past `deadline`. `params` are libpq's connection keywords
  // and values; `timeout` only names the bound in messages. Throws StoreUnavailable naming
  // `store` and the cause.
  Connection(const std::vector<std::pair<std::string, std::string>>& params, std::string store,
             Duration timeout, Deadline deadline);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // False once the connection is known to be unusable; the pool then drops it.
  bool usable() const;
  // For a connection that sat idle: false when the server closed it or sent something
  // unasked (a restart or an administrator's termination). Costs one poll(), no round trip.
  bool alive_when_idle();

  // Prepares `sql` as statement `name`.
  void prepare(const std::string& name, const std::string& sql, const std::vector<Oid>& types,
               Deadline deadline);
  // Runs a prepared statement with binary parameters and results.
  Result run(const std::string& name, const Params& params, Deadline deadline);
  // Runs one or more statements as text (schema checks and creation).
  Result exec(const std::string& sql, Deadline deadline);
  // exec with binary parameters and text results (schema checks).
  Result exec_params(const std::string& sql, const Params& params, Deadline deadline);

  const std::string& store() const { return store_; }
  // Throws StoreUnavailable naming the store, and marks the connection unusable when the
  // failure left it in an unknown state.
  [[noreturn]] void fail(const Failure& f);

  PGconn* raw() const { return conn_.get(); }

 private:
  // Waits until the socket is readable (or writable) or the deadline passes.
  void wait_socket(bool for_write, Deadline deadline, const char* doing);
  // Sends what libpq buffered, then collects the results of one query.
  Result finish(Deadline deadline, const char* doing);

  struct Finish {
    void operator()(PGconn* c) const { PQfinish(c); }
  };
  std::unique_ptr<PGconn, Finish> conn_;
  std::string store_;
  Duration timeout_;
  bool broken_ = false;
};

// The cause of a failed connection attempt, from libpq's message: "connection refused",
// "authentication failed", "database does not exist", ... followed by libpq's own words.
std::string connect_failure_reason(std::string_view libpq_message);

// The cause of a failed statement from its SQLSTATE and message.
std::string statement_failure_reason(std::string_view sqlstate, std::string_view message);

}  // namespace idem::postgres
