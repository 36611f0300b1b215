// PostgreSQL store tests that stop, restart or reconfigure their server, on a private server
// of their own (private_server.sh), never the shared one: a restart in the middle of a
// workload, durability per statement, authentication failures, replays that write no WAL
// and take no transaction id, and a hot standby (a second private server, made one). All
// tests of this executable share one private server and run in one process (one ctest
// test).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.h"
#include "idem/executor.h"
#include "idem/open_store.h"
#include "idem/stores/postgres_store.h"
#include "idem/testing/matchers.h"
#include "stores/postgres/postgres_test_util.h"
#include "support/eventually.h"
#include "support/server_script.h"

#ifndef IDEM_PRIVATE_SERVER_SCRIPT
#error "IDEM_PRIVATE_SERVER_SCRIPT is set by tests/stores/postgres/CMakeLists.txt"
#endif

namespace idem::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Runs private_server.sh; returns its standard output, or fails the test.
std::string server_script(const std::string& command, const std::string& dir) {
  return run_server_script(IDEM_PRIVATE_SERVER_SCRIPT, command, dir);
}

// The private server, started once for the whole executable.
class PrivateServer : public ::testing::Environment {
 public:
  void SetUp() override {
    if (postgres_url().empty()) return;  // PostgresEnvironment skips or fails every test
    char pattern[] = "/tmp/idem-pg-private-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    port_ = server_script("start", dir_);
    ASSERT_FALSE(port_.empty());
    std::ifstream(dir_ + "/password") >> password_;
  }
  void TearDown() override {
    if (!dir_.empty()) server_script("destroy", dir_);
  }

  // Trusted, through the unix socket.
  std::string socket_url(const std::string& query = "") const {
    return "postgresql:///idem_test?host=" + dir_ + "&port=" + port_ + "&user=postgres" +
           (query.empty() ? "" : "&" + query);
  }
  // Over TCP, where the server asks for a password.
  std::string tcp_url(const std::string& password) const {
    return "postgresql://postgres:" + password + "@127.0.0.1:" + port_ + "/idem_test";
  }
  const std::string& password() const { return password_; }
  void stop() { server_script("stop", dir_); }
  void resume() { server_script("resume", dir_); }

 private:
  std::string dir_;
  std::string port_;
  std::string password_;
};

PrivateServer* const server =
    static_cast<PrivateServer*>(::testing::AddGlobalTestEnvironment(new PrivateServer));

// A store on a fresh table of the private server.
std::shared_ptr<Store> private_store(const std::string& query = "") {
  return open_store(
      server->socket_url("table=" + fresh_table("priv") + (query.empty() ? "" : "&" + query)));
}

