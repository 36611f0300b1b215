// Redis store tests that need a server of their own (PrivateRedis), because they pause,
// kill, restart or reconfigure it: automatic pipelining, a broken connection, timeouts, a
// restart with AOF in the middle of a workload, lost scripts, ACL credentials, the errors
// the server can answer, and waiting for replicas.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
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

namespace idem::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(PrivateRedisTest, CallsQueuedDuringARoundTripGoOutTogetherInTheNextOne) {
  PrivateRedis server;
  ASSERT_TRUE(server.ok());
  RedisStoreOptions o = server.options();
  o.connections = 1;
  o.timeout = 60s;  // only a bound: the server is paused on purpose
  auto store = std::make_shared<RedisStore>(o);
  constexpr int kQueued = 31;
  for (int i = 1; i <= kQueued; ++i) {
    const std::string key = "k" + std::to_string(i);
    const Lease lease = std::get<Acquired>(store->acquire("s", key, 30s, 1h)).lease;
    ASSERT_THAT(store->complete("s", key, lease.token, "result " + key, 1h), IsDone());
  }
  const RedisStats base = store->stats();

  // With the server paused, the first call's round trip stays in flight, and every call made
  // meanwhile has to wait for the next one.
  server.pause();
  std::vector<std::thread> callers;
  std::atomic<int> acquired{0}, replayed{0};
  auto call = [&](int i) {
    const std::string key = "k" + std::to_string(i);
    const AcquireResult r = store->acquire("s", key, 30s, 1h);
    if (std::holds_alternative<Acquired>(r)) ++acquired;
    if (const auto* replay = std::get_if<Replay>(&r);
        replay && replay->payload == "result " + key) {
      ++replayed;
    }
  };
  callers.emplace_back(call, 0);
  ASSERT_TRUE(eventually([&] { return store->stats().round_trips == base.round_trips + 1; }));
  for (int i = 1; i <= kQueued; ++i) callers.emplace_back(call, i);
  ASSERT_TRUE(eventually([&] { return store->stats().queued == kQueued; }));
  server.resume();
  for (auto& t : callers) t.join();

  // The 31 queued acquires went out as one write, and each replayed.
  const RedisStats after = store->stats();
  EXPECT_EQ(acquired.load(), 1);
  EXPECT_EQ(replayed.load(), kQueued);
  EXPECT_EQ(after.round_trips - base.round_trips, 2u);
  EXPECT_EQ(after.commands - base.commands, static_cast<std::uint64_t>(kQueued + 1));
  EXPECT_EQ(after.queued, 0u);
}

TEST_F(PrivateRedisTest, ABrokenConnectionFailsOnlyTheCallOnItAndReconnects) {
  PrivateRedis server;
  ASSERT_TRUE(server.ok());
  RedisStoreOptions o = server.options();
  o.connections = 2;
  auto store = std::make_shared<RedisStore>(o);
  (void)store->get("s", "warm");
  RawRedis raw(server.port());
  // Close one of the store's two connections from the server's side.
  const std::string me = raw.text({"CLIENT", "ID"});
  RawReply list = raw.command({"CLIENT", "LIST"});
  ASSERT_TRUE(list);
  const std::string text(list->str, list->len);
  std::vector<std::string> ids;
  for (std::size_t at = text.find("id="); at != std::string::npos; at = text.find("id=", at + 1)) {
    if (at > 0 && text[at - 1] != '\n') continue;
    const std::string id = text.substr(at + 3, text.find(' ', at) - at - 3);
    if (id != me) ids.push_back(id);
  }
  ASSERT_EQ(ids.size(), 2u) << text;
  ASSERT_EQ(raw.integer({"CLIENT", "KILL", "ID", ids[0]}), 1);

  // The one call that goes to the closed connection fails, saying so; every other call
  // succeeds, on the other connection or on the closed one once it reconnected.
  int failed = 0;
  for (int i = 0; i < 10; ++i) {
    try {
      (void)store->acquire("s", "k" + std::to_string(i), 30s, 1h);
    } catch (const StoreUnavailable& e) {
      ++failed;
      EXPECT_THAT(e.what(), HasSubstr("connection lost"));
    }
  }
  EXPECT_EQ(failed, 1);
  EXPECT_TRUE(eventually([&] { return store->stats().reconnects == 1; }));
}

