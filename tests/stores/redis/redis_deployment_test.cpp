// The Redis store in the deployments it meets in production (issue 18; docs/stores/redis.md,
// "Setups and what holds on each"), each on real servers: a replica whose link is cut and a
// failover to it under wait_replicas, evicting memory policies, ACL users denied each
// command the scripts use, the server's clock stepped back and forward during a storm,
// foreign data under an idem key, and records whose keys lost their expiry. Servers that a
// test pauses, kills or reconfigures are its own (PrivateRedis); the rest use the shared one.

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.h"
#include "idem/executor.h"
#include "idem/open_store.h"
#include "idem/stores/redis_store.h"
#include "idem/testing/matchers.h"
#include "stores/redis/redis_layout.h"
#include "stores/redis/redis_test_util.h"
#include "support/eventually.h"
#ifdef IDEM_BINARY
#include "cli/process.h"
#endif

namespace idem::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The server's clock, in ms (TIME).
std::int64_t server_ms(RawRedis& raw) {
  RawReply r = raw.command({"TIME"});
  if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
    ADD_FAILURE() << "TIME failed";
    return 0;
  }
  return std::atoll(r->element[0]->str) * 1000 + std::atoll(r->element[1]->str) / 1000;
}

// A primary and a replica of it, each a private server.
struct ReplicaPair {
  PrivateRedis primary;
  PrivateRedis replica{{"--replicaof", "127.0.0.1", std::to_string(primary.port())}};

  // Both up and the replica in sync with the primary.
  bool ready() {
    if (!primary.ok() || !replica.ok()) return false;
    RawRedis p(primary.port());
    RawRedis r(replica.port());
    return eventually([&] {
      return p.text({"INFO", "replication"}).find("connected_slaves:1") != std::string::npos &&
             r.text({"INFO", "replication"}).find("master_link_status:up") != std::string::npos;
    });
  }
};

// WAIT for the replica up to 1 s: long enough that a replica whose link is up always
// answers in time on a loaded machine.
RedisStoreOptions waiting_for_one_replica(RedisStoreOptions o) {
  o.wait_replicas = 1;
  o.wait_timeout = 1s;
  return o;
}

// --- 1. wait_replicas: a complete the replicas did not confirm ----------------------------

TEST_F(PrivateRedisTest, ACompleteTheReplicasDidNotConfirmIsNeverReportedRecorded) {
  ReplicaPair servers;
  ASSERT_TRUE(servers.ready());
  const RedisStoreOptions o = waiting_for_one_replica(servers.primary.options());
  auto store = std::make_shared<RedisStore>(o);
  Executor executor(store, ExecutorOptions{.lease = 1s});
  ASSERT_EQ(executor.run("s", "replicated", [](const Attempt&) { return std::string("v"); }).value,
            "v");

  // The replica's link is cut (SIGSTOP) while the action runs, after its acquire was
  // acknowledged. The primary takes the complete, WAIT reports 0 replicas, and a read of the
  // primary shows the result: neither run() nor a handle's complete() may report it
  // recorded.
  auto expect_told = [&](const StoreUnavailable& e) {
    EXPECT_TRUE(e.unconfirmed());
    EXPECT_THAT(e.what(), AllOf(HasSubstr("only 0 of 1 replicas acknowledged"),
                                HasSubstr("may or may not have been recorded")));
  };
  try {
    (void)executor.run("s", "by-run", [&](const Attempt&) {
      servers.replica.pause();
      return std::string("v");
    });
    ADD_FAILURE() << "run() reported a result the replica never acknowledged as recorded";
  } catch (const StoreUnavailable& e) {
    expect_told(e);
  }
  servers.replica.resume();
  {
    auto begun = executor.begin("s", "by-handle");
    ASSERT_NE(begun.handle(), nullptr);
    servers.replica.pause();
    try {
      (void)begun.handle()->complete(std::string("v"));
      ADD_FAILURE() << "complete() reported a result the replica never acknowledged as recorded";
    } catch (const StoreUnavailable& e) {
      expect_told(e);
    }
    servers.replica.resume();
  }
  for (const char* key : {"by-run", "by-handle"}) {
    EXPECT_EQ(store->get("s", key).value().state, RecordState::kComplete) << key;
  }

  // The link back before the lease ends: the executor's repeated complete is confirmed,
  // and the result is recorded on the replica too.
  Executor patient(store, ExecutorOptions{.lease = 20s});
  RawRedis on_primary(servers.primary.port());
  const std::string late_key = redis::record_key(o.prefix, "s", "late");
  std::thread resume;
  const auto r = patient.run("s", "late", [&](const Attempt&) {
    servers.replica.pause();
    resume = std::thread([&] {
      EXPECT_TRUE(eventually([&] {
        const auto rec = redis::decode_record(on_primary.text({"GET", late_key}));
        return rec && rec->kind == redis::kKindComplete;
      }));
      servers.replica.resume();
    });
    return std::string("late");
  });
  resume.join();
  EXPECT_EQ(r.value, "late");
  EXPECT_FALSE(r.replayed);
  RawRedis on_replica(servers.replica.port());
  const std::string stored = on_replica.text({"GET", late_key});  // the record views into it
  const auto copy = redis::decode_record(stored);
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->payload, "late");
}