TEST(PostgresPrivateServer, RestartInTheMiddleOfAWorkloadLosesNoCompletedRecord) {
  auto store = private_store("timeout=3000&pool_size=4");
  // Heartbeat errors are expected while the server is down; the leases outlive it.
  Executor exec(store, ExecutorOptions{.lease = 60s, .on_heartbeat_error = [](const auto&) {}});
  constexpr int kThreads = 4;
  std::mutex mu;
  std::map<std::string, int> runs;               // key -> times its action ran
  std::map<std::string, std::string> completed;  // key -> payload, for run() that returned
  std::vector<std::string> unexpected;           // errors other than StoreUnavailable
  std::atomic<int> successes{0};
  std::atomic<int> unavailable{0};
  std::atomic<bool> stop{false};
  std::vector<std::atomic<int>> after_restart(kThreads);
  std::atomic<bool> restarted{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; !stop; ++i) {
        const std::string key = "w" + std::to_string(t) + "-" + std::to_string(i);
        try {
          auto r = exec.run("restart", key, [&](const Attempt& a) {
            {
              std::lock_guard lock(mu);
              ++runs[key];
              // SPEC §5: an action runs only under a lease the store granted.
              if (a.token() == 0) unexpected.push_back(key + " ran without a token");
            }
            std::this_thread::sleep_for(2ms);
            return "payload-" + key;
          });
          std::lock_guard lock(mu);
          if (!r.replayed) completed[key] = r.value;
          ++successes;
          if (restarted) ++after_restart[t];
        } catch (const StoreUnavailable&) {
          ++unavailable;
          std::this_thread::sleep_for(5ms);
        } catch (const std::exception& e) {
          std::lock_guard lock(mu);
          unexpected.push_back(key + ": " + e.what());
        }
      }
    });
  }
  ASSERT_TRUE(eventually([&] { return successes.load() >= 100; }, 120s));
  server->stop();
  // Calls in flight and calls made while the server is down fail with StoreUnavailable.
  ASSERT_TRUE(eventually([&] { return unavailable.load() >= kThreads; }, 120s));
  server->resume();
  restarted = true;
  // Later calls succeed, on every thread.
  const bool recovered = eventually(
      [&] {
        for (auto& n : after_restart) {
          if (n.load() < 20) return false;
        }
        return true;
      },
      120s);
  stop = true;
  for (auto& th : threads) th.join();
  EXPECT_TRUE(recovered);
  EXPECT_THAT(unexpected, ::testing::IsEmpty());
  // Each key ran at most once, and every run() that returned a result left it recorded.
  for (const auto& [key, n] : runs) EXPECT_LE(n, 1) << key;
  int checked = 0;
  for (const auto& [key, payload] : completed) {
    std::optional<Record> rec = store->get("restart", key);
    ASSERT_TRUE(rec.has_value()) << key << " was lost";
    EXPECT_EQ(rec->state, RecordState::kComplete) << key;
    EXPECT_EQ(rec->payload, payload) << key;
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

// Sets synchronous_standby_names on the private server and waits until new sessions see it.
void require_standby(const std::string& names) {
  RawPg raw(server->socket_url());
  raw.exec("ALTER SYSTEM SET synchronous_standby_names = '" + names + "'");
  raw.exec("SELECT pg_reload_conf()");
  ASSERT_TRUE(eventually([&] {
    RawPg fresh(server->socket_url());
    return fresh.value("SHOW synchronous_standby_names") == names;
  }));
}

TEST(PostgresPrivateServer, DurableAndRelaxedStatementsCommitDifferently) {
  // A synchronous standby that never connects: a commit that waits for durability (the
  // server's synchronous_commit) never returns, one made with synchronous_commit = off
  // returns at once. So it shows which statements wait.
  auto store = private_store("timeout=3000");
  auto all_async = private_store("timeout=3000&synchronous_commit=off");
  const Token k1 = std::get<Acquired>(store->acquire("s", "k1", 1h, 1h)).lease.token;
  const Token k2 = std::get<Acquired>(store->acquire("s", "k2", 1h, 1h)).lease.token;
  const Token k3 = std::get<Acquired>(store->acquire("s", "k3", 1h, 1h)).lease.token;
  const Token old = std::get<Acquired>(store->acquire("s", "old", 1h, 1h)).lease.token;
  ASSERT_THAT(store->complete("s", "old", old, "v", 1ms), IsDone());
  ASSERT_TRUE(eventually([&] {
    auto r = store->get("s", "old");
    return r && r->expires_at <= r->now;
  }));

  // Made before the standby is required: creating its table is a durable commit too.
  auto probe = private_store("timeout=2000&pool_size=1");
  require_standby("idem_never");
  // Whatever happens below, later tests get a server that does not wait for a standby.
  struct Restore {
    ~Restore() { require_standby(""); }
  } restore;
  // Backends learn of the standby when the server's checkpointer has reread its settings:
  // wait until a durable commit really waits (a probe times out).
  int probes = 0;
  ASSERT_TRUE(eventually([&] {
    try {
      (void)probe->acquire("probe", std::to_string(probes++), 1h, 1h);
      return false;
    } catch (const StoreUnavailable&) {
      return true;
    }
  }));
  // extend, extend_many, release and purge: relaxed, they return.
  EXPECT_THAT(store->extend("s", "k1", k1, 1h), IsDone());
  std::vector<ExtendRequest> batch = {{"s", "k1", k1, 1h}, {"s", "k3", k3, 1h}};
  std::vector<ExtendResult> extended = store->extend_many(batch);
  EXPECT_THAT(extended[0], IsDone());
  EXPECT_THAT(extended[1], IsDone());
  EXPECT_THAT(store->release("s", "k2", k2), IsDone());
  EXPECT_EQ(store->purge(10), 1u);
  // acquire and complete: durable, they wait for the standby until the call's timeout.
  try {
    (void)store->acquire("s", "new", 1h, 1h);
    ADD_FAILURE() << "a durable acquire returned without its standby";
  } catch (const StoreUnavailable& e) {
    EXPECT_THAT(e.reason(), HasSubstr("timed out"));
  }
  try {
    (void)store->complete("s", "k3", k3, "v", 1h);
    ADD_FAILURE() << "a durable complete returned without its standby";
  } catch (const StoreUnavailable& e) {
    EXPECT_THAT(e.reason(), HasSubstr("timed out"));
  }
  // synchronous_commit=off for everything: acquire and complete return too.
  AcquireResult a = all_async->acquire("s", "async", 1h, 1h);
  ASSERT_THAT(a, IsFreshlyAcquired());
  EXPECT_THAT(all_async->complete("s", "async", std::get<Acquired>(a).lease.token, "v", 1h),
              IsDone());
}

TEST(PostgresPrivateServer, AuthenticationFailureIsNamedWithoutThePassword) {
  try {
    open_store(server->tcp_url("Wr0ngPassw0rd"));
    ADD_FAILURE() << "a wrong password was accepted";
  } catch (const StoreUnavailable& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("authentication failed"), HasSubstr("127.0.0.1"),
                                Not(HasSubstr("Wr0ngPassw0rd"))));
    EXPECT_THAT(e.store(), Not(HasSubstr("Wr0ngPassw0rd")));
  }
  const std::string table = fresh_table("auth");
  auto s = open_store(server->tcp_url(server->password()) + "?table=" + table);
  EXPECT_THAT(s->describe(), Not(HasSubstr(server->password())));
  EXPECT_THAT(s->acquire("s", "k", 1h, 1h), IsFreshlyAcquired());
}

