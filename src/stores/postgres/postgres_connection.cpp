#include "stores/postgres/postgres_connection.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/tcp.h>  // struct tcp_info with tcpi_bytes_acked (glibc's lacks it)
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

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

// --- Statement ---

Statement::Statement(std::string_view table, std::string text, std::vector<Oid> parameter_types)
    : sql(std::move(text)), types(std::move(parameter_types)) {
  // FNV-1a, 64 bits: the same name in every process and build that has the same text.
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto add = [&h](std::string_view bytes) {
    for (char c : bytes) {
      h ^= static_cast<unsigned char>(c);
      h *= 0x100000001b3ULL;
    }
  };
  add(table);
  add(std::string_view("\0", 1));
  add(sql);
  for (Oid t : types) add(big_endian(t, 4));
  static constexpr char kHex[] = "0123456789abcdef";
  name = "idem_";
  for (int shift = 60; shift >= 0; shift -= 4) name += kHex[(h >> shift) & 0xf];
}

// --- Connection ---

namespace {

// The server ended an idle session before it read what was sent: PostgreSQL's
// idle_session_timeout, or PgBouncer's client_idle_timeout (SQLSTATE 08P01 and the
// setting's name). Either is only ever sent to an idle session, so nothing of the call ran.
bool ended_while_idle(std::string_view sqlstate, std::string_view message) {
  return sqlstate == "57P05" || (sqlstate == "08P01" && message == "client_idle_timeout");
}

// Parameter bytes above which libpq may start sending a pipeline before it is complete
// (its output buffer flushes at 8 KiB), so a failed send no longer proves that nothing
// arrived.
constexpr std::size_t kSmallPipeline = 4096;

// How long a call past its deadline waits, at most, for the cancel of its statement to
// reach the server.
constexpr std::chrono::milliseconds kCancelWait{500};

}  // namespace

Connection::Connection(const std::vector<std::pair<std::string, std::string>>& params,
                       std::string store, Duration timeout, SessionUse use, Deadline deadline)
    : store_(std::move(store)), timeout_(timeout), use_(use) {
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
  PQsetNoticeReceiver(
      conn_.get(), [](void*, const PGresult*) {}, nullptr);
  // Never block in a send: a dead network must not outlast the deadline.
  if (PQsetnonblocking(conn_.get(), 1) != 0) {
    throw PgError(store_, "cannot connect: " + one_line(PQerrorMessage(conn_.get())), "");
  }
  probe_.fd = ::fcntl(PQsocket(conn_.get()), F_DUPFD_CLOEXEC, 0);
  if (probe_.fd >= 0 && !delivered()) {
    ::close(probe_.fd);  // a unix socket
    probe_.fd = -1;
  }
}

Connection::Fd::~Fd() {
  if (fd >= 0) ::close(fd);
}

std::optional<Connection::Delivery> Connection::delivered() const {
  if (probe_.fd < 0) return std::nullopt;
  tcp_info info{};
  socklen_t len = sizeof info;
  if (::getsockopt(probe_.fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_data_segs_out) + sizeof info.tcpi_data_segs_out) {
    return std::nullopt;
  }
  return Delivery{info.tcpi_bytes_acked, info.tcpi_data_segs_out};
}

Connection::~Connection() {
  if (!cancel_on_close_ || !conn_) return;
  // A statement that outlived its deadline may still run on the server (waiting for a lock,
  // say), and would commit if what it waits for went away: have the server cancel it
  // before the call returns, since the caller may release that at once; then close.
  // PQcancel (which reaches the right server session through PgBouncer too) connects and
  // may block on a dead network, so a thread of its own sends it, and the call waits for it
  // at most kCancelWait.
  struct Sent {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto sent = std::make_shared<Sent>();
  PGconn* c = conn_.release();
  try {
    std::thread([c, sent] {
      if (PGcancel* cancel = PQgetCancel(c)) {
        char error[256];
        (void)PQcancel(cancel, error, sizeof error);  // returns once the server took it
        PQfreeCancel(cancel);
      }
      {
        std::lock_guard lock(sent->mu);
        sent->done = true;
      }
      sent->cv.notify_all();
      PQfinish(c);
    }).detach();
  } catch (...) {
    PQfinish(c);  // no thread to spare: close without cancelling
    return;
  }
  std::unique_lock lock(sent->mu);
  sent->cv.wait_for(lock, kCancelWait, [&] { return sent->done; });
}

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
  if (PQstatus(conn_.get()) != CONNECTION_OK || PQtransactionStatus(conn_.get()) != PQTRANS_IDLE) {
    broken_ = true;
  }
  throw PgError(store_, f.reason, f.sqlstate, f.not_executed, f.connection_lost);
}