// Nor is such a result handed to a duplicate as a replay: a failover to the replica would
// bring back the key's IN_PROGRESS record, its lease would run out and the action would run
// again, after a caller was told it had run (the Sentinel crash soak found it). On both
// replay paths: the acquire script, and a GET first (replay=get).
TEST_F(PrivateRedisTest, AResultTheReplicasDidNotConfirmIsNotReplayed) {
  ReplicaPair servers;
  ASSERT_TRUE(servers.ready());
  for (const RedisReplayPath path : {RedisReplayPath::kScript, RedisReplayPath::kGet}) {
    SCOPED_TRACE(path == RedisReplayPath::kGet ? "replay=get" : "replay=script");
    RedisStoreOptions o = waiting_for_one_replica(servers.primary.options());
    o.wait_timeout = 200ms;
    o.replay = path;
    RedisStore store(o);
    const AcquireResult first = store.acquire("s", "k", 10s, 1h);
    ASSERT_TRUE(std::holds_alternative<Acquired>(first));
    const Token token = std::get<Acquired>(first).lease.token;
    servers.replica.pause();
    EXPECT_THROW((void)store.complete("s", "k", token, "v", 1h), StoreUnavailable);
    try {
      (void)store.acquire("s", "k", 10s, 1h);
      ADD_FAILURE() << "a result the replica does not have was replayed";
    } catch (const StoreUnavailable& e) {
      EXPECT_THAT(e.what(), AllOf(HasSubstr("only 0 of 1 replicas acknowledged it"),
                                  HasSubstr("it is not replayed")));
      EXPECT_FALSE(e.unconfirmed());
    }
    servers.replica.resume();
    // Once the replica has it, it replays.
    EXPECT_TRUE(eventually([&] {
      try {
        const AcquireResult again = store.acquire("s", "k", 10s, 1h);
        return std::holds_alternative<Replay>(again) && std::get<Replay>(again).payload == "v";
      } catch (const StoreUnavailable&) {
        return false;
      }
    }));
  }
}

TEST_F(PrivateRedisTest, ARepeatedCompleteIsConfirmedOnlyOnceTheReplicasHaveTheFirstWrite) {
  // WAIT counts the writes of the connection it is sent on. A repeated complete that wrote
  // nothing would be "confirmed" by a connection whose earlier writes the replica has, while
  // the first complete, sent on another connection, is on the primary only.
  ReplicaPair servers;
  ASSERT_TRUE(servers.ready());
  RedisStoreOptions o = waiting_for_one_replica(servers.primary.options());
  o.connections = 2;
  auto store = std::make_shared<RedisStore>(o);
  // Acknowledged writes on both connections (idle calls alternate between them).
  for (int i = 0; i < 4; ++i) {
    const std::string key = "warm-" + std::to_string(i);
    const Lease lease = std::get<Acquired>(store->acquire("s", key, 30s, 1h)).lease;
    ASSERT_THAT(store->complete("s", key, lease.token, "w", 1h), IsDone());
  }
  const Lease lease = std::get<Acquired>(store->acquire("s", "k", 30s, 1h)).lease;
  servers.replica.pause();
  for (int attempt = 0; attempt < 4; ++attempt) {
    SCOPED_TRACE(attempt);
    const auto e =
        expect_unavailable([&] { (void)store->complete("s", "k", lease.token, "result", 1h); },
                           {"only 0 of 1 replicas acknowledged"});
    EXPECT_TRUE(e && e->unconfirmed());
  }
  servers.replica.resume();
  EXPECT_THAT(store->complete("s", "k", lease.token, "result", 1h), IsDone());
  RawRedis on_replica(servers.replica.port());
  const std::string stored = on_replica.text({"GET", redis::record_key(o.prefix, "s", "k")});
  const auto copy = redis::decode_record(stored);  // views into `stored`
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->kind, redis::kKindComplete);
  EXPECT_EQ(copy->payload, "result");
}

#ifdef IDEM_BINARY
// `idem run` of a command that counts its runs in `runs_file`; with `go_file`, the command
// first says it started (runs_file + ".started") and waits until `go_file` exists.
cli::test::ProcessResult idem_run(const std::string& url, const std::string& key,
                                  const std::string& runs_file, const std::string& go_file = "") {
  std::string script = "echo ran >> '" + runs_file + "'";
  if (!go_file.empty()) {
    script += "; touch '" + runs_file + ".started'; while [ ! -e '" + go_file +
              "' ]; do sleep 0.01; done";
  }
  return cli::test::run_process({IDEM_BINARY, "run", "--store", url, "--key", key, "--lease", "1s",
                                 "--wait", "10s", "--", "sh", "-c", script + "; echo out"},
                                {});
}

int lines(const std::string& file) {
  std::ifstream in(file);
  int n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}
#endif