TEST_F(PrivateRedisTest, ACallTimesOutOnAPausedServerAndLaterCallsSucceed) {
  PrivateRedis server;
  ASSERT_TRUE(server.ok());
  RedisStoreOptions o = server.options();
  o.connections = 1;
  o.timeout = 300ms;
  auto store = std::make_shared<RedisStore>(o);
  // Opening made round trips of its own (the check that the server can publish).
  const std::uint64_t opened = store->stats().round_trips;
  server.pause();
  // One call in flight (its round trip times out) and one queued behind it (its deadline
  // passes before it could be sent).
  std::optional<StoreUnavailable> in_flight;
  std::thread first([&] {
    in_flight = expect_unavailable([&] { (void)store->acquire("s", "a", 30s, 1h); },
                                   {"timed out after 300 ms"});
  });
  ASSERT_TRUE(eventually([&] { return store->stats().round_trips == opened + 1; }));
  expect_unavailable([&] { (void)store->acquire("s", "b", 30s, 1h); }, {"timed out after 300 ms"});
  first.join();
  ASSERT_TRUE(in_flight.has_value());
  EXPECT_THAT(in_flight->what(), HasSubstr("may or may not have taken effect"));
  server.resume();
  EXPECT_TRUE(eventually([&] {
    try {
      return std::holds_alternative<Acquired>(store->acquire("s", "c", 30s, 1h));
    } catch (const StoreUnavailable&) {
      return false;
    }
  }));
}

TEST_F(PrivateRedisTest, ServerRestartedWithAofMidWorkloadLosesNothingCompleted) {
  // appendfsync always: a result acknowledged is on disk (everysec may postpone the
  // write while a background fsync is slow, so a crash may lose the last 2 s).
  PrivateRedis server({"--appendonly", "yes", "--appendfsync", "always"});
  ASSERT_TRUE(server.ok());
  RedisStoreOptions o = server.options();
  o.timeout = 1s;
  o.connect_timeout = 1s;
  auto store = std::make_shared<RedisStore>(o);
  Executor executor(store, ExecutorOptions{.lease = 2s,
                                           .wait = WaitPolicy{.max_wait = 20s},
                                           .on_heartbeat_error = [](const std::exception&) {}});

  constexpr int kThreads = 6;
  constexpr int kKeys = 200;  // threads overlap: thread t starts at key 17 t
  std::mutex mu;
  std::map<std::string, std::string> completed;  // key -> result the caller got back
  std::set<std::string> running;                 // keys whose action runs right now
  std::atomic<int> overlaps{0}, ok_calls{0}, unavailable{0}, other_errors{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; !stop; ++i) {
        const std::string key = "k" + std::to_string((i + 17 * t) % kKeys);
        try {
          const auto r = executor.run("s", key, [&](const Attempt& a) {
            {
              std::lock_guard lock(mu);
              // SPEC §5: an action runs only under a lease, so never twice at once.
              if (!running.insert(key).second) ++overlaps;
            }
            std::this_thread::sleep_for(1ms);
            std::lock_guard lock(mu);
            running.erase(key);
            return key + "@" + std::to_string(a.token());
          });
          std::lock_guard lock(mu);
          const auto [it, inserted] = completed.emplace(key, r.value);
          if (!inserted && it->second != r.value) ++other_errors;  // two results for a key
          ++ok_calls;
        } catch (const StoreUnavailable&) {
          ++unavailable;
        } catch (const std::exception&) {
          ++other_errors;
        }
      }
    });
  }
  ASSERT_TRUE(eventually([&] { return ok_calls >= 300; }));
  std::map<std::string, std::string> before_crash;
  {
    std::lock_guard lock(mu);
    before_crash = completed;
  }
  server.kill();
  ASSERT_TRUE(eventually([&] { return unavailable >= 10; }));
  server.restart();
  ASSERT_TRUE(server.ok());
  const int ok_at_restart = ok_calls;
  ASSERT_TRUE(eventually([&] { return ok_calls >= ok_at_restart + 300; }));
  stop = true;
  for (auto& t : threads) t.join();

  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(other_errors.load(), 0);
  EXPECT_GE(store->stats().reconnects, 1u);
  // Every result acknowledged before the crash survived it (AOF), byte for byte.
  for (const auto& [key, result] : before_crash) {
    EXPECT_THAT(store->acquire("s", key, 1s, 1h), IsReplay(result)) << key;
  }
}

