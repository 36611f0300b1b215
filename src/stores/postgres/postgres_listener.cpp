#include "stores/postgres/postgres_listener.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "idem/error.h"
#include "stores/postgres/postgres_operations.h"

namespace idem::postgres {

namespace {

using namespace std::chrono_literals;

// A connection silent this long is asked `SELECT 1`, so one that died without a word (a
// host gone, a dropped route) is found and made again.
constexpr auto kKeepAlive = 30s;
// The pause before making a lost connection again: doubling from the first to the last.
constexpr auto kFirstBackoff = 50ms;
constexpr auto kMaxBackoff = 5s;

}  // namespace

std::string notify_channel(const TableNames& names) {
  const std::string plain = "idem:" + names.display();
  if (plain.size() <= kMaxChannelLength) return plain;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(Fnv1a().add(names.display()).value()));
  return std::string("idem:") + hex;
}

std::string quote_identifier(std::string_view name) {
  std::string out = "\"";
  for (char c : name) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::uint64_t parse_payload(std::string_view payload, bool& ok) {
  std::uint64_t hash = 0;
  const char* last = payload.data() + payload.size();
  const auto [end, ec] = std::from_chars(payload.data(), last, hash, 16);
  ok = !payload.empty() && ec == std::errc{} && end == last;
  return ok ? hash : 0;
}

Listener::Listener(ConnParams params, std::string channel, Duration timeout)
    : params_(std::move(params)), channel_(std::move(channel)), timeout_(timeout) {
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) throw StoreUnavailable(channel_, "eventfd failed for the listener");
}