TEST_F(PrivateRedisTest, AFailoverLosesNothingReportedRecordedAndRunsNothingTwiceUntold) {
  ReplicaPair servers;
  ASSERT_TRUE(servers.ready());
  const RedisStoreOptions o = waiting_for_one_replica(servers.primary.options());
  std::mutex mu;
  std::map<std::string, int> runs;  // the action's runs per key
  std::map<std::string, int> told;  // "may or may not have been recorded", per key
  std::set<std::string> recorded;   // reported recorded (a fresh result)
  std::atomic<int> started{0};
  std::atomic<bool> go{true};
  auto call = [&](Executor& executor, const std::string& key) {
    try {
      const auto r = executor.run("s", key, [&](const Attempt&) {
        {
          std::lock_guard lock(mu);
          ++runs[key];
        }
        ++started;
        while (!go) std::this_thread::sleep_for(1ms);
        return key;
      });
      std::lock_guard lock(mu);
      if (!r.replayed) recorded.insert(key);
    } catch (const StoreUnavailable& e) {
      std::lock_guard lock(mu);
      if (std::string(e.what()).find("may or may not have been recorded") == std::string::npos) {
        ADD_FAILURE() << key << ": " << e.what();
      }
      ++told[key];
    } catch (const std::exception& e) {
      ADD_FAILURE() << key << ": " << e.what();
    }
  };
  std::vector<std::string> up_keys, cut_keys;
  for (int i = 0; i < 10; ++i) up_keys.push_back("up-" + std::to_string(i));
  for (int i = 0; i < 3; ++i) cut_keys.push_back("cut-" + std::to_string(i));
#ifdef IDEM_BINARY
  const std::string tool_url = "redis://127.0.0.1:" + std::to_string(servers.primary.port()) +
                               "/0?wait_replicas=1&wait_timeout=1000&prefix=" + o.prefix;
  const std::string dir = servers.primary.dir();
#endif
  {
    auto store = std::make_shared<RedisStore>(o);
    Executor executor(store, ExecutorOptions{.lease = 1s});
    // With the replica up every result is recorded.
    for (const auto& key : up_keys) call(executor, key);
#ifdef IDEM_BINARY
    const auto up = idem_run(tool_url, "tool-up", dir + "/tool-up");
    EXPECT_EQ(up.status, 0) << up.err;
#endif
    // The replica's link is cut while actions run (their acquires were acknowledged): none
    // of their results may be reported recorded, by the executor or by the tool (exit 76).
    // It is cut by promoting the replica at once (REPLICAOF NO ONE), so that it holds exactly
    // what it had then: a replica stopped with SIGSTOP would still find, once resumed, the
    // writes that reached its socket's buffer.
    go = false;
    std::vector<std::thread> callers;
    for (const auto& key : cut_keys) callers.emplace_back([&, key] { call(executor, key); });
#ifdef IDEM_BINARY
    cli::test::ProcessResult cut;
    callers.emplace_back(
        [&] { cut = idem_run(tool_url, "tool-cut", dir + "/tool-cut", dir + "/go"); });
    EXPECT_TRUE(eventually([&] { return std::filesystem::exists(dir + "/tool-cut.started"); }));
#endif
    EXPECT_TRUE(eventually([&] { return started >= 13; }));
    ASSERT_EQ(RawRedis(servers.replica.port()).text({"REPLICAOF", "NO", "ONE"}), "OK");
#ifdef IDEM_BINARY
    std::ofstream(dir + "/go").put('\n');
#endif
    go = true;
    for (auto& t : callers) t.join();
#ifdef IDEM_BINARY
    EXPECT_EQ(cut.status, 76) << cut.err;
    EXPECT_THAT(cut.err, HasSubstr("may or may not have been recorded"));
#endif
  }
  EXPECT_EQ(recorded.size(), up_keys.size());
  EXPECT_EQ(told.size(), cut_keys.size());
  const std::set<std::string> recorded_before = recorded;

  // Failover: the primary dies; the replica, promoted already, takes over.
  servers.primary.kill();
  RedisStoreOptions after = o;
  after.port = servers.replica.port();
  after.wait_replicas = 0;
  auto store = std::make_shared<RedisStore>(after);
  // The cut keys' leases were replicated: their next callers wait for them to end.
  Executor executor(store, ExecutorOptions{.lease = 1s, .wait = WaitPolicy{.max_wait = 10s}});
  for (const auto& key : up_keys) call(executor, key);
  for (const auto& key : cut_keys) call(executor, key);
  for (const auto* keys : {&up_keys, &cut_keys}) {
    for (const auto& key : *keys) {
      SCOPED_TRACE(key);
      // Nothing reported recorded is lost: it replays, it does not run again.
      if (recorded_before.count(key) != 0) {
        EXPECT_EQ(runs[key], 1);
      }
      // Nothing runs twice without its caller having been told "may or may not".
      EXPECT_LE(runs[key], 1 + told[key]);
    }
  }
#ifdef IDEM_BINARY
  const std::string new_url =
      "redis://127.0.0.1:" + std::to_string(servers.replica.port()) + "/0?prefix=" + o.prefix;
  EXPECT_EQ(idem_run(new_url, "tool-up", dir + "/tool-up").status, 0);
  EXPECT_EQ(lines(dir + "/tool-up"), 1);  // replayed, not run again
  const auto again = idem_run(new_url, "tool-cut", dir + "/tool-cut");
  EXPECT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(lines(dir + "/tool-cut"), 2) << again.err;  // its first run exited 76: told
#endif
  std::cout << "[ failover ] " << recorded_before.size()
            << " results recorded before it, all kept; " << cut_keys.size()
            << " callers told \"may or may not\", whose keys ran again after it\n";
}

// Behind Sentinel, a failover the store got no +switch-master for (it happened while the
// store opened, or while its watch moved between sentinels): once subscribed again, the
// store asks the sentinel which server is the primary and moves there, rather than writing
// on the old primary until it is made a replica (writes that are then lost). Made without
// any event: the sentinel is told to monitor another server (SENTINEL REMOVE and MONITOR
// publish no +switch-master), then the store's subscription is cut (CLIENT KILL TYPE
// pubsub). Its own servers and sentinel: the shared ones must not be reconfigured.
TEST_F(PrivateRedisTest, AFailoverNoEventToldOfIsFoundByAskingTheSentinelOnceSubscribed) {
  PrivateRedis old_primary;
  PrivateRedis new_primary;
  ASSERT_TRUE(old_primary.ok() && new_primary.ok());
  PrivateRedis sentinel({"--sentinel"}, {}, sentinel_config("quiet", old_primary.port(), 60000));
  ASSERT_TRUE(sentinel.ok());
  const std::string prefix = fresh_prefix("sentinel-quiet");
  auto opened = open_store("redis+sentinel://127.0.0.1:" + std::to_string(sentinel.port()) +
                           "/quiet?connections=2&prefix=" + prefix);
  auto& store = dynamic_cast<RedisStore&>(*opened);
  ASSERT_TRUE(eventually([&] { return store.stats().switch_events; }));
  const std::uint64_t switches = store.stats().primary_switches;
  EXPECT_EQ(switches, 0U) << "asking moved a store that was on the primary";
  auto record = [&](const std::string& key) {
    const AcquireResult r = store.acquire("s", key, 5000ms, 60000ms);
    ASSERT_TRUE(std::holds_alternative<Acquired>(r)) << key;
    EXPECT_EQ(store.complete("s", key, std::get<Acquired>(r).lease.token, "v", 60000ms),
              WriteResult::kDone);
  };
  record("before");
  RawRedis old_raw(old_primary.port());
  RawRedis new_raw(new_primary.port());
  EXPECT_EQ(old_raw.integer({"EXISTS", redis::record_key(prefix, "s", "before")}), 1);

  RawRedis ask(sentinel.port());
  ASSERT_EQ(ask.text({"SENTINEL", "REMOVE", "quiet"}), "OK");
  ASSERT_EQ(ask.text({"SENTINEL", "MONITOR", "quiet", "127.0.0.1",
                      std::to_string(new_primary.port()), "1"}),
            "OK");
  EXPECT_GE(ask.integer({"CLIENT", "KILL", "TYPE", "pubsub"}), 1) << "the watch was not there";
  ASSERT_TRUE(eventually([&] { return store.stats().primary_switches > switches; }))
      << "the store stayed on the old primary";
  // The old primary still takes writes (nobody made it a replica): only asking moved the
  // store, and every call from now on lands on the new one.
  for (int i = 0; i < 4; ++i) {
    const std::string key = "after-" + std::to_string(i);
    record(key);
    EXPECT_EQ(new_raw.integer({"EXISTS", redis::record_key(prefix, "s", key)}), 1) << key;
    EXPECT_EQ(old_raw.integer({"EXISTS", redis::record_key(prefix, "s", key)}), 0) << key;
  }
  EXPECT_TRUE(store.stats().switch_events);
}

