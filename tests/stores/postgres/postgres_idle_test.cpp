// Issue 36: connections the server ends under a call. With idle_session_timeout=1s and calls
// 1.2 s apart on a loaded machine, one replay in twenty failed with "connection lost waiting
// for the server: FATAL: terminating connection due to idle-session timeout ... server
// closed the connection unexpectedly".
//
// - The server's idle_session_timeout a few milliseconds either side of the caller's gap
//   between calls, with busy threads beside them, directly and behind both test
//   PgBouncers: no call fails, each key is acquired once.
// - Every way a lost connection shows itself, made on purpose by a forwarder between the
//   store and the server (FaultyForwarder): an end of file or a reset where the answer was
//   awaited, a FATAL error other than the idle timeout's, and an answer lost after the
//   statement ran. A read runs again on a new connection whichever it was; a complete whose
//   answer was lost is settled (done); an acquire whose answer was lost is not repeated. A
//   statement sent into a connection already reset or closed is known not to have run.
// - The listening connection keeps its session under idle_session_timeout and still wakes
//   waiters.

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"
#include "idem/stores/postgres_store.h"
#include "idem/testing/matchers.h"
#include "stores/postgres/postgres_connection.h"
#include "stores/postgres/postgres_test_util.h"
#include "stores/postgres/postgres_url.h"
#include "support/eventually.h"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;

std::string url_with(const std::string& base, const std::string& query) {
  return base + (base.find('?') == std::string::npos ? "?" : "&") + query;
}

// A store by URL on a fresh table of `base`'s server, which drops its table when released.
std::shared_ptr<Store> open_fresh(const std::string& base, const std::string& query,
                                  std::string* table_out = nullptr) {
  const std::string table = fresh_table("idle");
  if (table_out != nullptr) *table_out = table;
  std::shared_ptr<Store> s = open_store(url_with(base, "table=" + table + "&" + query));
  return std::shared_ptr<Store>(s.get(), [s, table](Store*) mutable {
    s.reset();
    drop_table(postgres_url(), table);
  });
}