std::string Connection::timeout_reason(const char* doing) const {
  std::string out = std::string("timed out after ") + ms_text(timeout_) + " " + doing;
  const std::string sizing = "(docs/stores/postgres.md, \"Sizing a pooler\")";
  const std::string pool = "pool_size=" + std::to_string(use_.pool_size);
  if (!answered_) {
    switch (use_.pooler) {
      case Pooler::kPresent:
        return "timed out after " + ms_text(timeout_) +
               " waiting for a server connection: the pooler in front of PostgreSQL gave this "
               "new connection none in time (its first statement got no reply); in session "
               "pooling each of idem's connections keeps a server connection for its life, so "
               "the pooler's pool for this database and user must be at least " +
               pool + " times the processes that share it " + sizing;
      case Pooler::kUnknown:
        return out +
               ": a new connection got no reply at all to its first statement; if a "
               "pooler (PgBouncer) sits in front of PostgreSQL, this is the wait for a "
               "server connection, and the pooler's pool for this database and user must "
               "be at least " +
               pool + " times the processes that share it " + sizing +
               "; otherwise the server is not answering";
      case Pooler::kNone:
        return out +
               ": a new connection got no reply at all to its first statement (the "
               "server is not answering)";
    }
  }
  if (use_.pooler == Pooler::kPresent && !use_.own_session) {
    out +=
        " (behind a transaction pooler this includes waiting for a server connection: a "
        "pool smaller than the transactions that want one at once makes them queue " +
        sizing + ")";
  }
  return out;
}

void Connection::wait_socket(bool for_write, Deadline deadline, const char* doing) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left <= std::chrono::milliseconds::zero()) {
      broken_ = true;
      // Connected: a statement may be running on the server; cancel it when closing.
      cancel_on_close_ = PQstatus(conn_.get()) == CONNECTION_OK;
      throw PgError(store_, timeout_reason(doing), "");
    }
    pollfd p{PQsocket(conn_.get()), static_cast<short>(for_write ? POLLOUT : POLLIN), 0};
    if (p.fd < 0) {
      broken_ = true;
      throw PgError(store_, std::string("connection lost ") + doing, "", /*not_executed=*/false,
                    /*connection_lost=*/true);
    }
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (n > 0) return;
    if (n < 0 && errno != EINTR) {
      broken_ = true;
      throw PgError(store_, std::string("poll failed ") + doing + ": " + std::strerror(errno), "");
    }
  }
}

bool Connection::flush(Deadline deadline, const char* doing) {
  PGconn* c = conn_.get();
  // A full socket buffer needs the reply drained too.
  for (;;) {
    const int f = PQflush(c);
    if (f == 0) return true;
    if (f < 0) return false;
    wait_socket(/*for_write=*/true, deadline, doing);
    if (!PQconsumeInput(c)) return false;
  }
}

