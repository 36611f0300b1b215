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
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
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

// A query's result. Binary-format accessors for the store's statements; text() for the few
// simple queries (settings and schema checks) that return text.
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
  PGresult* raw() const noexcept { return r_.get(); }

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
  // The call provably had no effect: its messages never left (the send failed), or the
  // server ended an idle session before it read them. Safe to repeat on another connection.
  bool not_executed = false;
};

// The StoreUnavailable a connection throws, with what the store's retries need: the
// SQLSTATE (a deadlock or serialization failure was rolled back: safe to repeat), whether
// the call is known to have had no effect, and whether the connection was lost (a call
// that has no effect, or whose effect the store can settle, may then run again on another).
class PgError : public StoreUnavailable {
 public:
  PgError(std::string store, std::string reason, std::string sqlstate, bool not_executed = false,
          bool connection_lost = false)
      : StoreUnavailable(std::move(store), std::move(reason)),
        sqlstate_(std::move(sqlstate)),
        not_executed_(not_executed),
        connection_lost_(connection_lost || not_executed) {}
  const std::string& sqlstate() const noexcept { return sqlstate_; }
  // 40001 serialization failure, 40P01 deadlock: the transaction was rolled back.
  bool rolled_back_conflict() const noexcept {
    return sqlstate_ == "40001" || sqlstate_ == "40P01";
  }
  // The statement never reached the server, or the server ended the session before it ran
  // (Failure::not_executed).
  bool not_executed() const noexcept { return not_executed_; }
  // The connection ended under the call, however that showed (a send that failed, an end
  // of file or a reset while the answer was awaited, a FATAL error or a connection-class
  // SQLSTATE): the call may or may not have taken effect unless not_executed(). Never set
  // for a call that timed out, whose statement may still be running.
  bool connection_lost() const noexcept { return connection_lost_; }

 private:
  std::string sqlstate_;
  bool not_executed_;
  bool connection_lost_;
};

// One of the store's statements. Its name is a hash of its table and its exact text (and
// parameter types), so that a name means one statement on every server session: behind a
// transaction pooler, where a name prepared by one client is seen by the next client of the
// same server connection, two stores on different tables can never run each other's
// statements, and a name that exists already is the same statement.
struct Statement {
  Statement(std::string_view table, std::string sql, std::vector<Oid> types = {});
  std::string name;  // "idem_" and 16 hex digits
  std::string sql;
  std::vector<Oid> types;
};

// One statement of a pipeline and its parameters (null: none).
struct Step {
  const Statement* statement;
  const Params* params = nullptr;
};

// Whether a pooler answers the connection in the server's place (docs/stores/postgres.md,
// "Deploying"): known once the store has compared libpq's backend pid with the server's.
enum class Pooler { kUnknown, kNone, kPresent };

// How a connection sends the store's statements.
struct SessionUse {
  // true: the server session is this connection's for its life (a direct connection or a
  // session pooler), so a statement it prepared stays prepared. false: consecutive
  // transactions may run on different server sessions (a transaction pooler), so no
  // prepared statement is taken for granted; one found missing (26000) is prepared again.
  bool own_session = true;
  // true: named statements (prepared once per server session); false: every statement is
  // sent with its text (parsed and planned by the server on every call).
  bool named = true;
  Pooler pooler = Pooler::kUnknown;
  // The store's pool_size, for the message of a connection that never got a reply.
  std::size_t pool_size = 0;
};

// One server connection. Not thread-safe: the pool lends it to one thread at a time.
class Connection {
 public:
  // Connects without blocking past `deadline`. `params` are libpq's connection keywords
  // and values; `timeout` only names the bound in messages. Throws StoreUnavailable naming
  // `store` and the cause.
  Connection(const std::vector<std::pair<std::string, std::string>>& params, std::string store,
             Duration timeout, SessionUse use, Deadline deadline);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // How the store sends statements on it, once it knows what answers (the first
  // connection is made before it does).
  void set_use(SessionUse use) { use_ = use; }

  // False once the connection is known to be unusable; the pool then drops it.
  bool usable() const;
  // For a connection that sat idle: false when the server closed it or sent something
  // unasked (a restart or an administrator's termination). Costs one poll(), no round trip.
  bool alive_when_idle();