// Threads that spin until destroyed: the loaded machine of the issue.
class Load {
 public:
  explicit Load(unsigned threads) {
    for (unsigned i = 0; i < threads; ++i) {
      spinners_.emplace_back([this] {
        volatile std::uint64_t x = 0;
        while (!stop_.load(std::memory_order_relaxed)) x = x + 1;
      });
    }
  }
  ~Load() {
    stop_ = true;
    for (auto& t : spinners_) t.join();
  }
  Load(const Load&) = delete;
  Load& operator=(const Load&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> spinners_;
};

// --- the server's own timeout, either side of the caller's gap ---------------------------

// The server's idle_session_timeout is set on a database made for the test (ALTER DATABASE
// ... SET), which the test PgBouncers reach too: directly, and behind PgBouncer in session
// and in transaction pooling. Calls 100 ms apart with the timeout at 96 to 104 ms, beside a
// busy thread per core; each call sleeps the gap first, so the pool's connection has idled
// about as long as the timeout when the call sends its statement.
class PostgresIdleTimeout : public ::testing::TestWithParam<std::string> {
 protected:
  std::string base() const {
    if (GetParam() == "direct") return postgres_url();
    const char* env =
        GetParam() == "session" ? "IDEM_TEST_PGBOUNCER_SESSION_URL" : "IDEM_TEST_PGBOUNCER_TX_URL";
    return env_or_empty(env);
  }
};

TEST_P(PostgresIdleTimeout, CallsAGapApartWithTheServersTimeoutEitherSideOfItNeverFail) {
  IDEM_SKIP_OR_FAIL_UNLESS(!base().empty(), "no URL for the " + GetParam() + " server");
  constexpr auto kGap = 100ms;
  constexpr int kKeys = 6;
  const unsigned cores = std::max(2u, std::thread::hardware_concurrency());
  Load load(cores);
  int reported = 0;
  for (const int timeout_ms : {96, 98, 100, 102, 104}) {
    SCOPED_TRACE("idle_session_timeout=" + std::to_string(timeout_ms) + "ms");
    ScratchDatabase db("idle_session_timeout", std::to_string(timeout_ms));
    const std::string table = fresh_table("idle");
    auto s = open_store(url_with(db.url(base()), "table=" + table + "&pool_size=1"));
    auto call = [&](const char* what, auto&& f) {
      std::this_thread::sleep_for(kGap);
      try {
        f();
        return true;
      } catch (const StoreUnavailable& e) {
        // Behind a transaction pooler, a server connection the server ends as PgBouncer
        // hands it to the call shows as PgBouncer's own error (08P01, "server connection
        // closed"), which cannot be told from a crash after the commit: a write other than
        // a complete is then reported, not repeated (docs/stores/postgres.md).
        const bool pooled_write = GetParam() == "transaction" && std::string(what) == "acquire" &&
                                  e.reason().find("08P01") != std::string::npos;
        if (!pooled_write) ADD_FAILURE() << what << ": " << e.what();
        ++reported;
        return false;
      }
    };
    for (int i = 0; i < kKeys; ++i) {
      const std::string key = "k" + std::to_string(i);
      Token token = 0;
      const bool acquired = call("acquire", [&] {
        AcquireResult r = s->acquire("s", key, 1h, 1h);
        EXPECT_THAT(r, IsFreshlyAcquired());
        if (const auto* a = std::get_if<Acquired>(&r)) token = a->lease.token;
      });
      if (!acquired) continue;
      call("complete",
           [&] { EXPECT_EQ(s->complete("s", key, token, "v", 1h), WriteResult::kDone); });
      call("get", [&] {
        const std::optional<Record> r = s->get("s", key);
        ASSERT_TRUE(r.has_value());
        EXPECT_EQ(r->payload, "v");
      });
      call("replay", [&] { EXPECT_THAT(s->acquire("s", key, 1h, 1h), IsReplay()); });
    }
    s.reset();
    RawPg raw(db.url(postgres_url()));
    const int rows = std::stoi(raw.value("SELECT count(*) FROM " + table));
    EXPECT_LE(rows, kKeys);
    EXPECT_GE(rows, kKeys - reported);
  }
  if (reported > 0) std::printf("acquires reported through the transaction pooler: %d\n", reported);
}

INSTANTIATE_TEST_SUITE_P(Servers, PostgresIdleTimeout,
                         ::testing::Values("direct", "session", "transaction"),
                         [](const auto& info) {
                           const std::string& p = info.param;
                           return p == "direct"    ? std::string("Direct")
                                  : p == "session" ? std::string("PgbouncerSession")
                                                   : std::string("PgbouncerTransaction");
                         });

// --- every way of losing the connection, on purpose ---------------------------------------

// A TCP forwarder between the store and the test server that, once armed, does one thing
// to the next request a client sends (on any connection), then forwards again.
class FaultyForwarder {
 public:
  enum class Fault {
    kNone,
    kCloseOnRequest,      // close the client's connection without forwarding: an end of file
    kResetOnRequest,      // reset it (RST) without forwarding: "server closed the connection"
    kFatalOnRequest,      // answer a FATAL 57P01 (an administrator's termination) and close
    kIdleFatalOnRequest,  // answer the idle timeout's FATAL 57P05 and close
    kCloseAfterAnswer,    // forward, let the server answer in full, then close unanswered
  };

  // Forwards to `port` on 127.0.0.1.
  explicit FaultyForwarder(int port) : target_port_(port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        ::listen(listen_fd_, 64) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "forwarder: " << std::strerror(errno);
    }
    port_ = ntohs(a.sin_port);
    accepter_ = std::thread([this] { accept_loop(); });
  }
  ~FaultyForwarder() {
    stop_ = true;
    accepter_.join();
    std::lock_guard lock(mu_);
    for (auto& t : pipes_) t.join();
    ::close(listen_fd_);
  }
  FaultyForwarder(const FaultyForwarder&) = delete;
  FaultyForwarder& operator=(const FaultyForwarder&) = delete;