Listener::~Listener() {
  {
    std::lock_guard lock(start_mu_);
    stop_.store(true);
    const std::uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  ::close(stop_fd_);
}

std::unique_ptr<RecordWatch> Listener::watch(std::string_view scope, std::string_view key,
                                             std::function<void()> changed) {
  {
    std::lock_guard lock(start_mu_);
    if (!thread_.joinable() && !stop_.load()) {
      thread_ = std::thread([this] { run(); });
      // Named here, not in the thread, so it has its name before anyone can look (top -H,
      // /proc/PID/task/*/comm). 15 characters at most.
      ::pthread_setname_np(thread_.native_handle(), "idem-pg-listen");
    }
  }
  return watchers_.add(idem::detail::stable_record_hash(scope, key), std::move(changed));
}

PostgresListenerStats Listener::stats() const {
  return PostgresListenerStats{.connects = connects_.load(),
                               .reconnects = reconnects_.load(),
                               .notifications = notifications_.load(),
                               .watches = watchers_.size(),
                               .listening = listening_.load(),
                               .backend_pid = backend_pid_.load()};
}

void Listener::run() {
  auto backoff = std::chrono::duration_cast<SteadyClock::duration>(kFirstBackoff);
  bool lost = false;  // a connection listened before and was lost
  while (!stop_.load()) {
    Conn c = connect();
    if (!c) {
      if (wait(-1, 0, SteadyClock::now() + backoff) == Woke::kStop) return;
      backoff = std::min<SteadyClock::duration>(backoff * 2, kMaxBackoff);
      continue;
    }
    backoff = kFirstBackoff;
    ++connects_;
    if (lost) ++reconnects_;
    lost = true;
    listening_.store(true);
    // Notifications sent before LISTEN took effect (while the connection was lost, or
    // before the first one was made) reached nobody: every waiter asks the store again.
    watchers_.notify_all();
    serve(c.get());
    listening_.store(false);
    backend_pid_.store(0);
  }
}

Listener::Conn Listener::connect() {
  std::vector<const char*> keys;
  std::vector<const char*> values;
  for (const auto& [k, v] : params_) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  Conn c(PQconnectStartParams(keys.data(), values.data(), 0));
  if (!c || PQstatus(c.get()) == CONNECTION_BAD) return nullptr;
  // A library prints nothing: the server's notices, and the error of a session the server
  // ends while the connection idles (which libpq hands to the notice receiver), are
  // dropped; the broken connection itself is what the listener acts on.
  PQsetNoticeReceiver(
      c.get(), [](void*, const PGresult*) {}, nullptr);
  const auto deadline = SteadyClock::now() + timeout_;
  for (PostgresPollingStatusType s = PGRES_POLLING_WRITING; s != PGRES_POLLING_OK;
       s = PQconnectPoll(c.get())) {
    if (s == PGRES_POLLING_FAILED) return nullptr;
    const short events = s == PGRES_POLLING_READING ? POLLIN : POLLOUT;
    if (wait(PQsocket(c.get()), events, deadline) != Woke::kReady) return nullptr;
  }
  if (PQsetnonblocking(c.get(), 1) != 0) return nullptr;
  std::string pid;
  // A listening session idles by design, and its keep-alive (kKeepAlive) finds a dead one: the
  // server's idle_session_timeout (PostgreSQL 14 and later) is turned off for it, or the
  // server would end it every timeout, and each new connection wakes every waiter.
  const std::string listen = "LISTEN " + quote_identifier(channel_) +
                             "; SELECT set_config(name, '0', false) FROM pg_settings WHERE "
                             "name = 'idle_session_timeout'; SELECT pg_backend_pid()";
  if (!round_trip(c.get(), listen.c_str(), &pid)) return nullptr;
  backend_pid_.store(std::atoi(pid.c_str()));
  return c;
}

void Listener::serve(PGconn* c) {
  auto keep_alive = SteadyClock::now() + kKeepAlive;
  for (;;) {
    hand_on(c);
    switch (wait(PQsocket(c), POLLIN, keep_alive)) {
      case Woke::kStop:
        return;
      case Woke::kTimeout:
        if (!round_trip(c, "SELECT 1", nullptr)) return;
        keep_alive = SteadyClock::now() + kKeepAlive;
        break;
      case Woke::kReady:
        // 0: the connection broke (the server ended the session, the peer closed it).
        if (PQconsumeInput(c) == 0 || PQstatus(c) != CONNECTION_OK) return;
        keep_alive = SteadyClock::now() + kKeepAlive;
        break;
    }
  }
}

bool Listener::round_trip(PGconn* c, const char* sql, std::string* value) {
  const auto deadline = SteadyClock::now() + timeout_;
  if (PQsendQuery(c, sql) == 0) return false;
  for (int f = PQflush(c); f != 0; f = PQflush(c)) {
    if (f < 0 || wait(PQsocket(c), POLLIN | POLLOUT, deadline) != Woke::kReady) return false;
    if (PQconsumeInput(c) == 0) return false;
  }
  bool ok = true;
  for (;;) {
    while (PQisBusy(c) != 0) {
      if (wait(PQsocket(c), POLLIN, deadline) != Woke::kReady) return false;
      if (PQconsumeInput(c) == 0) return false;
      hand_on(c);
    }
    PGresult* r = PQgetResult(c);
    if (r == nullptr) break;
    const ExecStatusType status = PQresultStatus(r);
    if (status == PGRES_TUPLES_OK && value != nullptr && PQntuples(r) > 0) {
      *value = PQgetvalue(r, 0, 0);
    } else if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
      ok = false;
    }
    PQclear(r);
  }
  hand_on(c);
  return ok && PQstatus(c) == CONNECTION_OK;
}

void Listener::hand_on(PGconn* c) {
  while (PGnotify* n = PQnotifies(c)) {
    if (channel_ == n->relname) {
      ++notifications_;
      bool ok = false;
      const std::uint64_t hash = parse_payload(n->extra, ok);
      // A NOTIFY without a payload (an operator's, say) wakes every waiter; one that names
      // no record of ours wakes none.
      if (ok) {
        watchers_.notify(hash);
      } else if (*n->extra == '\0') {
        watchers_.notify_all();
      }
    }
    PQfreemem(n);
  }
}

Listener::Woke Listener::wait(int fd, short events, SteadyClock::time_point until) const {
  for (;;) {
    if (stop_.load()) return Woke::kStop;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - SteadyClock::now());
    if (left.count() <= 0) return Woke::kTimeout;
    pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {fd, events, 0}};
    const int n = ::poll(fds, 2, static_cast<int>(std::min<std::int64_t>(left.count(), INT_MAX)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Woke::kStop;
    if (fds[0].revents != 0) return Woke::kStop;
    if (fds[1].revents != 0) return Woke::kReady;
  }
}

}  // namespace idem::postgres