// Behind Sentinel, a sentinel that has not caught up with a failover the store already
// followed (it names the old primary, in an older configuration epoch) must not move the
// store back when the store's watch moves to it. Two sentinels that never meet: the first
// fails its service over (epoch 1); the second monitors another server under the same
// name (epoch 0). The store follows the first; once it is killed, its watch subscribes on
// the second, asks, and stays; and its connections, broken then, come back to the
// promoted replica too.
TEST_F(PrivateRedisTest, ASentinelBehindOnTheFailoverDoesNotMoveTheStoreBack) {
  PrivateRedis first_primary;
  PrivateRedis replica;
  PrivateRedis stale_primary;
  ASSERT_TRUE(first_primary.ok() && replica.ok() && stale_primary.ok());
  ASSERT_EQ(RawRedis(replica.port())
                .text({"REPLICAOF", "127.0.0.1", std::to_string(first_primary.port())}),
            "OK");
  PrivateRedis current({"--sentinel"}, {}, sentinel_config("epochs", first_primary.port(), 1000));
  PrivateRedis behind({"--sentinel"}, {}, sentinel_config("epochs", stale_primary.port(), 60000));
  ASSERT_TRUE(current.ok() && behind.ok());
  RawRedis ask_current(current.port());
  ASSERT_TRUE(ready_to_fail_over(ask_current, "epochs", first_primary.port()));
  ASSERT_EQ(ask_current.text({"SENTINEL", "FAILOVER", "epochs"}), "OK");
  // Done: SENTINEL MASTER names the promoted replica (it names the old primary until the
  // switch, in the new epoch already), in epoch 1.
  auto master_field = [&](const std::string& field) {
    RawReply r = ask_current.command({"SENTINEL", "MASTER", "epochs"});
    for (std::size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2) {
      if (std::string(r->element[i]->str, r->element[i]->len) == field)
        return std::string(r->element[i + 1]->str, r->element[i + 1]->len);
    }
    return std::string();
  };
  ASSERT_TRUE(eventually([&] { return master_field("port") == std::to_string(replica.port()); }));
  ASSERT_EQ(master_field("config-epoch"), "1");

  const std::string prefix = fresh_prefix("sentinel-behind");
  auto opened = open_store("redis+sentinel://127.0.0.1:" + std::to_string(current.port()) +
                           ",127.0.0.1:" + std::to_string(behind.port()) +
                           "/epochs?connections=2&prefix=" + prefix);
  auto& store = dynamic_cast<RedisStore&>(*opened);
  ASSERT_TRUE(eventually([&] { return store.stats().switch_events; }));
  auto record_lands_on_the_promoted_replica = [&](const std::string& key) {
    // A connection the server closed fails the one call on it, then reconnects.
    std::optional<AcquireResult> acquired;
    for (int attempt = 0; attempt < 10 && !acquired; ++attempt) {
      try {
        acquired = store.acquire("s", key, 5000ms, 60000ms);
      } catch (const StoreUnavailable&) {
        std::this_thread::sleep_for(50ms);
      }
    }
    ASSERT_TRUE(acquired.has_value()) << key;
    const AcquireResult& r = *acquired;
    ASSERT_TRUE(std::holds_alternative<Acquired>(r)) << key;
    EXPECT_EQ(store.complete("s", key, std::get<Acquired>(r).lease.token, "v", 60000ms),
              WriteResult::kDone);
    EXPECT_EQ(RawRedis(replica.port()).integer({"EXISTS", redis::record_key(prefix, "s", key)}), 1)
        << key;
    EXPECT_EQ(
        RawRedis(stale_primary.port()).integer({"EXISTS", redis::record_key(prefix, "s", key)}), 0)
        << key;
  };
  record_lands_on_the_promoted_replica("before");

  current.kill();
  // The watch is on the sentinel behind once it is subscribed there and has asked (its
  // subscription there can only begin after the one on the killed sentinel ended).
  RawRedis ask_behind(behind.port());
  ASSERT_TRUE(eventually([&] {
    return ask_behind.text({"CLIENT", "LIST", "TYPE", "pubsub"}).find("cmd=") !=
               std::string::npos &&
           store.stats().switch_events;
  }));
  EXPECT_EQ(store.stats().primary_switches, 0U) << "moved to the server of an older epoch";
  for (int i = 0; i < 4; ++i) record_lands_on_the_promoted_replica("after-" + std::to_string(i));
  // The connections broken now come back to the primary the store follows, not to the one
  // the first sentinel that answers names (the one behind; the other is dead).
  const std::uint64_t reconnects = store.stats().reconnects;
  EXPECT_GE(RawRedis(replica.port()).integer({"CLIENT", "KILL", "TYPE", "normal"}), 2);
  for (int i = 0; i < 4; ++i) record_lands_on_the_promoted_replica("again-" + std::to_string(i));
  EXPECT_GE(store.stats().reconnects, reconnects + 1);
}

// A cluster of the test's own: one primary holding every slot and one replica of it (the
// shared cluster must not be failed over: other tests run on it). Each node's bus port is
// chosen free (port + 10000 may be past 65535).
struct PrivateCluster {
  static std::vector<std::string> node_args(int bus_port) {
    std::vector<std::string> args = {"--cluster-enabled", "yes", "--cluster-node-timeout", "2000"};
    args.insert(args.end(), {"--cluster-port", std::to_string(bus_port)});
    return args;
  }
  int primary_bus = unused_port();
  PrivateRedis primary{node_args(primary_bus)};
  PrivateRedis replica{node_args(unused_port())};

  static std::string role(int port) {
    RawReply r = RawRedis(port).command({"ROLE"});
    return r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 ? r->element[0]->str : "";
  }
  static bool cluster_ok(int port) {
    return RawRedis(port).text({"CLUSTER", "INFO"}).find("cluster_state:ok") != std::string::npos;
  }