  int port() const { return port_; }
  // Ends every connection open now at once, reset (RST) or closed (an end of file), with
  // nothing asked: a connection the peer ended between the pool's check and the send.
  void cut_now(bool reset) {
    fired_ = false;
    armed_below_ = accepted_.load();
    cut_ = reset ? 2 : 1;
  }
  // The fault takes the next request on a connection open now (one the store has pooled),
  // never on one made later (the store's new connection after the fault).
  void arm(Fault f) {
    fired_ = false;
    armed_below_ = accepted_.load();
    fault_ = f;
  }
  // Whether the armed fault happened.
  bool fired() const { return fired_; }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<std::uint16_t>(target_port_));
      if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(client);
        ::close(server);
        continue;
      }
      std::lock_guard lock(mu_);
      const int id = accepted_++;
      pipes_.emplace_back([this, client, server, id] { pipe(client, server, id); });
    }
  }

  static bool send_all(int fd, const char* data, std::size_t n) {
    while (n > 0) {
      const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      data += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }

  // A FATAL ErrorResponse as PostgreSQL sends it.
  static std::string fatal(const std::string& sqlstate, const std::string& message) {
    std::string body;
    for (const auto& [field, value] : std::vector<std::pair<char, std::string>>{
             {'S', "FATAL"}, {'V', "FATAL"}, {'C', sqlstate}, {'M', message}}) {
      body += field;
      body += value;
      body += '\0';
    }
    body += '\0';
    const std::uint32_t len = htonl(static_cast<std::uint32_t>(body.size() + 4));
    std::string out = "E";
    out.append(reinterpret_cast<const char*>(&len), 4);
    return out + body;
  }

  // Forwards both ways until either side closes; the armed fault takes the next request.
  void pipe(int client, int server, int id) {
    char buf[65536];
    bool answer_held = false;  // kCloseAfterAnswer: the server's answer is read, not forwarded
    std::string held;          // what the server answered meanwhile
    while (!stop_) {
      if (cut_ != 0 && id < armed_below_.load()) {
        if (cut_.exchange(0) == 2) {
          const linger l{1, 0};
          ::setsockopt(client, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        }
        fired_ = true;
        break;
      }
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(p, 2, 20) <= 0) continue;
      if (p[0].revents != 0) {
        const ssize_t n = ::recv(client, buf, sizeof buf, 0);
        if (n <= 0) break;
        const Fault f =
            answer_held || id >= armed_below_.load() ? Fault::kNone : fault_.exchange(Fault::kNone);
        if (f == Fault::kCloseOnRequest) {
          fired_ = true;
          break;
        }
        if (f == Fault::kResetOnRequest) {
          const linger l{1, 0};
          ::setsockopt(client, SOL_SOCKET, SO_LINGER, &l, sizeof l);
          fired_ = true;
          break;
        }
        if (f == Fault::kFatalOnRequest || f == Fault::kIdleFatalOnRequest) {
          const std::string e =
              f == Fault::kFatalOnRequest
                  ? fatal("57P01", "terminating connection due to administrator command")
                  : fatal("57P05", "terminating connection due to idle-session timeout");
          (void)send_all(client, e.data(), e.size());
          fired_ = true;
          break;
        }
        if (f == Fault::kCloseAfterAnswer) answer_held = true;
        if (!send_all(server, buf, static_cast<std::size_t>(n))) break;
      }
      if (p[1].revents != 0) {
        const ssize_t n = ::recv(server, buf, sizeof buf, 0);
        if (n <= 0) break;
        if (!answer_held) {
          if (!send_all(client, buf, static_cast<std::size_t>(n))) break;
          continue;
        }
        held.append(buf, static_cast<std::size_t>(n));
        if (answered_in_full(held)) {
          fired_ = true;  // the statement ran and committed; its answer never arrives
          break;
        }
      }
    }
    ::close(client);
    ::close(server);
  }

  // Whether `bytes` (server messages from a message boundary) end with ReadyForQuery.
  static bool answered_in_full(const std::string& bytes) {
    std::size_t at = 0;
    while (at + 5 <= bytes.size()) {
      std::uint32_t len = 0;
      std::memcpy(&len, bytes.data() + at + 1, 4);
      const std::size_t next = at + 1 + ntohl(len);
      if (next > bytes.size()) return false;
      if (bytes[at] == 'Z') return true;
      at = next;
    }
    return false;
  }

  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<Fault> fault_{Fault::kNone};
  std::atomic<bool> fired_{false};
  std::atomic<int> cut_{0};          // cut_now: 1 close, 2 reset
  std::atomic<int> accepted_{0};     // connections accepted so far
  std::atomic<int> armed_below_{0};  // the fault takes connections accepted before arm()
  std::mutex mu_;
  std::vector<std::thread> pipes_;  // guarded by mu_
  std::thread accepter_;
};

// The test server's URL (postgresql://user@127.0.0.1:PORT/db...) split at its port.
struct SplitUrl {
  std::string head;  // up to the colon before the port
  int port = 0;
  std::string tail;  // from the slash after the port
};