Result Connection::finish(Deadline deadline, const char* doing) {
  PGconn* c = conn_.get();
  if (!flush(deadline, doing)) {
    fail({std::string("connection lost ") + doing + ": " + one_line(PQerrorMessage(c)), "", true});
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
    answered_ = true;
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

Result Connection::exec(const std::string& sql, Deadline deadline) {
  if (!PQsendQuery(conn_.get(), sql.c_str())) {
    fail({"connection lost sending a query: " + one_line(PQerrorMessage(conn_.get())), "", true,
          /*not_executed=*/true});
  }
  return finish(deadline, "waiting for the server");
}

// One attempt at a pipeline: what came back, and how far it got.
struct Connection::Attempt {
  bool ok = false;
  Result result;                 // of the step asked for
  Failure failure;               // when !ok
  std::size_t failed_step = 0;   // the step whose command failed first
  bool failed_in_parse = false;  // ... in its Parse (else in its Bind or Execute)
};

Connection::Attempt Connection::attempt(const std::vector<Step>& steps,
                                        const std::vector<bool>& parse, std::size_t result_of,
                                        bool named, Deadline deadline, bool probe_delivery) {
  PGconn* c = conn_.get();
  const char* doing = "waiting for the server";
  Attempt out;
  auto lost = [&](const std::string& what) {
    out.failure = {what + ": " + one_line(PQerrorMessage(c)), "", true};
    broken_ = true;
  };
  // What the peer had acknowledged before the call sent anything (see delivered()).
  const std::optional<Delivery> before = probe_delivery ? delivered() : std::optional<Delivery>();
  // After the connection was lost: none of the call's bytes acknowledged, and they went in
  // one segment at most (so the server read all of them or none), means none was read.
  auto unread = [&] {
    const std::optional<Delivery> after = before ? delivered() : std::nullopt;
    return after && after->acked == before->acked && after->segments - before->segments <= 1;
  };
  // One statement already prepared, or sent as text, needs no pipeline: libpq sends its
  // messages and a Sync in one go, and the client does less per call (replays on a
  // connection of its own, most of all).
  const bool pipelined = steps.size() > 1 || (named && parse[0]);
  if (pipelined && !PQenterPipelineMode(c)) {
    lost("cannot start a pipeline");
    return out;
  }
  // Each command of the pipeline: the step it belongs to, and whether it is the step's Parse.
  struct Command {
    std::size_t step;
    bool parse;
  };
  std::vector<Command> commands;
  std::size_t bytes = 0;
  bool queued = true;
  for (std::size_t i = 0; i < steps.size() && queued; ++i) {
    const Statement& st = *steps[i].statement;
    const Params* p = steps[i].params;
    const int n = p ? p->size() : 0;
    const char* const* values = p ? p->values() : nullptr;
    const int* lengths = p ? p->lengths() : nullptr;
    const int* formats = p ? p->formats() : nullptr;
    for (int k = 0; k < n; ++k) bytes += static_cast<std::size_t>(lengths[k]);
    const bool typed = !st.types.empty() && st.types.size() == static_cast<std::size_t>(n);
    const Oid* types = typed ? st.types.data() : nullptr;
    const int ntypes = typed ? n : 0;
    if (!named) {
      queued = PQsendQueryParams(c, st.sql.c_str(), n, types, values, lengths, formats,
                                 /*resultFormat=*/1) != 0;
      commands.push_back({i, false});
      continue;
    }
    if (parse[i]) {
      queued = PQsendPrepare(c, st.name.c_str(), st.sql.c_str(), ntypes, types) != 0;
      commands.push_back({i, true});
      if (!queued) break;
    }
    queued = PQsendQueryPrepared(c, st.name.c_str(), n, values, lengths, formats,
                                 /*resultFormat=*/1) != 0;
    commands.push_back({i, false});
  }
  // The transaction commits with the last step (its COMMIT, or the Sync after it), which is
  // sent last: a send that failed before the end never let it commit.
  if (!queued || (pipelined && !PQpipelineSync(c))) {
    lost("connection lost sending a statement");
    out.failure.not_executed = true;
    return out;
  }
  if (!flush(deadline, doing)) {
    lost("connection lost sending a statement");
    out.failure.not_executed = bytes < kSmallPipeline || unread();
    return out;
  }

  std::size_t command = 0;  // the command whose results come next
  bool failed = false;
  bool last_answered = false;  // the last step's statement succeeded: it may have committed
  for (;;) {
    bool gone = false;
    while (PQisBusy(c) && !gone) {
      wait_socket(/*for_write=*/false, deadline, doing);
      gone = !PQconsumeInput(c);
    }
    // What arrived before the connection closed (a FATAL error, say) is still read.
    if (gone && PQisBusy(c)) break;
    PGresult* r = PQgetResult(c);
    if (r == nullptr) {
      // The end of one command's results (the last, without a pipeline); none at all when
      // the connection is gone.
      if (!pipelined && PQstatus(c) == CONNECTION_OK) out.ok = !failed;
      if (!pipelined || PQstatus(c) != CONNECTION_OK || command >= commands.size()) break;
      ++command;
      continue;
    }
    Result held(r);
    answered_ = true;
    const ExecStatusType status = PQresultStatus(r);
    if (status == PGRES_PIPELINE_SYNC) {
      out.ok = !failed;
      break;
    }
    if (status == PGRES_PIPELINE_ABORTED) continue;
    // After the last command: the Sync's own result, an error when the commit it made failed.
    const Command cmd =
        command < commands.size() ? commands[command] : Command{steps.size() - 1, false};
    if (status == PGRES_FATAL_ERROR || status == PGRES_BAD_RESPONSE ||
        status == PGRES_NONFATAL_ERROR) {
      if (failed) continue;
      failed = true;
      const char* state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
      const char* primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
      const std::string sqlstate = state ? state : "";
      const std::string message = primary ? primary : one_line(PQresultErrorMessage(r));
      out.failure = {statement_failure_reason(sqlstate, message), sqlstate, false};
      out.failure.not_executed = !last_answered && ended_while_idle(sqlstate, message);
      out.failed_step = cmd.step;
      out.failed_in_parse = cmd.parse;
      if (use_.own_session && use_.named) {
        if (sqlstate == "26000") prepared_.erase(steps[cmd.step].statement->name);
        if (sqlstate == "42P05") prepared_.insert(steps[cmd.step].statement->name);
      }
      continue;
    }
    if (command >= commands.size()) continue;
    if (cmd.parse) {
      if (use_.own_session) prepared_.insert(steps[cmd.step].statement->name);
      continue;
    }
    if (cmd.step + 1 == steps.size()) last_answered = true;
    if (cmd.step == result_of) out.result = std::move(held);
  }
  if (PQstatus(c) != CONNECTION_OK) {
    broken_ = true;
    // An error without a SQLSTATE is libpq's own, about the connection ending.
    if (!failed || out.failure.sqlstate.empty()) {
      out.failure = {std::string("connection lost ") + doing + ": " + one_line(PQerrorMessage(c)),
                     "", true};
    }
    out.failure.connection_lost = true;
    out.failure.not_executed = out.failure.not_executed || unread();
    out.ok = false;
    return out;
  }
  if (pipelined && !PQexitPipelineMode(c)) {
    // Still waiting for the end of the pipeline after its results ran out: behind PgBouncer,
    // the server's FATAL error and then the pooler's own for the server connection it lost
    // ("server conn crashed?"). What the first error said (57P05: nothing ran) still holds.
    broken_ = true;
    if (!failed) lost("cannot end a pipeline");
    out.failure.connection_lost = true;
    out.ok = false;
    return out;
  }
  if (failed) {
    const std::string& state = out.failure.sqlstate;
    if (state.rfind("08", 0) == 0 || state.rfind("57P", 0) == 0) {
      broken_ = true;
      out.failure.connection_lost = true;
    } else {
      roll_back(deadline);
    }
  }
  return out;
}

void Connection::roll_back(Deadline deadline) {
  // An error inside BEGIN ... COMMIT leaves the transaction open and aborted until it ends.
  if (PQtransactionStatus(conn_.get()) != PQTRANS_INERROR) return;
  try {
    (void)exec("ROLLBACK", deadline);
  } catch (const StoreUnavailable&) {
    broken_ = true;  // dropped by the pool, which ends the transaction
  }
}

Result Connection::run(const std::vector<Step>& steps, std::size_t result_of, Deadline deadline,
                       bool probe_delivery) {
  std::vector<bool> parse(steps.size(), false);
  if (use_.named && use_.own_session) {
    for (std::size_t i = 0; i < steps.size(); ++i) {
      parse[i] = !prepared_.contains(steps[i].statement->name);
    }
  }
  // A named statement a server session lacks (26000) is parsed; one it has already (42P05:
  // under a pooler, another client of the same server session prepared the same text) is
  // bound. Either way the pipeline did nothing (the failure aborted its transaction) and is
  // sent again. A pooler that keeps moving the calls between server sessions gets the texts
  // themselves after a few rounds.
  constexpr int kRounds = 4;
  for (int round = 0; round <= kRounds; ++round) {
    const bool by_text = round == kRounds;
    Attempt a = attempt(steps, parse, result_of, use_.named && !by_text, deadline, probe_delivery);
    if (a.ok) return std::move(a.result);
    const std::string& state = a.failure.sqlstate;
    const bool retry =
        !by_text && use_.named && !a.failure.connection_lost &&
        ((state == "26000" && !a.failed_in_parse) || (state == "42P05" && a.failed_in_parse));
    if (!retry) fail(a.failure);
    // The steps before the failed one ran, so this server session has them; it probably
    // lacks (26000) or has (42P05) the rest as it does the failed one, since the store's
    // statements are prepared together.
    for (std::size_t i = 0; i < steps.size(); ++i) {
      parse[i] = i >= a.failed_step && state == "26000";
    }
  }
  fail({"prepared statements kept disappearing between calls", "", false});
}

}  // namespace idem::postgres

namespace idem::postgres {

Result run_on_caller(PGconn* conn, const std::string& text, const Params* params,
                     const std::vector<Oid>& types, const std::string& store) {
  PGresult* raw = nullptr;
  if (params == nullptr) {
    raw = PQexec(conn, text.c_str());
  } else {
    raw = PQexecParams(conn, text.c_str(), params->size(), types.empty() ? nullptr : types.data(),
                       params->values(), params->lengths(), params->formats(),
                       /*resultFormat=*/1);
  }
  Result r(raw);
  const ExecStatusType status = raw == nullptr ? PGRES_FATAL_ERROR : PQresultStatus(raw);
  if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK) return r;
  const char* state = raw == nullptr ? nullptr : PQresultErrorField(raw, PG_DIAG_SQLSTATE);
  std::string message = raw == nullptr ? "" : PQresultErrorMessage(raw);
  if (message.empty()) message = PQerrorMessage(conn);
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  const bool lost = PQstatus(conn) == CONNECTION_BAD;
  const std::string sqlstate = state != nullptr ? state : (lost ? "08006" : "");
  if (sqlstate == "25006") {
    // read_only_sql_transaction: the caller's connection cannot carry the record's write
    // (SPEC §14), which is the caller's to fix, not an outage.
    throw InvalidArgument("connection",
                          "is read-only (a READ ONLY transaction, default_transaction_read_only, "
                          "or a hot standby): the record cannot be written on it; roll back (" +
                              message + ")");
  }
  throw PgError(store, "on the caller's connection: " + statement_failure_reason(sqlstate, message),
                sqlstate);
}

}  // namespace idem::postgres
