// The crash soak, one test per store (docs/RELIABILITY.md, "Crash soak"). Worker processes
// (soak_worker.cpp) run a mixed workload through idem::Executor over a small key space while
// this controller SIGKILLs, SIGSTOPs and SIGCONTs them at random and, for server stores,
// kills its private server and starts it again. Afterwards the workers' logs and the store's
// final records are checked (soak_log.h): no key completed twice, every stored or replayed
// payload came from an action that ran with the token that completed it, and no completed
// record vanished before its TTL.
//
// Environment: IDEM_SOAK_SECONDS (default 30; 25 for PostgreSQL behind PgBouncer, the same
// store again), IDEM_SOAK_WORKERS (default 4) and
// IDEM_SOAK_SEED (default: from the clock; printed, and it replays the controller's choice
// of faults, not the machine's timing). A longer run: scripts/soak.sh. A server store's
// soak fails instead of skipping when its server program is missing and
// IDEM_REQUIRE_SERVERS=1.

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"
#include "soak/soak_log.h"
#include "support/require_server.h"
#include "support/server_script.h"
#include "support/worker_process.h"

#ifdef IDEM_SOAK_REDIS
#include "stores/redis/redis_test_util.h"
#endif

namespace idem::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr std::int64_t kExpiringTtlMs = 500;

long env_number(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::stol(v) : fallback;
}

// The store under soak: its URL and, for a server store, how to crash and restart it.
struct Target {
  std::string name;
  std::string url;
  std::function<void()> kill_server;  // null for an embedded store
  std::function<void()> restart_server;
  // SIGSTOP and SIGCONT for the server (null where the soak does not freeze it): calls in
  // flight time out, so replies to writes that took effect are lost.
  std::function<void()> pause_server;
  std::function<void()> resume_server;
  bool unique_tokens = true;  // SPEC §2: tokens unique across keys
  long default_seconds = 30;  // unless IDEM_SOAK_SECONDS says otherwise
  std::string check_url{};    // where the final records are read, when not `url`
  // Run before the final records are read (null: nothing to wait for), e.g. until a
  // failover has settled.
  std::function<void()> settle{};
  // Whether the server may be crashed now (null: always); a crash that is due waits for it.
  std::function<bool()> server_fault_ready{};
};

// A temporary directory, removed at the end.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/idem-soak-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct Figures {
  long killed = 0;
  long paused = 0;
  long server_restarts = 0;
  long server_pauses = 0;
  long workers_started = 0;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs the soak on `target`, with logs in `dir`.