  // Slots assigned, the replica attached and in sync, both nodes seeing the cluster ok.
  bool ready() {
    if (!primary.ok() || !replica.ok()) return false;
    RawRedis p(primary.port());
    RawRedis r(replica.port());
    if (p.text({"CLUSTER", "ADDSLOTSRANGE", "0", "16383"}) != "OK") return false;
    const std::string primary_id = p.text({"CLUSTER", "MYID"});
    if (r.text({"CLUSTER", "MEET", "127.0.0.1", std::to_string(primary.port()),
                std::to_string(primary_bus)}) != "OK") {
      return false;
    }
    if (!eventually([&] {
          return r.text({"CLUSTER", "NODES"}).find(primary_id) != std::string::npos &&
                 p.text({"CLUSTER", "NODES"}).find(r.text({"CLUSTER", "MYID"})) !=
                     std::string::npos;
        })) {
      return false;
    }
    if (r.text({"CLUSTER", "REPLICATE", primary_id}) != "OK") return false;
    return eventually([&] {
      return p.text({"INFO", "replication"}).find("state=online") != std::string::npos &&
             cluster_ok(primary.port()) && cluster_ok(replica.port());
    });
  }

  std::string url() const {
    return "redis+cluster://127.0.0.1:" + std::to_string(primary.port()) +
           ",127.0.0.1:" + std::to_string(replica.port());
  }
};

// Issue 36: after a cluster failover, the demoted primary answers the script with MOVED and
// refuses the WAIT that follows it ("WAIT cannot be used with replica instances"). With
// wait_replicas=1, calls failed with that WAIT error instead of following the MOVED to the
// new primary. Now, while four threads record fresh keys across a CLUSTER FAILOVER, every
// call either succeeds or fails with StoreUnavailable, none with that WAIT error (a WAIT
// already waiting when the primary was demoted is interrupted, after its script ran there:
// that call fails, named), and every thread records again on the new primary.
TEST_F(PrivateRedisTest, AClusterFailoverWithWaitReplicasFollowsTheMovedNotTheRefusedWait) {
  PrivateCluster cluster;
  ASSERT_TRUE(cluster.ready());
  auto store = open_store(cluster.url() + "?prefix=" + fresh_prefix("cluster-wait") +
                          "&wait_replicas=1&wait_timeout=1000&timeout=3000");
  constexpr int kThreads = 4;
  std::atomic<bool> stop{false};
  std::atomic<bool> demoted{false};
  std::mutex mu;
  std::vector<std::string> wait_errors;  // calls that failed with the WAIT error
  std::vector<std::string> other_errors;
  std::vector<int> after(kThreads, 0);  // keys recorded once the old primary is a replica
  int unavailable = 0;
  std::string first_unavailable;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; !stop.load(); ++i) {
        const std::string key = std::to_string(t) + ":" + std::to_string(i);
        const bool was_demoted = demoted.load();
        try {
          const AcquireResult r = store->acquire("s", key, 5000ms, 600000ms);
          if (!std::holds_alternative<Acquired>(r)) {
            std::lock_guard lock(mu);
            other_errors.push_back(key + ": not acquired");
            continue;
          }
          if (store->complete("s", key, std::get<Acquired>(r).lease.token, "v", 600000ms) ==
                  WriteResult::kDone &&
              was_demoted) {
            std::lock_guard lock(mu);
            ++after[t];
          }
        } catch (const StoreUnavailable& e) {
          std::lock_guard lock(mu);
          if (unavailable++ == 0) first_unavailable = e.what();
          // The bug: the demoted primary's refused WAIT instead of its MOVED. A WAIT that
          // was waiting when the server was demoted (its script ran there) fails the call,
          // saying so.
          const std::string what = e.what();
          if (what.find("cannot be used with replica instances") != std::string::npos ||
              what.find("WAIT for replicas failed: server error") != std::string::npos) {
            wait_errors.push_back(what);
          }
        } catch (const std::exception& e) {
          std::lock_guard lock(mu);
          other_errors.push_back(key + ": " + e.what());
        }
        std::this_thread::sleep_for(1ms);
      }
    });
  }
  struct Joiner {
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~Joiner() {
      stop = true;
      for (auto& t : threads) {
        if (t.joinable()) t.join();
      }
    }
  } joiner{stop, threads};
  std::this_thread::sleep_for(300ms);
  ASSERT_EQ(RawRedis(cluster.replica.port()).text({"CLUSTER", "FAILOVER"}), "OK");
  ASSERT_TRUE(eventually([&] {
    return PrivateCluster::role(cluster.replica.port()) == "master" &&
           PrivateCluster::role(cluster.primary.port()) == "slave";
  })) << "the failover did not happen";
  demoted = true;
  // Every thread records keys on the new primary (bounded: a broken store never does).
  EXPECT_TRUE(eventually([&] {
    std::lock_guard lock(mu);
    return std::all_of(after.begin(), after.end(), [](int n) { return n >= 20; });
  })) << "a thread never recorded again after the failover";
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_THAT(wait_errors, ::testing::IsEmpty());
  EXPECT_THAT(other_errors, ::testing::IsEmpty());
  std::cout << "[ cluster failover, wait_replicas=1 ] " << unavailable
            << " calls failed with StoreUnavailable, none with the WAIT error"
            << (unavailable > 0 ? "; the first: " + first_unavailable : std::string()) << "\n";
}

// --- 2. eviction -----------------------------------------------------------------------

TEST_F(PrivateRedisTest, EvictingMemoryPoliciesAreRefusedUnlessTheUrlAcceptsTheRisk) {
  for (const std::string policy : {"allkeys-lru", "volatile-lru"}) {
    SCOPED_TRACE(policy);
    PrivateRedis server({"--maxmemory", "64mb", "--maxmemory-policy", policy});
    ASSERT_TRUE(server.ok());
    const std::string url = server.url() + "?prefix=" + fresh_prefix();
    expect_unavailable(
        [&] { (void)open_store(url); },
        {"maxmemory-policy is " + policy, "Set maxmemory-policy to noeviction", "eviction=allow"});
    auto store = open_store(url + "&eviction=allow");
    EXPECT_THAT(store->acquire("s", "k", 30s, 1h), IsFreshlyAcquired());
  }
}