SplitUrl split_port(const std::string& url) {
  const std::size_t host =
      url.find('@') == std::string::npos ? url.find("://") + 3 : url.find('@') + 1;
  const std::size_t colon = url.find(':', host);
  const std::size_t slash = url.find('/', host);
  EXPECT_NE(colon, std::string::npos) << url;
  EXPECT_LT(colon, slash) << url;
  return {url.substr(0, colon), std::stoi(url.substr(colon + 1, slash - colon - 1)),
          url.substr(slash)};
}

class PostgresLostConnection : public ::testing::Test {
 protected:
  PostgresLostConnection()
      : server_(split_port(postgres_url())),
        forwarder_(std::make_unique<FaultyForwarder>(server_.port)) {}

  std::string forwarder_url() const {
    return server_.head + ":" + std::to_string(forwarder_->port()) + server_.tail;
  }

  // A store on a fresh table whose one connection goes through the forwarder (`query`
  // "&acquire=write-first": an acquire sends its write, never a read before it).
  std::shared_ptr<Store> open_through(std::string* table = nullptr, const std::string& query = "") {
    return open_fresh(forwarder_url(), "pool_size=1" + query, table);
  }

  SplitUrl server_;
  std::unique_ptr<FaultyForwarder> forwarder_;
};

using Fault = FaultyForwarder::Fault;

// acquire=read-first: a replay is one read.
TEST_F(PostgresLostConnection, AReadRunsAgainOnANewConnectionHoweverItsOwnWasLost) {
  auto s = open_through(nullptr, "&acquire=read-first");
  const Token token = std::get<Acquired>(s->acquire("s", "k", 1h, 1h)).lease.token;
  ASSERT_EQ(s->complete("s", "k", token, "v", 1h), WriteResult::kDone);
  for (const Fault f : {Fault::kCloseOnRequest, Fault::kResetOnRequest, Fault::kFatalOnRequest,
                        Fault::kIdleFatalOnRequest, Fault::kCloseAfterAnswer}) {
    SCOPED_TRACE("fault " + std::to_string(static_cast<int>(f)));
    (void)s->get("s", "warm");  // the pool holds a connection the fault can take
    forwarder_->arm(f);
    try {
      const std::optional<Record> r = s->get("s", "k");
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(r->payload, "v");
    } catch (const StoreUnavailable& e) {
      ADD_FAILURE() << "get: " << e.what();
    }
    EXPECT_TRUE(forwarder_->fired());
    (void)s->get("s", "warm");
    forwarder_->arm(f);
    try {
      EXPECT_THAT(s->acquire("s", "k", 1h, 1h), IsReplay());  // read first: a replay is a read
    } catch (const StoreUnavailable& e) {
      ADD_FAILURE() << "replay: " << e.what();
    }
    EXPECT_TRUE(forwarder_->fired());
  }
}

TEST_F(PostgresLostConnection, ACompleteWhoseAnswerWasLostIsDone) {
  std::string table;
  auto s = open_through(&table);
  const Token token = std::get<Acquired>(s->acquire("s", "k", 1h, 1h)).lease.token;
  forwarder_->arm(Fault::kCloseAfterAnswer);
  try {
    EXPECT_EQ(s->complete("s", "k", token, "v", 1h), WriteResult::kDone);
  } catch (const StoreUnavailable& e) {
    ADD_FAILURE() << "complete: " << e.what();
  }
  EXPECT_TRUE(forwarder_->fired());
  const std::optional<Record> r = s->get("s", "k");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->state, RecordState::kComplete);
  EXPECT_EQ(r->token, token);
  EXPECT_EQ(r->payload, "v");
}

// The acquire ran (its lease is in the table) but its caller cannot know: it is not run
// again, which would answer "busy" with the caller's own lease. The caller gets
// StoreUnavailable; the lease ends in its time.
TEST_F(PostgresLostConnection, AnAcquireWhoseAnswerWasLostIsNotRepeated) {
  std::string table;
  auto s = open_through(&table, "&acquire=write-first");
  forwarder_->arm(Fault::kCloseAfterAnswer);
  EXPECT_THROW(s->acquire("s", "k", 1h, 1h), StoreUnavailable);
  EXPECT_TRUE(forwarder_->fired());
  const std::optional<Record> r = s->get("s", "k");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->state, RecordState::kInProgress);
  EXPECT_EQ(r->attempt, 1);
}