void soak(const Target& target, const std::string& dir) {
  const long seconds = env_number("IDEM_SOAK_SECONDS", target.default_seconds);
  const long workers = env_number("IDEM_SOAK_WORKERS", 4);
  const std::uint64_t seed = static_cast<std::uint64_t>(env_number(
      "IDEM_SOAK_SEED", std::chrono::system_clock::now().time_since_epoch().count() % 1000000));
  const std::int64_t durable_ttl_ms = seconds * 1000 + 3'600'000;
  std::cout << "crash soak " << target.name << ": " << seconds << " s, " << workers
            << " workers, seed " << seed << " (IDEM_SOAK_SEED=" << seed << ")" << std::endl;
  std::mt19937_64 rng(seed);
  auto between = [&](long lo, long hi) { return lo + static_cast<long>(rng() % (hi - lo + 1)); };

  Figures figures;
  std::vector<std::string> logs;
  struct Slot {
    std::unique_ptr<Worker> worker;
    std::string log;
    bool paused = false;
    Clock::time_point resume_at;
  };
  auto spawn = [&](Slot& slot) {
    logs.push_back(dir + "/worker-" + std::to_string(logs.size()) + ".log");
    slot.log = logs.back();
    slot.worker = std::make_unique<Worker>(std::vector<std::string>{
        target.url, logs.back(), std::to_string(seed * 10'000 + logs.size()),
        std::to_string(kExpiringTtlMs), std::to_string(durable_ttl_ms)});
    slot.paused = false;
    ++figures.workers_started;
  };
  std::vector<Slot> slots(static_cast<std::size_t>(workers));
  for (Slot& s : slots) spawn(s);

  const auto end = Clock::now() + std::chrono::seconds(seconds);
  auto next_server_crash = Clock::now() + std::chrono::milliseconds(between(3000, 8000));
  while (Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(between(30, 250)));
    for (Slot& s : slots) {
      if (s.paused && Clock::now() >= s.resume_at) {
        s.worker->signal(SIGCONT);
        s.paused = false;
      }
      if (!s.paused) {
        if (std::optional<int> status = s.worker->exit_status()) {
          ADD_FAILURE() << "a soak worker exited by itself with status " << *status
                        << "; its log: " << s.log;
          spawn(s);
        }
      }
    }
    Slot& s = slots[rng() % slots.size()];
    const long roll = between(0, 99);
    if (roll < 25) {
      s.worker->signal(SIGKILL);
      s.worker->wait();
      ++figures.killed;
      spawn(s);
    } else if (roll < 60 && !s.paused) {
      // Up to five leases: long enough for other workers to steal what it holds.
      s.worker->stop();
      s.paused = true;
      s.resume_at = Clock::now() + std::chrono::milliseconds(between(50, 2000));
      ++figures.paused;
    }
    if (target.kill_server && Clock::now() >= next_server_crash &&
        (!target.server_fault_ready || target.server_fault_ready())) {
      const auto down_for = std::chrono::milliseconds(between(100, 1500));
      if (target.pause_server && between(0, 2) == 0) {
        target.pause_server();
        std::this_thread::sleep_for(down_for);
        target.resume_server();
        ++figures.server_pauses;
      } else {
        target.kill_server();
        std::this_thread::sleep_for(down_for);
        target.restart_server();
        ++figures.server_restarts;
      }
      next_server_crash = Clock::now() + std::chrono::milliseconds(between(3000, 8000));
    }
  }

  // The end: every worker resumes, finishes its calls and exits on its own.
  for (Slot& s : slots) {
    if (s.paused) s.worker->signal(SIGCONT);
  }
  for (Slot& s : slots) s.worker->write_line("stop");
  for (Slot& s : slots) EXPECT_EQ(s.worker->wait(), 0) << "a soak worker did not stop cleanly";

  if (target.settle) target.settle();
  std::vector<std::string> texts;
  for (const std::string& path : logs) texts.push_back(read_file(path));
  std::map<std::string, soak::FinalRecord> final_records;
  std::shared_ptr<Store> store =
      open_store(target.check_url.empty() ? target.url : target.check_url);
  for (const std::string& key : soak::keys_in_logs(texts)) {
    std::optional<Record> r = store->get("soak", key);
    if (!r) continue;
    soak::FinalRecord& f = final_records[key];
    f.complete = r->state == RecordState::kComplete;
    f.token = r->token;
    if (f.complete) f.digest = soak::digest(r->payload);
  }
  // After the reads: a completion whose TTL cannot have passed by now was there when read.
  const std::int64_t checked_at = soak::wall_ms();
  const soak::SoakRules rules{.expiring_ttl_ms = kExpiringTtlMs,
                              .durable_ttl_ms = durable_ttl_ms,
                              .unique_tokens_store_wide = target.unique_tokens};
  const soak::SoakReport report = soak::check_soak(texts, final_records, checked_at, rules);

  std::cout << "crash soak " << target.name << ": " << figures.workers_started
            << " worker processes, " << figures.killed << " killed (SIGKILL), " << figures.paused
            << " paused (SIGSTOP/SIGCONT), " << figures.server_restarts
            << " server crashes and restarts, " << figures.server_pauses << " server pauses; "
            << report.calls << " calls over " << report.keys << " keys: " << report.ran
            << " actions ran, " << report.completed << " completed, " << report.replays
            << " replays, " << report.busy << " busy, " << report.lost << " leases lost, "
            << report.released << " released (the action threw), " << report.unavailable
            << " store unavailable; " << report.purged << " records purged; " << report.torn
            << " log lines cut by a kill; violations " << report.violations.size() << std::endl;
  EXPECT_GT(report.completed, 0);
  EXPECT_GT(report.replays, 0);
  EXPECT_EQ(report.violations.size(), 0u);
  for (std::size_t i = 0; i < report.violations.size() && i < 30; ++i) {
    ADD_FAILURE() << report.violations[i];
  }
  if (::testing::Test::HasFailure()) {
    // Keep the logs for a look.
    const std::string kept = "/tmp/idem-soak-failed-" + std::to_string(::getpid());
    std::error_code ec;
    fs::copy(dir, kept, fs::copy_options::recursive, ec);
    std::cout << "the workers' logs are kept in " << kept << std::endl;
  }
}