TEST_F(PrivateRedisTest, AnEvictingPolicySetWhileConnectedIsRefusedAtTheReconnection) {
  PrivateRedis server;
  ASSERT_TRUE(server.ok());
  RedisStoreOptions o = server.options();
  o.connections = 1;
  auto store = std::make_shared<RedisStore>(o);
  ASSERT_THAT(store->acquire("s", "k", 30s, 1h), IsFreshlyAcquired());
  RawRedis raw(server.port());
  ASSERT_EQ(raw.text({"CONFIG", "SET", "maxmemory-policy", "allkeys-lru"}), "OK");
  ASSERT_EQ(raw.integer({"CLIENT", "KILL", "SKIPME", "yes"}), 1);
  // The call on the closed connection fails; the reconnection reads the policy and refuses.
  EXPECT_TRUE(eventually([&] {
    try {
      (void)store->get("s", "k");
      return false;
    } catch (const StoreUnavailable& e) {
      return std::string(e.what()).find("maxmemory-policy is allkeys-lru") != std::string::npos;
    }
  }));
  ASSERT_EQ(raw.text({"CONFIG", "SET", "maxmemory-policy", "noeviction"}), "OK");
  EXPECT_TRUE(eventually([&] {
    try {
      return store->get("s", "k").has_value();
    } catch (const StoreUnavailable&) {
      return false;
    }
  }));
}

// --- 3. ACL users: whole writes or none ---------------------------------------------------

// Every key under `prefix` and what it holds, read as an administrator.
std::map<std::string, std::string> snapshot(RawRedis& admin, const std::string& prefix) {
  std::map<std::string, std::string> out;
  RawReply keys = admin.command({"KEYS", prefix + "*"});
  if (!keys) return out;
  for (std::size_t i = 0; i < keys->elements; ++i) {
    const std::string k(keys->element[i]->str, keys->element[i]->len);
    out[k] = admin.text({"GET", k});
  }
  return out;
}

TEST_F(PrivateRedisTest, AnAclUserDeniedAnyCommandNeverLeavesAHalfWrittenRecord) {
  PrivateRedis server;
  ASSERT_TRUE(server.ok());
  RawRedis admin(server.port());
  const std::string large(100 * 1024, 'L');  // written with APPEND when the ACL allows it
  // The store's documented least privileges, then each command the scripts call taken
  // away in turn, and one user whose key pattern leaves out the store's token key.
  const std::vector<std::string> least = {"+evalsha", "+eval", "+script|load", "+info", "+get",
                                          "+set",     "+del",  "+append",      "+time"};
  struct Case {
    std::string name;
    std::string denied;  // a command taken away, or empty
    bool records_only;   // keys: the records, not the token key
  };
  const std::vector<Case> cases = {{"get", "+get", false},   {"set", "+set", false},
                                   {"del", "+del", false},   {"append", "+append", false},
                                   {"time", "+time", false}, {"records-only", "", true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string prefix = "acl-" + c.name + ":";
    std::vector<std::string> setuser = {
        "ACL", "SETUSER",       c.name,
        "on",  ">pw-" + c.name, c.records_only ? "~" + prefix + "{*" : "~" + prefix + "*"};
    for (const std::string& permission : least) {
      if (permission != c.denied) setuser.push_back(permission);
    }
    ASSERT_EQ(admin.text(setuser), "OK");
    auto user = open_store("redis://" + c.name + ":pw-" + c.name +
                           "@127.0.0.1:" + std::to_string(server.port()) + "/0?prefix=" + prefix);
    RedisStoreOptions ao = server.options();
    ao.prefix = prefix;
    auto owner = std::make_shared<RedisStore>(ao);
    int denied = 0;
    // Runs one step as the user: it either does all it should (checked by `done`) or is
    // refused by the ACL with nothing under the prefix changed.
    auto step = [&](const std::string& what, auto&& call, auto&& done) {
      SCOPED_TRACE(what);
      const auto before = snapshot(admin, prefix);
      try {
        done(call());
      } catch (const StoreUnavailable& e) {
        ++denied;
        EXPECT_THAT(e.what(),
                    AnyOf(HasSubstr("permission denied by the server's ACL"), HasSubstr("NOPERM")));
        EXPECT_EQ(snapshot(admin, prefix), before);
      }
    };
    auto lease_on = [&](const std::string& key) {
      return std::get<Acquired>(owner->acquire("s", key, 30s, 1h)).lease.token;
    };
    step(
        "acquire", [&] { return user->acquire("s", "mine", 30s, 1h); },
        [&](const AcquireResult& r) {
          ASSERT_THAT(r, IsFreshlyAcquired());
          EXPECT_EQ(owner->get("s", "mine").value().token, std::get<Acquired>(r).lease.token);
        });
    const Token a = lease_on("a");
    step(
        "extend", [&] { return user->extend("s", "a", a, 1min); },
        [&](const ExtendResult& r) {
          ASSERT_TRUE(r.done());
          EXPECT_EQ(owner->get("s", "a").value().lease_expires_at, r.lease_expires_at);
        });
    step(
        "complete, small", [&] { return user->complete("s", "a", a, "small", 1h); },
        [&](WriteResult r) {
          ASSERT_THAT(r, IsDone());
          EXPECT_EQ(owner->get("s", "a").value().payload, "small");
        });
    const Token b = lease_on("b");
    step(
        "complete, large", [&] { return user->complete("s", "b", b, large, 1h); },
        [&](WriteResult r) {
          ASSERT_THAT(r, IsDone());
          EXPECT_EQ(owner->get("s", "b").value().payload, large);  // whole, never cut
        });
    const Token r = lease_on("r");
    step(
        "release", [&] { return user->release("s", "r", r); },
        [&](WriteResult w) {
          ASSERT_THAT(w, IsDone());
          EXPECT_EQ(owner->get("s", "r"), std::nullopt);
        });
    step(
        "forget", [&] { return user->forget("s", "a"); },
        [&](bool forgotten) {
          EXPECT_TRUE(forgotten);
          EXPECT_EQ(owner->get("s", "a"), std::nullopt);
        });
    // A record the user could not finish stays as it was: IN_PROGRESS under the same token,
    // and its owner finishes it.
    if (owner->get("s", "b").value().state == RecordState::kInProgress) {
      EXPECT_EQ(owner->get("s", "b").value().token, b);
      ASSERT_THAT(owner->complete("s", "b", b, large, 1h), IsDone());
    }
    step(
        "replay", [&] { return user->acquire("s", "b", 30s, 1h); },
        [&](const AcquireResult& r) { EXPECT_THAT(r, IsReplay(large)); });
    // Every command but APPEND is needed: a user without it records large results whole,
    // in one SET.
    if (c.denied == "+append") {
      EXPECT_EQ(denied, 0);
    } else {
      EXPECT_GT(denied, 0);
    }
  }
}

TEST_F(PrivateRedisTest, AUserDeniedInfoIsToldWhatToGrantOrWhatToSkip) {
  PrivateRedis server;
  ASSERT_TRUE(server.ok());
  RawRedis admin(server.port());
  ASSERT_EQ(admin.text({"ACL", "SETUSER", "noinfo", "on", ">pw", "~acl-info:*", "+evalsha", "+eval",
                        "+script|load", "+get", "+set", "+del", "+append", "+time"}),
            "OK");
  const std::string url =
      "redis://noinfo:pw@127.0.0.1:" + std::to_string(server.port()) + "/0?prefix=acl-info:";
  expect_unavailable([&] { (void)open_store(url); },
                     {"cannot read the server's maxmemory-policy", "+info", "eviction=allow"});
  auto store = open_store(url + "&eviction=allow");
  EXPECT_THAT(store->acquire("s", "k", 30s, 1h), IsFreshlyAcquired());
}

// --- 4. the server's clock stepped back and forward ---------------------------------------

#ifdef IDEM_CLOCK_SHIFT_LIB
// The offset the shim (clock_shift.cpp) adds to redis-server's wall clock: a file of one
// int64 (microseconds), written in place.
class ClockShift {
 public:
  ClockShift() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "idem-clock-shift-XXXXXX").string();
    fd_ = ::mkstemp(pattern.data());
    path_ = pattern;
    set(0s);
  }
  ~ClockShift() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  void set(std::chrono::microseconds offset) {
    const std::int64_t us = offset.count();
    ASSERT_EQ(::pwrite(fd_, &us, sizeof us, 0), static_cast<ssize_t>(sizeof us));
  }

 private:
  int fd_ = -1;
  std::string path_;
};

