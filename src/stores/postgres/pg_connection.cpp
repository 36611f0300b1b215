#include "stores/postgres/pg_connection.h"

#include <arpa/inet.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace idem::postgres {
namespace {

// Seconds from the Unix epoch to PostgreSQL's epoch, 2000-01-01 00:00:00 UTC.
constexpr std::int64_t kPostgresEpochMs = 946'684'800'000;

std::string big_endian(std::uint64_t v, int bytes) {
  std::string out(static_cast<std::size_t>(bytes), '\0');
  for (int i = bytes - 1; i >= 0; --i) {
    out[static_cast<std::size_t>(i)] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  return out;
}

std::uint64_t read_big_endian(std::string_view bytes) {
  std::uint64_t v = 0;
  for (char c : bytes) v = (v << 8) | static_cast<unsigned char>(c);
  return v;
}

// libpq's messages end with a newline and may span lines; a reason is one line.
std::string one_line(std::string_view text) {
  std::string out;
  bool space = false;
  for (char c : text) {
    if (c == '\n' || c == '\r' || c == '\t' || c == ' ') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

bool contains(std::string_view text, std::string_view what) {
  return text.find(what) != std::string_view::npos;
}

std::string ms_text(Duration d) { return std::to_string(d.count()) + " ms"; }

}  // namespace

// --- Params ---

void Params::add(std::string value, bool is_null, Oid type) {
  storage_.push_back(std::move(value));
  types_.push_back(type);
  nulls_.push_back(is_null);
  lengths_.push_back(static_cast<int>(storage_.back().size()));
  formats_.push_back(1);
}

Params& Params::bytes(std::string_view v) {
  add(std::string(v), false, kByteaOid);
  return *this;
}

Params& Params::null() {
  add(std::string(), true, kByteaOid);
  return *this;
}

Params& Params::int8(std::int64_t v) {
  add(big_endian(static_cast<std::uint64_t>(v), 8), false, kInt8Oid);
  return *this;
}

namespace {

// The binary array format (array_send): dimensions, a has-null flag, the element type, then
// each element as a length and its bytes.
std::string array_header(Oid element, std::size_t n, bool has_null = false) {
  std::string out;
  out += big_endian(1, 4);  // one dimension
  out += big_endian(has_null ? 1 : 0, 4);
  out += big_endian(element, 4);
  out += big_endian(n, 4);  // its length
  out += big_endian(1, 4);  // its lower bound
  return out;
}

}  // namespace

Params& Params::bytea_array(const std::vector<std::string_view>& v) {
  std::string out = array_header(kByteaOid, v.size());
  for (std::string_view e : v) {
    out += big_endian(e.size(), 4);
    out.append(e);
  }
  add(std::move(out), false, kByteaArrayOid);
  return *this;
}

Params& Params::bytea_array(const std::vector<std::optional<std::string_view>>& v) {
  bool has_null = false;
  for (const auto& e : v) has_null = has_null || !e;
  std::string out = array_header(kByteaOid, v.size(), has_null);
  for (const auto& e : v) {
    if (!e) {
      out += big_endian(0xffffffffu, 4);  // -1: NULL
      continue;
    }
    out += big_endian(e->size(), 4);
    out.append(*e);
  }
  add(std::move(out), false, kByteaArrayOid);
  return *this;
}

Params& Params::int8_array(const std::vector<std::int64_t>& v) {
  std::string out = array_header(kInt8Oid, v.size());
  out.reserve(out.size() + v.size() * 12);
  for (std::int64_t e : v) {
    out += big_endian(8, 4);
    out += big_endian(static_cast<std::uint64_t>(e), 8);
  }
  add(std::move(out), false, kInt8ArrayOid);
  return *this;
}

const char* const* Params::values() const {
  pointers_.clear();
  for (std::size_t i = 0; i < storage_.size(); ++i) {
    pointers_.push_back(nulls_[i] ? nullptr : storage_[i].data());
  }
  return pointers_.data();
}

// --- Result ---

long Result::affected() const {
  if (!r_) return 0;
  const char* n = PQcmdTuples(r_.get());
  return (n != nullptr && *n != '\0') ? std::strtol(n, nullptr, 10) : 0;
}

std::string_view Result::bytes(int row, int col) const {
  return std::string_view(PQgetvalue(r_.get(), row, col),
                          static_cast<std::size_t>(PQgetlength(r_.get(), row, col)));
}

std::int64_t Result::int8(int row, int col) const {
  return static_cast<std::int64_t>(read_big_endian(bytes(row, col)));
}

std::int32_t Result::int4(int row, int col) const {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(read_big_endian(bytes(row, col))));
}

std::int16_t Result::int2(int row, int col) const {
  return static_cast<std::int16_t>(static_cast<std::uint16_t>(read_big_endian(bytes(row, col))));
}

Timestamp Result::time(int row, int col) const {
  const std::int64_t us = int8(row, col);
  // Rounded down, so a deadline read back never moves later than the server's.
  const std::int64_t ms = us >= 0 ? us / 1000 : -((-us + 999) / 1000);
  return Timestamp{Duration{ms + kPostgresEpochMs}};
}

std::string Result::text(int row, int col) const {
  return std::string(PQgetvalue(r_.get(), row, col),
                     static_cast<std::size_t>(PQgetlength(r_.get(), row, col)));
}

// --- reasons ---

std::string connect_failure_reason(std::string_view libpq_message) {
  const std::string m = one_line(libpq_message);
  std::string cause = "cannot connect";
  if (contains(m, "Connection refused")) {
    cause = "connection refused";
  } else if (contains(m, "No such file or directory") && contains(m, "socket")) {
    cause = "connection refused (no server socket there)";
  } else if (contains(m, "authentication failed") || contains(m, "no password supplied") ||
             contains(m, "pg_hba.conf") || (contains(m, "role") && contains(m, "does not exist"))) {
    cause = "authentication failed";
  } else if (contains(m, "database") && contains(m, "does not exist")) {
    cause = "database does not exist";
  } else if (contains(m, "permission denied")) {
    cause = "permission denied";
  } else if (contains(m, "could not translate host name")) {
    cause = "unknown host";
  } else if (contains(m, "timeout expired")) {
    cause = "timed out";
  } else if (contains(m, "starting up") || contains(m, "shutting down") ||
             contains(m, "recovery mode")) {
    cause = "server starting up or shutting down";
  } else if (contains(m, "too many clients") || contains(m, "connection slots")) {
    cause = "too many connections";
  }
  return cause + ": " + m;
}

std::string statement_failure_reason(std::string_view sqlstate, std::string_view message) {
  const std::string state(sqlstate);
  std::string cause = "server error";
  if (state == "57014") {
    cause = "timed out (statement_timeout)";
  } else if (state == "42501") {
    cause = "permission denied";
  } else if (state == "42P01" || state == "42883") {
    cause = "table or sequence missing";
  } else if (state == "3D000") {
    cause = "database does not exist";
  } else if (state == "25006") {
    cause = "read-only transaction";
  } else if (state.rfind("57P", 0) == 0) {
    cause = "server shutting down or restarting";
  } else if (state.rfind("08", 0) == 0) {
    cause = "connection lost";
  } else if (state.rfind("28", 0) == 0) {
    cause = "authentication failed";
  } else if (state.rfind("53", 0) == 0) {
    cause = "server out of resources";
  } else if (state == "40P01") {
    cause = "deadlock";
  } else if (state == "40001") {
    cause = "serialization failure";
  }
  std::string out = cause;
  if (!state.empty()) out += " (SQLSTATE " + state + ")";
  return out + ": " + one_line(message);
}

// --- Connection ---

Connection::Connection(const std::vector<std::pair<std::string, std::string>>& params,
                       std::string store, Duration timeout, Deadline deadline)
    : store_(std::move(store)), timeout_(timeout) {
  std::vector<const char*> keywords;
  std::vector<const char*> values;
  for (const auto& [k, v] : params) {
    keywords.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  keywords.push_back(nullptr);
  values.push_back(nullptr);
  conn_.reset(PQconnectStartParams(keywords.data(), values.data(), /*expand_dbname=*/0));
  if (!conn_) throw StoreUnavailable(store_, "cannot connect: out of memory");
  if (PQstatus(conn_.get()) == CONNECTION_BAD) {
    throw PgError(store_, connect_failure_reason(PQerrorMessage(conn_.get())), "");
  }
  // libpq: poll as if PGRES_POLLING_WRITING had been returned first.
  PostgresPollingStatusType st = PGRES_POLLING_WRITING;
  while (st != PGRES_POLLING_OK) {
    if (st == PGRES_POLLING_FAILED) {
      throw PgError(store_, connect_failure_reason(PQerrorMessage(conn_.get())), "");
    }
    wait_socket(st == PGRES_POLLING_WRITING, deadline, "connecting");
    st = PQconnectPoll(conn_.get());
  }
  // A library prints nothing: the server's notices and warnings (e.g. "terminating
  // connection due to immediate shutdown command") are dropped; failures arrive as errors.
  PQsetNoticeReceiver(conn_.get(), [](void*, const PGresult*) {}, nullptr);
  // Never block in a send: a dead network must not outlast the deadline.
  if (PQsetnonblocking(conn_.get(), 1) != 0) {
    throw PgError(store_, "cannot connect: " + one_line(PQerrorMessage(conn_.get())), "");
  }
}

Connection::~Connection() = default;

bool Connection::usable() const {
  return !broken_ && PQstatus(conn_.get()) == CONNECTION_OK &&
         PQtransactionStatus(conn_.get()) == PQTRANS_IDLE;
}

bool Connection::alive_when_idle() {
  if (!usable()) return false;
  // An idle connection of ours never expects input: anything readable is a termination
  // notice, an end of file or an error. Dropping it is right in every case.
  pollfd p{PQsocket(conn_.get()), POLLIN, 0};
  const int n = ::poll(&p, 1, 0);
  if (n == 0) return true;
  broken_ = true;
  return false;
}

void Connection::fail(const Failure& f) {
  if (f.connection_lost) broken_ = true;
  // An error inside a transaction block, or a lost connection, leaves it unusable.
  if (PQstatus(conn_.get()) != CONNECTION_OK ||
      PQtransactionStatus(conn_.get()) != PQTRANS_IDLE) {
    broken_ = true;
  }
  throw PgError(store_, f.reason, f.sqlstate);
}

void Connection::wait_socket(bool for_write, Deadline deadline, const char* doing) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left <= std::chrono::milliseconds::zero()) {
      broken_ = true;
      throw PgError(store_, std::string("timed out after ") + ms_text(timeout_) + " " + doing,
                    "");
    }
    pollfd p{PQsocket(conn_.get()), static_cast<short>(for_write ? POLLOUT : POLLIN), 0};
    if (p.fd < 0) {
      broken_ = true;
      throw PgError(store_, std::string("connection lost ") + doing, "");
    }
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (n > 0) return;
    if (n < 0 && errno != EINTR) {
      broken_ = true;
      throw PgError(store_, std::string("poll failed ") + doing + ": " + std::strerror(errno), "");
    }
  }
}