TEST(CrashSoak, Sqlite) {
  TempDir dir;
  soak(Target{.name = "sqlite",
              .url = "sqlite://" + dir.path() + "/soak.db",
              .kill_server = nullptr,
              .restart_server = nullptr,
              .pause_server = nullptr,
              .resume_server = nullptr,
              .unique_tokens = true},
       dir.path());
}

#ifdef IDEM_PG_PRIVATE_SERVER_SCRIPT
TEST(CrashSoak, Postgres) {
  IDEM_SKIP_OR_FAIL_UNLESS(::geteuid() == 0 && fs::exists("/usr/lib/postgresql/15/bin/initdb"),
                           "the PostgreSQL soak needs root and PostgreSQL 15");
  TempDir logs;
  TempDir server;
  const std::string script = IDEM_PG_PRIVATE_SERVER_SCRIPT;
  struct Destroy {
    std::function<void()> f;
    ~Destroy() { f(); }
  } destroy{[&] { run_server_script(script, "destroy", server.path()); }};
  const std::string port = run_server_script(script, "start", server.path());
  ASSERT_FALSE(port.empty());
  // The workers use the unix socket in the server's directory, which trusts local users.
  // `pg_ctl stop -m immediate` ends the server without a checkpoint, as a crash would.
  soak(Target{.name = "postgres",
              .url = "postgresql:///idem_test?host=" + server.path() + "&port=" + port +
                     "&user=postgres&table=idem_soak",
              .kill_server = [&] { run_server_script(script, "stop", server.path()); },
              .restart_server = [&] { run_server_script(script, "resume", server.path()); },
              .pause_server = nullptr,
              .resume_server = nullptr,
              .unique_tokens = true},
       logs.path());
}
#endif

#ifdef IDEM_PG_PGBOUNCER_SCRIPT
// The PostgreSQL soak through a PgBouncer of its own in transaction pooling, in front of
// the private server the soak crashes and restarts: PgBouncer stays up and reconnects, and
// the workers' calls in flight when the server dies get PgBouncer's errors.
TEST(CrashSoak, PostgresPgbouncer) {
  IDEM_SKIP_OR_FAIL_UNLESS(::geteuid() == 0 && fs::exists("/usr/lib/postgresql/15/bin/initdb") &&
                               fs::exists("/usr/sbin/pgbouncer"),
                           "the PostgreSQL soak behind PgBouncer needs root, PostgreSQL 15 and "
                           "pgbouncer");
  TempDir logs;
  TempDir server;
  TempDir bouncer;
  const std::string script = IDEM_PG_PRIVATE_SERVER_SCRIPT;
  const std::string pgbouncer = IDEM_PG_PGBOUNCER_SCRIPT;
  struct Destroy {
    std::function<void()> f;
    ~Destroy() { f(); }
  } destroy{[&] {
    run_server_script(pgbouncer, "destroy", bouncer.path());
    run_server_script(script, "destroy", server.path());
  }};
  const std::string port = run_server_script(script, "start", server.path());
  ASSERT_FALSE(port.empty());
  // PgBouncer reaches the server through its unix socket, which trusts local users.
  const std::string bouncer_port =
      run_server_script(pgbouncer, "start", bouncer.path(), {"transaction", server.path(), port});
  ASSERT_FALSE(bouncer_port.empty());
  soak(Target{
           .name = "postgres-pgbouncer",
           .url = "postgresql://postgres@127.0.0.1:" + bouncer_port + "/idem_test?table=idem_soak",
           .kill_server = [&] { run_server_script(script, "stop", server.path()); },
           .restart_server = [&] { run_server_script(script, "resume", server.path()); },
           .pause_server = nullptr,
           .resume_server = nullptr,
           .unique_tokens = true,
           .default_seconds = 25,
           // From the server itself: after a crash PgBouncer refuses new clients for
           // server_login_retry (15 s by default) once a login to the server has failed.
           .check_url = "postgresql:///idem_test?host=" + server.path() + "&port=" + port +
                        "&user=postgres&table=idem_soak"},
       logs.path());
}
#endif