TEST_F(PrivateRedisTest, ATokenIsNeverIssuedTwiceForAKeyWhateverTheServerClockDoes) {
  ClockShift shift;
  PrivateRedis server(
      {}, {"LD_PRELOAD=" IDEM_CLOCK_SHIFT_LIB, "IDEM_CLOCK_SHIFT_FILE=" + shift.path()});
  ASSERT_TRUE(server.ok());
  RawRedis raw(server.port());
  // The shim moves what Redis 7.0 reads: TIME and key expiry.
  shift.set(-1h);
  EXPECT_NEAR(static_cast<double>(server_ms(raw) - wall_ms()), -3'600'000.0, 5'000.0);
  ASSERT_EQ(raw.text({"SET", "expiry-probe", "x", "PX", "60000"}), "OK");
  shift.set(0s);
  EXPECT_EQ(raw.integer({"EXISTS", "expiry-probe"}), 0);
  EXPECT_NEAR(static_cast<double>(server_ms(raw) - wall_ms()), 0.0, 5'000.0);

  auto store = std::make_shared<RedisStore>(server.options());
  constexpr int kThreads = 6;
  constexpr int kKeys = 200;
  // Short leases and TTLs, so records keep vanishing (released, forgotten, expired) and
  // their keys are acquired afresh from a clock that moved.
  std::mutex mu[kKeys];
  std::vector<Token> issued[kKeys];  // per key, in the store's order
  std::atomic<bool> stop{false};
  std::atomic<long> acquired{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) + 1);
      while (!stop) {
        const int k = static_cast<int>(rng() % kKeys);
        const std::string key = "k" + std::to_string(k);
        Token token = 0;
        try {
          std::lock_guard lock(mu[k]);  // this key's acquires in the store's order
          const AcquireResult r = store->acquire("s", key, 20ms, 30ms);
          if (const auto* a = std::get_if<Acquired>(&r)) {
            token = a->lease.token;
            issued[k].push_back(token);
            ++acquired;
          }
          if (token == 0) continue;
          switch (rng() % 4) {
            case 0:
              (void)store->release("s", key, token);
              break;
            case 1:
              if (store->complete("s", key, token, "p", 30ms) == WriteResult::kDone) {
                (void)store->forget("s", key);
              }
              break;
            case 2:  // abandoned: stolen after its lease, or dropped by the server
              break;
            default:  // completed, then expired by the server
              (void)store->complete("s", key, token, "p", 30ms);
              break;
          }
        } catch (const std::exception& e) {
          if (errors++ < 5) ADD_FAILURE() << e.what();
        }
      }
    });
  }
  // 10 s and 60 s, back and forward, each held while the storm goes on.
  const std::vector<std::chrono::seconds> offsets = {0s, -10s, 0s, 10s, 0s, -60s, 0s, 60s, 0s};
  std::vector<long> per_phase;
  for (const auto offset : offsets) {
    shift.set(offset);
    const long before = acquired;
    EXPECT_TRUE(eventually([&] { return acquired >= before + 300; }));
    per_phase.push_back(acquired - before);
  }
  stop = true;
  for (auto& th : threads) th.join();

  long twice = 0, out_of_order = 0, keys_hit = 0;
  for (int k = 0; k < kKeys; ++k) {
    const std::set<Token> distinct(issued[k].begin(), issued[k].end());
    twice += static_cast<long>(issued[k].size() - distinct.size());
    bool hit = false;
    for (std::size_t i = 1; i < issued[k].size(); ++i) {
      if (issued[k][i] <= issued[k][i - 1]) {
        ++out_of_order;
        hit = true;
      }
    }
    keys_hit += hit ? 1 : 0;
  }
  std::cout << "[ clock steps ] " << acquired << " tokens on " << kKeys << " keys over "
            << offsets.size() - 1 << " steps (per phase:";
  for (const long n : per_phase) std::cout << ' ' << n;
  std::cout << "); issued twice " << twice << ", out of order " << out_of_order << " on "
            << keys_hit << " keys\n";
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(twice, 0);
  EXPECT_EQ(out_of_order, 0);
}
#endif