Result Connection::finish(Deadline deadline, const char* doing) {
  PGconn* c = conn_.get();
  // Send everything libpq buffered; a full socket buffer needs the reply drained too.
  for (;;) {
    const int f = PQflush(c);
    if (f == 0) break;
    if (f < 0) fail({std::string("connection lost ") + doing + ": " + one_line(PQerrorMessage(c)),
                     "", true});
    wait_socket(/*for_write=*/true, deadline, doing);
    if (!PQconsumeInput(c)) {
      fail({std::string("connection lost ") + doing + ": " + one_line(PQerrorMessage(c)), "",
            true});
    }
  }
  Result last;
  std::string error_state;
  std::string error_message;
  bool failed = false;
  for (;;) {
    while (PQisBusy(c)) {
      wait_socket(/*for_write=*/false, deadline, doing);
      if (!PQconsumeInput(c)) {
        fail({std::string("connection lost ") + doing + ": " + one_line(PQerrorMessage(c)), "",
              true});
      }
    }
    PGresult* r = PQgetResult(c);
    if (r == nullptr) break;
    Result held(r);
    const ExecStatusType status = PQresultStatus(r);
    if (status == PGRES_FATAL_ERROR || status == PGRES_BAD_RESPONSE ||
        status == PGRES_NONFATAL_ERROR) {
      if (!failed) {
        const char* state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        const char* primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
        error_state = state ? state : "";
        error_message = primary ? primary : PQresultErrorMessage(r);
        failed = true;
      }
      continue;
    }
    last = std::move(held);
  }
  if (failed) {
    const bool lost = PQstatus(c) != CONNECTION_OK || error_state.rfind("08", 0) == 0 ||
                      error_state.rfind("57P", 0) == 0;
    fail({statement_failure_reason(error_state, error_message), error_state, lost});
  }
  if (PQstatus(c) != CONNECTION_OK) {
    fail({std::string("connection lost ") + doing + ": " + one_line(PQerrorMessage(c)), "", true});
  }
  return last;
}