  // Runs `steps` as one pipeline, in one round trip, and returns the result of step
  // `result_of`. Parameters and results are binary. A named statement is bound by its name
  // (and parsed first, in the same round trip, where this session is not known to have it);
  // when a server session lacks it (26000) or has it already (42P05), the pipeline, which
  // then did nothing, is sent again. A transaction the failure left open is rolled back.
  // `probe_delivery` (for statements that write): on TCP, a connection lost with none of
  // the call's bytes acknowledged by the peer, sent as one segment at most, is known not to
  // have run (PgError::not_executed), at the cost of a getsockopt() per call (delivered()).
  Result run(const std::vector<Step>& steps, std::size_t result_of, Deadline deadline,
             bool probe_delivery = false);
  // Runs one or more statements as text (settings, schema checks and creation).
  Result exec(const std::string& sql, Deadline deadline);

  // The backend pid libpq was told at startup (a pooler makes one up).
  int startup_pid() const { return PQbackendPID(conn_.get()); }
  // PQserverVersion: 150004 for 15.4; 0 when unknown.
  int server_version() const { return PQserverVersion(conn_.get()); }
  const std::string& store() const { return store_; }
  // Throws StoreUnavailable naming the store, and marks the connection unusable when the
  // failure left it in an unknown state.
  [[noreturn]] void fail(const Failure& f);

 private:
  // Waits until the socket is readable (or writable) or the deadline passes.
  void wait_socket(bool for_write, Deadline deadline, const char* doing);
  // The reason of a call that timed out: what the silence means on this connection.
  std::string timeout_reason(const char* doing) const;
  // Sends what libpq buffered; false when the send failed.
  bool flush(Deadline deadline, const char* doing);
  // Collects the results of one simple query (exec).
  Result finish(Deadline deadline, const char* doing);
  // One attempt at a pipeline; `parse` says which steps are parsed first.
  struct Attempt;
  Attempt attempt(const std::vector<Step>& steps, const std::vector<bool>& parse,
                  std::size_t result_of, bool named, Deadline deadline, bool probe_delivery);
  // What the peer acknowledged of what this connection sent, and the data segments it sent
  // (Linux's TCP_INFO); nothing on a socket that is not TCP. libpq (14 and later) reports a
  // send that failed (EPIPE, ECONNRESET) as done and the failure at the next read, as it
  // reports an end of file after the statement ran; the peer's acknowledgement tells them
  // apart: bytes it never acknowledged, in one segment, were never read by the server (a
  // process that read them and ended would have acknowledged them with its FIN, its answer
  // or its error).
  struct Delivery {
    std::uint64_t acked = 0;
    std::uint32_t segments = 0;
  };
  std::optional<Delivery> delivered() const;
  // After a failed pipeline: ends an aborted transaction so the connection can be reused.
  void roll_back(Deadline deadline);

  struct Finish {
    void operator()(PGconn* c) const { PQfinish(c); }
  };
  // A descriptor of our own for the connection's TCP socket (-1: not TCP), for delivered():
  // libpq closes its own when it reads an end of file. Declared before conn_ so that it is
  // closed after libpq's (the socket is closed by the last).
  struct Fd {
    int fd = -1;
    Fd() = default;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd();
  };
  Fd probe_;
  std::unique_ptr<PGconn, Finish> conn_;
  std::string store_;
  Duration timeout_;
  SessionUse use_;
  bool broken_ = false;
  bool answered_ = false;         // the server has answered something on this connection
  bool cancel_on_close_ = false;  // a statement may still run on the server: cancel it
  std::unordered_set<std::string> prepared_;  // names this session has (own_session only)
};

// Runs one statement, binary parameters and results, on a caller's connection (SPEC §14):
// blocking, under the caller's own timeouts, inside whatever transaction it has open.
// `sql` null with params null runs `text` as a simple query. Throws PgError naming `store`
// (not_executed is never claimed: the caller's transaction decides what survives).
Result run_on_caller(PGconn* conn, const std::string& text, const Params* params,
                     const std::vector<Oid>& types, const std::string& store);

// The cause of a failed connection attempt, from libpq's message: "connection refused",
// "authentication failed", "database does not exist", ... followed by libpq's own words.
std::string connect_failure_reason(std::string_view libpq_message);

// The cause of a failed statement from its SQLSTATE and message.
std::string statement_failure_reason(std::string_view sqlstate, std::string_view message);

}  // namespace idem::postgres