TEST_F(PrivateRedisTest, ScriptsTheServerLostAreSentAgain) {
  PrivateRedis server;
  ASSERT_TRUE(server.ok());
  RedisStoreOptions o = server.options();
  o.connections = 1;
  auto store = std::make_shared<RedisStore>(o);
  RawRedis raw(server.port());
  ASSERT_EQ(raw.text({"SCRIPT", "FLUSH"}), "OK");
  const Lease lease = std::get<Acquired>(store->acquire("s", "k", 30s, 1h)).lease;
  EXPECT_EQ(store->stats().script_reloads, 1u);
  // EVAL cached it again: the next EVALSHA of that script finds it.
  EXPECT_THAT(store->acquire("s", "k", 30s, 1h), IsBusy());
  EXPECT_EQ(store->stats().script_reloads, 1u);
  // The batched extend reloads its script once for the whole batch.
  ASSERT_EQ(raw.text({"SCRIPT", "FLUSH"}), "OK");
  const std::vector<ExtendRequest> batch(3, ExtendRequest{"s", "k", lease.token, 1min});
  const std::vector<ExtendResult> results = store->extend_many(batch);
  EXPECT_EQ(store->stats().script_reloads, 4u);
  for (const ExtendResult& r : results) EXPECT_TRUE(r.done());
}

TEST_F(PrivateRedisTest, AclUserWithRightCredentialsWorksAndWrongOnesAreNamed) {
  PrivateRedis server;
  ASSERT_TRUE(server.ok());
  RawRedis raw(server.port());
  // The least the store needs: its scripts and the commands they call, on its own keys.
  ASSERT_EQ(raw.text(least_acl_user("app", "s3cret-pw", "idem-acl:*")), "OK");
  ASSERT_EQ(raw.text({"ACL", "SETUSER", "nodel", "on", ">other-pw", "~idem-acl:*", "+evalsha",
                      "+eval", "+script|load", "+info", "+get", "+set", "+append", "+time"}),
            "OK");
  const std::string base =
      "redis://app:s3cret-pw@127.0.0.1:" + std::to_string(server.port()) + "/0?prefix=idem-acl:";
  {
    auto store = open_store(base);
    EXPECT_EQ(store->describe(),
              "redis://app:***@127.0.0.1:" + std::to_string(server.port()) + "/0");
    const Lease lease = std::get<Acquired>(store->acquire("s", "k", 30s, 1h)).lease;
    ASSERT_TRUE(store->extend("s", "k", lease.token, 1min).done());
    ASSERT_THAT(store->complete("s", "k", lease.token, "p", 1h), IsDone());
    EXPECT_THAT(store->acquire("s", "k", 30s, 1h), IsReplay("p"));
    EXPECT_TRUE(store->forget("s", "k"));
    // The unix socket takes the same credentials.
    auto local = open_store("unix://app:s3cret-pw@" + server.socket() + "?prefix=idem-acl:");
    EXPECT_THAT(local->acquire("s", "k", 30s, 1h), IsFreshlyAcquired());
  }
  const std::string port = std::to_string(server.port());
  expect_unavailable(
      [&] { (void)open_store("redis://app:wrong-pw@127.0.0.1:" + port + "/0?prefix=idem-acl:"); },
      {"redis://app:***@127.0.0.1:" + port + "/0",
       "authentication failed (wrong user name or password)", "WRONGPASS"});
  const std::optional<StoreUnavailable> noperm = expect_unavailable(
      [&] {
        auto store = open_store("redis://nodel:other-pw@127.0.0.1:" + port + "/0?prefix=idem-acl:");
        const Lease lease = std::get<Acquired>(store->acquire("s", "x", 30s, 1h)).lease;
        (void)store->release("s", "x", lease.token);
      },
      {"release", "permission denied by the server's ACL"});
  ASSERT_TRUE(noperm.has_value());
  EXPECT_THAT(noperm->what(), Not(HasSubstr("other-pw")));
  // Keys outside the user's pattern are refused too.
  expect_unavailable(
      [&] {
        auto store = open_store("redis://app:s3cret-pw@127.0.0.1:" + port + "/0?prefix=other:");
        (void)store->acquire("s", "x", 30s, 1h);
      },
      {"acquire", "NOPERM"});
  // A server that requires a password, opened without one.
  ASSERT_EQ(raw.text({"CONFIG", "SET", "requirepass", "default-pw"}), "OK");
  expect_unavailable([&] { (void)open_store(server.url()); },
                     {"authentication required (the URL gives no password)", "NOAUTH"});
}