// A statement the server never read (the idle timeout's FATAL, or a send into a connection
// found closed) runs again, a write too: exactly once.
TEST_F(PostgresLostConnection, AWriteTheServerNeverReadRunsAgain) {
  std::string table;
  auto s = open_through(&table, "&acquire=write-first");
  forwarder_->arm(Fault::kIdleFatalOnRequest);
  try {
    EXPECT_THAT(s->acquire("s", "k", 1h, 1h), IsFreshlyAcquired());
  } catch (const StoreUnavailable& e) {
    ADD_FAILURE() << "acquire: " << e.what();
  }
  EXPECT_TRUE(forwarder_->fired());
  RawPg raw(postgres_url());
  EXPECT_EQ(raw.value("SELECT count(*) FROM " + table), "1");
}

// A connection the peer ended between the pool's check and the send, made on one
// connection of the store's own kind (the pool's check, which would see the end, is not
// part of it): reset, or closed. libpq (14 and later) reports either send as done (a write
// that fails with EPIPE or ECONNRESET "succeeds") and the failure at the next read, "server
// closed the connection unexpectedly", as it does an answer lost after the commit. The
// peer acknowledged none of the call's bytes, which went in one segment: a statement that
// writes (probe_delivery) is known not to have run, and runs again; without the probe it
// is only lost.
TEST_F(PostgresLostConnection, ASendIntoAnEndedConnectionIsKnownNotToHaveRun) {
  for (const bool reset : {true, false}) {
    for (const bool probe : {true, false}) {
      SCOPED_TRACE(std::string(reset ? "reset" : "closed") + (probe ? ", probed" : ""));
      const auto deadline = [] { return std::chrono::steady_clock::now() + 5s; };
      postgres::Connection c(postgres::parse_conninfo(forwarder_url()), "test", 5000ms,
                             postgres::SessionUse{}, deadline());
      const postgres::Statement select("t", "SELECT 1");
      EXPECT_EQ(c.run({{&select}}, 0, deadline()).rows(), 1);
      forwarder_->cut_now(reset);
      ASSERT_TRUE(eventually([&] { return forwarder_->fired(); }));
      std::this_thread::sleep_for(50ms);  // the reset or the end of file arrives
      try {
        (void)c.run({{&select}}, 0, deadline(), probe);
        ADD_FAILURE() << "the call succeeded";
      } catch (const postgres::PgError& e) {
        EXPECT_TRUE(e.connection_lost()) << e.what();
        EXPECT_EQ(e.not_executed(), probe) << e.what();
        EXPECT_THAT(e.reason(), ::testing::HasSubstr("server closed the connection unexpectedly"));
      }
    }
  }
}

// --- the listening connection -------------------------------------------------------------

// A LISTEN session idles by design: under idle_session_timeout it was ended every timeout
// and made again (waking every waiter each time). It now turns the timeout off for itself,
// keeps its session, and wakes the waiter of a record completed elsewhere.
TEST(PostgresIdleListener, KeepsItsSessionAndWakesWaiters) {
  std::string table;
  auto s = open_fresh(postgres_url(), "options=-c%20idle_session_timeout%3D200", &table);
  auto* pg = dynamic_cast<PostgresStore*>(s.get());
  ASSERT_NE(pg, nullptr);
  std::atomic<int> woken{0};
  auto watch = s->watch("s", "k", [&] { ++woken; });
  ASSERT_NE(watch, nullptr);
  ASSERT_TRUE(eventually([&] { return pg->listener_stats().listening; }));
  const int pid = pg->listener_stats().backend_pid;
  std::this_thread::sleep_for(1s);  // five of the server's timeouts
  EXPECT_EQ(pg->listener_stats().reconnects, 0u);
  EXPECT_EQ(pg->listener_stats().backend_pid, pid);
  const int before = woken.load();
  // Another store object, without the timeout, completes the record.
  auto other = open_store(url_with(postgres_url(), "table=" + table));
  const Token token = std::get<Acquired>(other->acquire("s", "k", 1h, 1h)).lease.token;
  ASSERT_EQ(other->complete("s", "k", token, "v", 1h), WriteResult::kDone);
  EXPECT_TRUE(eventually([&] { return woken.load() > before; }));
  EXPECT_GE(pg->listener_stats().notifications, 1u);
}

}  // namespace
}  // namespace idem::testing