#ifdef IDEM_SOAK_REDIS
TEST(CrashSoak, Redis) {
  IDEM_SKIP_OR_FAIL_UNLESS(have_program("redis-server"), "redis-server is not installed");
  TempDir logs;
  // With AOF and `appendfsync always` Redis writes every change to its log before it
  // answers, so a SIGKILL loses nothing it acknowledged (docs/stores/redis.md); without
  // persistence a restart would forget every record, which the soak would rightly report.
  PrivateRedis server({"--appendonly", "yes", "--appendfsync", "always"});
  ASSERT_TRUE(server.ok());
  // A call times out after 300 ms (5 s by default), so that a paused server loses replies.
  soak(Target{.name = "redis",
              .url = server.url() + "?timeout=300",
              .kill_server = [&] { server.kill(); },
              .restart_server = [&] { server.restart(); },
              .pause_server = [&] { server.pause(); },
              .resume_server = [&] { server.resume(); },
              // SPEC §2: Redis tokens are per key.
              .unique_tokens = false},
       logs.path());
}

// The same over TLS (rediss://): a private server with a TLS port, the certificates that
// scripts/servers.sh made for the TLS server (IDEM_TEST_REDIS_TLS_DIR), 25 s of soak unless
// IDEM_SOAK_SECONDS says otherwise. Every reconnection after a crash is a new handshake.
TEST(CrashSoak, RedisTls) {
  IDEM_SKIP_OR_FAIL_UNLESS(have_program("redis-server"), "redis-server is not installed");
  const char* certs = std::getenv("IDEM_TEST_REDIS_TLS_DIR");
  IDEM_SKIP_OR_FAIL_UNLESS(certs != nullptr && *certs != '\0',
                           "IDEM_TEST_REDIS_TLS_DIR is not set (scripts/servers.sh, "
                           "idem_start_redis_tls)");
  const std::string dir = certs;
  TempDir logs;
  const int tls_port = unused_port();
  PrivateRedis server({"--appendonly", "yes", "--appendfsync", "always", "--tls-port",
                       std::to_string(tls_port), "--tls-cert-file", dir + "/server.crt",
                       "--tls-key-file", dir + "/server.key", "--tls-ca-cert-file", dir + "/ca.crt",
                       "--tls-auth-clients", "no"});
  ASSERT_TRUE(server.ok());
  soak(Target{.name = "redis_tls",
              .url = "rediss://127.0.0.1:" + std::to_string(tls_port) +
                     "/0?timeout=300&tls_ca=" + dir + "/ca.crt",
              .kill_server = [&] { server.kill(); },
              .restart_server = [&] { server.restart(); },
              .pause_server = [&] { server.pause(); },
              .resume_server = [&] { server.resume(); },
              .unique_tokens = false,
              .default_seconds = 25},
       logs.path());
}