// --- 5. foreign data under an idem key ------------------------------------------------------

class RedisForeignDataTest : public SharedRedisTest {};

TEST_F(RedisForeignDataTest, ForeignDataIsNamedNotAnIdemRecordByEveryStep) {
  RedisStoreOptions o = shared_options();
  auto by_script = std::make_shared<RedisStore>(o);
  RedisStoreOptions g = o;
  g.replay = RedisReplayPath::kGet;
  auto by_get = std::make_shared<RedisStore>(g);
  RawRedis raw(o);
  const std::string k = redis::record_key(o.prefix, "s", "k");
  // What another program might leave under the key: short strings, a string of an unknown
  // kind, a known kind cut short, a header without its fingerprint section, other types.
  const std::vector<std::pair<std::string, std::vector<std::string>>> plants = {
      {"empty", {"SET", k, ""}},
      {"short", {"SET", k, "hello"}},
      {"unknown kind", {"SET", k, std::string(64, 'x')}},
      {"cut short", {"SET", k, "P" + std::string(20, '\0')}},
      {"no fingerprint section", {"SET", k, "C" + std::string(36, '\x7f')}},
      {"tombstone kind, too long", {"SET", k, "T" + std::string(60, '\0')}},
      {"hash", {"HSET", k, "field", "value"}},
      {"list", {"RPUSH", k, "a", "b"}}};
  for (const auto& [name, plant] : plants) {
    SCOPED_TRACE(name);
    raw.integer({"DEL", k});
    raw.text(plant);
    const std::vector<std::pair<std::string, std::function<void()>>> steps = {
        {"acquire", [&] { (void)by_script->acquire("s", "k", 30s, 1h); }},
        {"acquire (replay=get)", [&] { (void)by_get->acquire("s", "k", 30s, 1h); }},
        {"complete", [&] { (void)by_script->complete("s", "k", 1, "p", 1h); }},
        {"release", [&] { (void)by_script->release("s", "k", 1); }},
        {"extend", [&] { (void)by_script->extend("s", "k", 1, 1min); }},
        {"get", [&] { (void)by_script->get("s", "k"); }}};
    for (const auto& [what, call] : steps) {
      SCOPED_TRACE(what);
      const auto e = expect_unavailable(call, {"not an idem record", "\"" + k + "\""});
      ASSERT_TRUE(e.has_value());
      EXPECT_EQ(e->scope(), "s");
      EXPECT_EQ(e->key(), "k");
      EXPECT_THAT(e->what(), AllOf(Not(HasSubstr("unpack")), Not(HasSubstr("user_script"))));
    }
    // Nothing was written over it; an operator's forget removes it, and the key works again.
    EXPECT_EQ(raw.integer({"EXISTS", k}), 1);
    EXPECT_TRUE(by_script->forget("s", "k"));
    EXPECT_EQ(raw.integer({"EXISTS", k}), 0);
    EXPECT_THAT(by_script->acquire("s", "k", 30s, 1h), IsFreshlyAcquired());
    raw.integer({"DEL", k});
  }
  // The store's token key holding something else is named too, and left as it was.
  const std::string tokens = redis::token_key(o.prefix);
  for (const std::vector<std::string>& plant :
       {std::vector<std::string>{"SET", tokens, "junk"},
        std::vector<std::string>{"HSET", tokens, "f", "v"}}) {
    raw.integer({"DEL", tokens});
    raw.text(plant);
    const std::string type = raw.text({"TYPE", tokens});
    expect_unavailable([&] { (void)by_script->acquire("s", "fresh", 30s, 1h); },
                       {"token key", "\"" + tokens + "\"", "holds a value idem did not write"});
    EXPECT_EQ(raw.text({"TYPE", tokens}), type);
    if (type == "string") {
      EXPECT_EQ(raw.text({"GET", tokens}), "junk");
    }
    EXPECT_EQ(raw.integer({"EXISTS", redis::record_key(o.prefix, "s", "fresh")}), 0);
  }
}

// --- 6. a record whose key lost its expiry --------------------------------------------------

TEST_F(RedisForeignDataTest, ARecordWhoseKeyLostItsExpiryIsJudgedByItsOwnExpiresAt) {
  RedisStoreOptions o = shared_options();
  RawRedis raw(o);
  for (const RedisReplayPath path : {RedisReplayPath::kScript, RedisReplayPath::kGet}) {
    RedisStoreOptions po = o;
    po.replay = path;
    auto store = std::make_shared<RedisStore>(po);
    for (const std::string how : {"persist", "restore"}) {
      const std::string key = how + (path == RedisReplayPath::kGet ? "-get" : "-script");
      SCOPED_TRACE(key);
      const std::string k = redis::record_key(o.prefix, "s", key);
      const Lease lease = std::get<Acquired>(store->acquire("s", key, 30s, 1h)).lease;
      ASSERT_THAT(store->complete("s", key, lease.token, "stale", 300ms), IsDone());
      if (how == "persist") {
        ASSERT_EQ(raw.integer({"PERSIST", k}), 1);
      } else {
        RawReply dump = raw.command({"DUMP", k});
        ASSERT_TRUE(dump && dump->type == REDIS_REPLY_STRING);
        const std::string serialized(dump->str, dump->len);
        ASSERT_EQ(raw.integer({"DEL", k}), 1);
        ASSERT_EQ(raw.text({"RESTORE", k, "0", serialized}), "OK");
      }
      ASSERT_EQ(raw.integer({"PTTL", k}), -1);  // the key now never expires
      const Timestamp expires_at = store->get("s", key).value().expires_at;
      ASSERT_TRUE(eventually([&] { return store->get("s", key).value().now > expires_at; }));
      // Past its own expires_at by the server's clock: absent (SPEC §4), never a replay.
      const AcquireResult r = store->acquire("s", key, 30s, 1h);
      EXPECT_THAT(r, IsFreshlyAcquired());
      EXPECT_GT(raw.integer({"PTTL", k}), 0);  // and the new lease's key expires again
    }
  }
}

}  // namespace
}  // namespace idem::testing