TEST(PostgresPrivateServer, ReplaysWriteNoWalAndTakeNoTransactionId) {
  for (const char* mode : {"read-first", "write-first", "adaptive"}) {
    SCOPED_TRACE(mode);
    auto store = private_store(std::string("acquire=") + mode);
    AcquireResult a = store->acquire("s", "k", 1h, 1h);
    ASSERT_THAT(a, IsAcquired());
    ASSERT_THAT(store->complete("s", "k", std::get<Acquired>(a).lease.token, "v", 1h), IsDone());
    // Warm up: the first reads may prune the page the complete left a dead version on.
    for (int i = 0; i < 5; ++i) ASSERT_THAT(store->acquire("s", "k", 1h, 1h), IsReplay("v"));
    RawPg raw(server->socket_url());
    const std::string wal = "SELECT pg_current_wal_insert_lsn()";
    const std::string next_xid = "SELECT pg_snapshot_xmax(pg_current_snapshot())";
    const std::string lsn_before = raw.value(wal);
    const std::string xid_before = raw.value(next_xid);
    for (int i = 0; i < 200; ++i) ASSERT_THAT(store->acquire("s", "k", 1h, 1h), IsReplay("v"));
    EXPECT_EQ(raw.value(next_xid), xid_before);
    // Bytes of WAL in between: none from the replays (a background record, such as the
    // running-transactions note every 15 s, may appear; 200 commits would be kilobytes).
    EXPECT_LT(std::stoll(raw.value("SELECT " + wal.substr(7) + " - '" + lsn_before + "'::pg_lsn")),
              1000);
  }
}

// Issue 17: a hot standby as the URL served replays from its (possibly stale) copy while
// fresh keys failed with "cannot execute ... in a read-only transaction". A writable store
// refuses it when it opens; a read-only one opens and says that its records may lag.
TEST(PostgresStandby, AWritableStoreRefusesAHotStandbyAndAReadOnlyOneSaysItMayLag) {
  char pattern[] = "/tmp/idem-pg-standby-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  struct Destroy {
    std::string dir;
    ~Destroy() { server_script("destroy", dir); }
  } destroy{dir};
  const std::string port = server_script("start", dir);
  ASSERT_FALSE(port.empty());
  const std::string url = "postgresql:///idem_test?host=" + dir + "&port=" + port +
                          "&user=postgres&table=" + fresh_table("standby");
  {
    auto primary = open_store(url);
    const Token t = std::get<Acquired>(primary->acquire("s", "k", 1h, 1h)).lease.token;
    ASSERT_THAT(primary->complete("s", "k", t, "v", 1h), IsDone());
  }
  server_script("standby", dir);
  RawPg raw(url.substr(0, url.find("&table=")));
  ASSERT_EQ(raw.value("SELECT pg_is_in_recovery()"), "t");

  try {
    open_store(url);
    ADD_FAILURE() << "a writable store opened on a hot standby";
  } catch (const StoreUnavailable& e) {
    EXPECT_THAT(e.reason(),
                AllOf(HasSubstr("hot standby"), HasSubstr("primary"), HasSubstr("read-only")));
  }
  auto reader = open_store(url, OpenOptions{.read_only = true});
  EXPECT_THAT(reader->describe(), HasSubstr("may lag"));
  std::optional<Record> r = reader->get("s", "k");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->payload, "v");
}

}  // namespace
}  // namespace idem::testing