// On Redis Cluster (redis+cluster://): three primaries of the test's own (no replicas, each
// with `appendfsync always`), all killed and restarted together or paused together, so the
// cluster comes back as it was (nodes.conf and each node's AOF) and no acknowledged write
// is lost; the client's routing, slot map and reconnections go through every crash. A
// failover, where an unreplicated write can be lost, is redis_cluster_test's (with
// wait_replicas=1). 25 s of soak unless IDEM_SOAK_SECONDS says otherwise.
TEST(CrashSoak, RedisCluster) {
  IDEM_SKIP_OR_FAIL_UNLESS(have_program("redis-server") && have_program("redis-cli"),
                           "redis-server or redis-cli is not installed");
  TempDir logs;
  std::vector<std::unique_ptr<PrivateRedis>> nodes;
  std::string seeds;
  std::string create = "redis-cli --cluster create";
  while (nodes.size() < 3) {
    auto node = std::make_unique<PrivateRedis>(std::vector<std::string>{
        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout",
        "2000", "--appendonly", "yes", "--appendfsync", "always"});
    ASSERT_TRUE(node->ok());
    // A node's cluster bus listens on its port + 10000.
    if (node->port() > 65535 - 10000) continue;
    const std::string address = "127.0.0.1:" + std::to_string(node->port());
    seeds += (nodes.empty() ? "" : ",") + address;
    create += " " + address;
    nodes.push_back(std::move(node));
  }
  const std::string created = logs.path() + "/cluster-create.log";
  ASSERT_EQ(
      std::system((create + " --cluster-replicas 0 --cluster-yes >" + created + " 2>&1").c_str()),
      0)
      << std::ifstream(created).rdbuf();
  const auto cluster_ok = [&] {
    for (const auto& node : nodes) {
      const std::string check = "redis-cli -p " + std::to_string(node->port()) +
                                " cluster info 2>/dev/null | grep -q cluster_state:ok";
      if (std::system(check.c_str()) != 0) return false;
    }
    return true;
  };
  const auto wait_until_ok = [&] {
    for (int i = 0; i < 400 && !cluster_ok(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return cluster_ok();
  };
  ASSERT_TRUE(wait_until_ok()) << "the private cluster did not come up";
  const auto each = [&](void (PrivateRedis::*step)()) {
    return [&nodes, step] {
      for (const auto& node : nodes) ((*node).*step)();
    };
  };
  // After a restart the nodes find each other again (nodes.conf) before the cluster serves.
  const auto restart = [&] {
    each (&PrivateRedis::restart)();
    EXPECT_TRUE(wait_until_ok()) << "the private cluster did not come back";
  };
  soak(Target{.name = "redis_cluster",
              .url = "redis+cluster://" + seeds + "/0?timeout=300",
              .kill_server = each(&PrivateRedis::kill),
              .restart_server = restart,
              .pause_server = each(&PrivateRedis::pause),
              .resume_server = each(&PrivateRedis::resume),
              // SPEC §2: Redis tokens are per key.
              .unique_tokens = false,
              .default_seconds = 25},
       logs.path());
}

// Behind Sentinel (redis+sentinel://): a primary and a replica of the test's own (each with
// `appendfsync always`) and one sentinel (quorum 1; a primary silent for 1 s is judged
// down), with wait_replicas=1. A server crash kills or pauses the primary of the moment, as
// the sentinel names it: down long enough, the sentinel promotes the replica, and the old
// primary comes back from its own log as a primary until it is made the new one's replica
// (it then drops what it held for the new primary's data); the next crash waits until
// that has happened. With wait_replicas=1 nothing reported recorded is lost to a failover,
// and the store follows the sentinel, never the stale primary (docs/stores/redis.md). 25 s
// of soak unless IDEM_SOAK_SECONDS says otherwise.
TEST(CrashSoak, RedisSentinel) {
  IDEM_SKIP_OR_FAIL_UNLESS(have_program("redis-server"), "redis-server is not installed");
  TempDir logs;
  // A replica's full sync starts at once (Redis 7 waits 5 s by default for more replicas).
  const std::vector<std::string> durable = {
      "--appendonly", "yes", "--appendfsync", "always", "--repl-diskless-sync-delay", "0"};
  // Made a replica by a command, not by its arguments, so that a restart brings each server
  // back as the sentinel left it to be told what it is now, not as it was at first.
  PrivateRedis first(durable);
  PrivateRedis second(durable);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_EQ(RawRedis(second.port()).text({"REPLICAOF", "127.0.0.1", std::to_string(first.port())}),
            "OK");
  PrivateRedis sentinel({"--sentinel"}, {},
                        "sentinel monitor soak 127.0.0.1 " + std::to_string(first.port()) +
                            " 1\n"
                            "sentinel down-after-milliseconds soak 1000\n"
                            "sentinel failover-timeout soak 2000\n");
  ASSERT_TRUE(sentinel.ok());
  const auto primary_port = [&]() -> int {
    RawRedis ask(sentinel.port());
    RawReply r = ask.command({"SENTINEL", "get-master-addr-by-name", "soak"});
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) return 0;
    return std::atoi(r->element[1]->str);
  };
  // Settled: the primary the sentinel names says it is one and its replica is in sync, and
  // the sentinel knows the replica (it can fail over to it).
  const auto settled = [&] {
    const int port = primary_port();
    if (port != first.port() && port != second.port()) return false;
    RawRedis primary(port);
    if (!primary.connected()) return false;
    const std::string info = primary.text({"INFO", "replication"});
    if (info.find("role:master") == std::string::npos ||
        info.find("connected_slaves:1") == std::string::npos ||
        info.find("state=online") == std::string::npos) {
      return false;
    }
    // And neither server is rewriting its AOF: a replica rewrites it after a full sync, and
    // until that rewrite is done its AOF on disk is not what it holds (Redis 7's
    // AOF_WAIT_REWRITE), so a crash of it as a new primary would bring back old data.
    for (const PrivateRedis* server : {&first, &second}) {
      const std::string persistence = RawRedis(server->port()).text({"INFO", "persistence"});
      if (persistence.find("aof_rewrite_in_progress:0") == std::string::npos ||
          persistence.find("aof_rewrite_scheduled:0") == std::string::npos ||
          persistence.find("loading:0") == std::string::npos) {
        return false;
      }
    }
    RawRedis ask(sentinel.port());
    RawReply replicas = ask.command({"SENTINEL", "replicas", "soak"});
    return replicas && replicas->type == REDIS_REPLY_ARRAY && replicas->elements == 1;
  };
  const auto wait_until_settled = [&] {
    for (int i = 0; i < 600 && !settled(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(settled()) << "the primary, its replica and the sentinel did not settle";
  };
  wait_until_settled();
  PrivateRedis* down = nullptr;
  int last_primary = first.port();
  int failovers = 0;
  const auto current = [&]() -> PrivateRedis& {
    const int port = primary_port();
    if (port != last_primary) ++failovers;
    last_primary = port;
    return port == second.port() ? second : first;
  };
  soak(Target{
           .name = "redis_sentinel",
           .url = "redis+sentinel://127.0.0.1:" + std::to_string(sentinel.port()) +
                  "/soak?timeout=300&wait_replicas=1",
           .kill_server =
               [&] {
                 down = &current();
                 down->kill();
               },
           .restart_server =
               [&] {
                 down->restart();
                 // Failed over while it was down: it is made the new primary's replica
                 // at once, as the sentinel would do at its next look (up to 10 s later).
                 const int primary = primary_port();
                 if (primary != 0 && primary != down->port()) {
                   RawRedis(down->port()).text({"REPLICAOF", "127.0.0.1", std::to_string(primary)});
                 }
               },
           .pause_server =
               [&] {
                 down = &current();
                 down->pause();
               },
           .resume_server = [&] { down->resume(); },
           // SPEC §2: Redis tokens are per key.
           .unique_tokens = false,
           .default_seconds = 25,
           .settle = wait_until_settled,
           // A failover takes the sentinel a few seconds to finish (the old primary is
           // made a replica about 5 s after it came back), and with wait_replicas=1
           // nothing is recorded until then: the next crash waits for it, or the
           // soak would spend its time with no primary that can confirm a write.
           .server_fault_ready = settled},
       logs.path());
  (void)current();
  std::cout << "crash soak redis_sentinel: " << failovers << " failovers seen" << std::endl;
}
#endif

}  // namespace
}  // namespace idem::testing