TEST_F(PrivateRedisTest, OutOfMemoryAndReadOnlyReplicaAreNamed) {
  PrivateRedis server;
  ASSERT_TRUE(server.ok());
  auto store = std::make_shared<RedisStore>(server.options());
  RawRedis raw(server.port());
  ASSERT_EQ(raw.text({"CONFIG", "SET", "maxmemory", "1"}), "OK");
  expect_unavailable([&] { (void)store->acquire("s", "k", 30s, 1h); },
                     {"acquire", "the server is out of memory", "OOM"});
  ASSERT_EQ(raw.text({"CONFIG", "SET", "maxmemory", "0"}), "OK");

  // min-replicas-to-write with no replica: every write refused (docs/stores/redis.md, "What
  // a failover can lose").
  ASSERT_EQ(raw.text({"CONFIG", "SET", "min-replicas-to-write", "1"}), "OK");
  expect_unavailable(
      [&] { (void)store->acquire("s", "k", 30s, 1h); },
      {"acquire", "fewer replicas in sync than its min-replicas-to-write", "NOREPLICAS"});
  ASSERT_EQ(raw.text({"CONFIG", "SET", "min-replicas-to-write", "0"}), "OK");

  // A replica (of a primary that is not there) refuses writes; a read-only store on it
  // still answers get().
  ASSERT_EQ(raw.text({"REPLICAOF", "127.0.0.1", "1"}), "OK");
  expect_unavailable([&] { (void)store->acquire("s", "k", 30s, 1h); },
                     {"acquire", "the server is a read-only replica", "READONLY"});
  RedisStoreOptions o = server.options();
  o.read_only = true;
  auto reader = std::make_shared<RedisStore>(o);
  EXPECT_EQ(reader->get("s", "k"), std::nullopt);
}

TEST_F(PrivateRedisTest, WritesWaitForReplicasWhenAsked) {
  PrivateRedis primary;
  ASSERT_TRUE(primary.ok());
  PrivateRedis replica({"--replicaof", "127.0.0.1", std::to_string(primary.port())});
  ASSERT_TRUE(replica.ok());
  RawRedis on_primary(primary.port());
  ASSERT_TRUE(eventually([&] {
    return on_primary.text({"INFO", "replication"}).find("connected_slaves:1") != std::string::npos;
  }));
  RedisStoreOptions o = primary.options();
  o.wait_replicas = 1;
  o.wait_timeout = 10s;  // a bound; the replica is on the same machine
  auto store = std::make_shared<RedisStore>(o);
  const Lease lease = std::get<Acquired>(store->acquire("s", "k", 30s, 1h)).lease;
  ASSERT_THAT(store->complete("s", "k", lease.token, "replicated", 1h), IsDone());
  // Acknowledged by the replica before complete returned: it is there now.
  RawRedis on_replica(replica.port());
  const std::string k = redis::record_key(o.prefix, "s", "k");
  const std::string stored = on_replica.text({"GET", k});
  const auto rec = redis::decode_record(stored);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->payload, "replicated");

  // Asking for more replicas than there are: the write is refused and the lease released.
  o.wait_replicas = 2;
  o.wait_timeout = 100ms;
  auto greedy = std::make_shared<RedisStore>(o);
  expect_unavailable([&] { (void)greedy->acquire("s", "other", 30s, 1h); },
                     {"only 1 of 2 replicas acknowledged", "WAIT"});
  EXPECT_EQ(greedy->get("s", "other"), std::nullopt);
}

}  // namespace
}  // namespace idem::testing