void Connection::prepare(const std::string& name, const std::string& sql,
                         const std::vector<Oid>& types, Deadline deadline) {
  if (!PQsendPrepare(conn_.get(), name.c_str(), sql.c_str(), static_cast<int>(types.size()),
                     types.data())) {
    fail({"connection lost preparing a statement: " + one_line(PQerrorMessage(conn_.get())), "",
          true});
  }
  finish(deadline, "preparing a statement");
}

Result Connection::run(const std::string& name, const Params& params, Deadline deadline) {
  if (!PQsendQueryPrepared(conn_.get(), name.c_str(), params.size(), params.values(),
                           params.lengths(), params.formats(), /*resultFormat=*/1)) {
    fail({"connection lost sending a statement: " + one_line(PQerrorMessage(conn_.get())), "",
          true});
  }
  return finish(deadline, "waiting for the server");
}

Result Connection::exec(const std::string& sql, Deadline deadline) {
  if (!PQsendQuery(conn_.get(), sql.c_str())) {
    fail({"connection lost sending a query: " + one_line(PQerrorMessage(conn_.get())), "", true});
  }
  return finish(deadline, "waiting for the server");
}

Result Connection::exec_params(const std::string& sql, const Params& params, Deadline deadline) {
  if (!PQsendQueryParams(conn_.get(), sql.c_str(), params.size(), params.types(),
                         params.values(), params.lengths(), params.formats(),
                         /*resultFormat=*/0)) {
    fail({"connection lost sending a query: " + one_line(PQerrorMessage(conn_.get())), "", true});
  }
  return finish(deadline, "waiting for the server");
}

}  // namespace idem::postgres
