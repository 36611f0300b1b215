// The Redis store on Redis Cluster (redis+cluster://) on the three primaries with a replica
// each that scripts/servers.sh starts (idem_start_redis_cluster,
// IDEM_TEST_REDIS_CLUSTER_URL): the shared store suite unchanged (tokens increase per key:
// one token key per hash slot), routing by slot, heartbeats across nodes, and a slot that
// migrates (ASK, then MOVED) between calls.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "idem/open_store.h"
#include "idem/stores/redis_store.h"
#include "idem/testing/store_conformance.h"
#include "stores/redis/redis_layout.h"
#include "stores/redis/redis_test_util.h"
#include "support/eventually.h"

namespace idem::testing {
namespace {

::testing::Environment* const kClusterEnvironment = ::testing::AddGlobalTestEnvironment(
    new ServerEnvironment("IDEM_TEST_REDIS_CLUSTER_URL",
                          "source scripts/servers.sh and run idem_start_redis_cluster"));

std::string cluster_url() {
  const char* v = std::getenv("IDEM_TEST_REDIS_CLUSTER_URL");
  return v == nullptr ? std::string() : std::string(v);
}

std::vector<int> cluster_ports() {
  std::vector<int> out;
  const char* v = std::getenv("IDEM_TEST_REDIS_CLUSTER_PORTS");
  std::istringstream in(v == nullptr ? "" : v);
  for (int p = 0; in >> p;) out.push_back(p);
  return out;
}

IDEM_INSTANTIATE_STORE_CONFORMANCE(
    RedisCluster,
    StoreTestContext{.name = "redis_cluster",
                     .make = [](std::shared_ptr<ManualClock>) -> std::shared_ptr<Store> {
                       return open_store(
                           with_param(cluster_url(), "prefix", fresh_prefix("cluster")));
                     },
                     .fake_clock = false,
                     .tick = Duration{200},
                     .native_expiry = true,
                     .store_wide_tokens = false});

// The port of the node that serves `slot` (as its primary), by CLUSTER SLOTS.
int owner_port(unsigned slot) {
  RawRedis any(cluster_ports().at(0));
  RawReply r = any.command({"CLUSTER", "SLOTS"});
  for (std::size_t i = 0; r && i < r->elements; ++i) {
    const redisReply* range = r->element[i];
    if (range->element[0]->integer <= slot && slot <= range->element[1]->integer) {
      return static_cast<int>(range->element[2]->element[1]->integer);
    }
  }
  return 0;
}

std::string node_id(int port) { return RawRedis(port).text({"CLUSTER", "MYID"}); }

Token acquire_token(Store& store, const std::string& key, const std::string& scope = "s") {
  const AcquireResult r = store.acquire(scope, key, Duration{30000}, Duration{600000});
  EXPECT_TRUE(std::holds_alternative<Acquired>(r)) << key;
  return std::holds_alternative<Acquired>(r) ? std::get<Acquired>(r).lease.token : 0;
}

// SPEC §7 on a cluster: the scripts publish on the record's key, at its slot's primary, and
// a watch subscribes there (a subscriber per primary), so a waiter is told when a record
// on any node completes or is released.
TEST(RedisCluster, AWatchIsToldWhenItsRecordCompletesOrIsReleasedOnEveryNode) {
  const std::string prefix = fresh_prefix("wake");
  const std::string url = with_param(cluster_url(), "prefix", prefix);
  auto owner = open_store(url);
  auto waiter = open_store(url);
  ASSERT_TRUE(dynamic_cast<RedisStore&>(*waiter).stats().notify);
  // A key on each primary.
  std::map<int, std::string> key_on;
  for (int i = 0; i < 300; ++i) {
    const std::string key = "w" + std::to_string(i);
    key_on.emplace(owner_port(redis::hash_slot(redis::record_key(prefix, "s", key))), key);
  }
  ASSERT_GE(key_on.size(), 3u);
  std::map<std::string, std::atomic<int>> told;
  std::vector<std::unique_ptr<RecordWatch>> watches;
  std::map<std::string, Token> tokens;
  for (const auto& [port, key] : key_on) {
    tokens[key] = acquire_token(*owner, key);
    told[key] = 0;
    watches.push_back(waiter->watch("s", key, [&told, k = key] { ++told[k]; }));
    ASSERT_NE(watches.back(), nullptr) << key;
  }
  // Each subscription, once confirmed, calls its watch (a publish may have come before).
  ASSERT_TRUE(eventually([&] {
    return dynamic_cast<RedisStore&>(*waiter).stats().subscribed_channels == key_on.size();
  }));
  EXPECT_EQ(dynamic_cast<RedisStore&>(*waiter).stats().subscriber_connects, key_on.size());
  bool completes = true;
  for (const auto& [port, key] : key_on) {
    SCOPED_TRACE(key + " on the node at port " + std::to_string(port));
    ASSERT_TRUE(eventually([&] { return told[key].load() >= 1; }));
    const int before = told[key].load();
    if (completes) {
      ASSERT_EQ(owner->complete("s", key, tokens[key], "v", Duration{600000}), WriteResult::kDone);
    } else {
      ASSERT_EQ(owner->release("s", key, tokens[key]), WriteResult::kDone);
    }
    completes = !completes;
    EXPECT_TRUE(eventually([&] { return told[key].load() > before; }));
  }
}

TEST(RedisCluster, EachRecordLivesOnThePrimaryOfItsSlot) {
  const std::string prefix = fresh_prefix("route");
  auto store = open_store(with_param(cluster_url(), "prefix", prefix));
  std::vector<int> nodes_used;
  for (int i = 0; i < 60; ++i) {
    const std::string key = "k" + std::to_string(i);
    const Token t = acquire_token(*store, key);
    ASSERT_EQ(store->complete("s", key, t, "v", Duration{600000}), WriteResult::kDone);
    const std::string redis_key = redis::record_key(prefix, "s", key);
    const int port = owner_port(redis::hash_slot(redis_key));
    RawRedis owner(port);
    EXPECT_EQ(owner.integer({"EXISTS", redis_key}), 1) << key;
    if (std::find(nodes_used.begin(), nodes_used.end(), port) == nodes_used.end()) {
      nodes_used.push_back(port);
    }
  }
  EXPECT_EQ(nodes_used.size(), 3u) << "60 keys should spread over the three primaries";
  EXPECT_TRUE(store->describe().starts_with("redis+cluster://")) << store->describe();
}

TEST(RedisCluster, OneHeartbeatExtendsLeasesOnEveryNode) {
  auto store = open_store(with_param(cluster_url(), "prefix", fresh_prefix("extend")));
  std::vector<std::string> keys;
  std::vector<Token> tokens;
  for (int i = 0; i < 30; ++i) {
    keys.push_back("k" + std::to_string(i));
    tokens.push_back(acquire_token(*store, keys.back()));
  }
  std::vector<ExtendRequest> requests;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    requests.push_back(ExtendRequest{"s", keys[i], tokens[i], Duration{40000}});
  }
  requests.push_back(ExtendRequest{"s", "absent", 12345, Duration{40000}});
  const std::vector<ExtendResult> results = store->extend_many(requests);
  ASSERT_EQ(results.size(), requests.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(results[i].result, WriteResult::kDone) << keys[i];
  }
  EXPECT_EQ(results.back().result, WriteResult::kFenced);
}

TEST(RedisCluster, ReplayByGetAndReadOnlyWorkOnEveryNode) {
  const std::string prefix = fresh_prefix("get");
  auto store = open_store(with_param(cluster_url(), "prefix", prefix) + "&replay=get");
  auto reader =
      open_store(with_param(cluster_url(), "prefix", prefix), OpenOptions{.read_only = true});
  for (int i = 0; i < 20; ++i) {
    const std::string key = "k" + std::to_string(i);
    const Token t = acquire_token(*store, key);
    ASSERT_EQ(store->complete("s", key, t, "v" + key, Duration{600000}), WriteResult::kDone);
    for (Store* s : {store.get(), reader.get()}) {
      const AcquireResult r = s->acquire("s", key, Duration{30000}, Duration{600000});
      ASSERT_TRUE(std::holds_alternative<Replay>(r)) << key;
      EXPECT_EQ(std::get<Replay>(r).payload, "v" + key);
    }
  }
}

TEST(RedisCluster, UrlForms) {
  EXPECT_THROW((void)open_store("redis+cluster://127.0.0.1:1,127.0.0.1:2/3"), InvalidArgument);
  const std::string one_seed =
      "redis+cluster://127.0.0.1:" + std::to_string(cluster_ports().at(1)) +
      "?prefix=" + fresh_prefix("seed");
  auto store = open_store(one_seed);  // one seed is enough: the map names every node
  (void)acquire_token(*store, "k");
  expect_unavailable(
      [] {
        (void)open_store("redis+cluster://127.0.0.1:" + std::to_string(unused_port()) +
                         "?connect_timeout=500");
      },
      {"cannot read the cluster's slot map"});
}

// A key of `prefix` whose record lives in `slot`, the n-th found.
std::string key_in_slot(const std::string& prefix, const std::string& scope, unsigned slot, int n) {
  for (int i = 0;; ++i) {
    const std::string key = "m" + std::to_string(i);
    if (redis::hash_slot(redis::record_key(prefix, scope, key)) == slot && n-- == 0) return key;
  }
}

// A slot moves from one primary to another while the store runs: during the migration a
// record still on the source replays from it, a new one goes to the target (ASK), a
// migrated one is found on the target (ASK); after it, every call follows MOVED.
TEST(RedisCluster, ASlotMigratingBetweenCallsIsFollowed) {
  const std::string prefix = fresh_prefix("migrate");
  // A scope of its own: the hash tag is (scope, key), so each run migrates another slot.
  const std::string scope = prefix;
  auto store = open_store(with_param(cluster_url(), "prefix", prefix));
  const std::string first = "m0";
  const unsigned slot = redis::hash_slot(redis::record_key(prefix, scope, first));
  const std::string kept = key_in_slot(prefix, scope, slot, 0);
  const std::string moved = key_in_slot(prefix, scope, slot, 1);
  const std::string fresh = key_in_slot(prefix, scope, slot, 2);
  const int source = owner_port(slot);
  int target = 0;
  // Another primary: the owner of a slot the source does not serve.
  for (unsigned s = 0; s < redis::kHashSlots && target == 0; s += 1000) {
    const int p = owner_port(s);
    if (p != source) target = p;
  }
  ASSERT_NE(target, 0);
  for (const std::string& key : {kept, moved}) {
    const Token t = acquire_token(*store, key, scope);
    ASSERT_EQ(store->complete(scope, key, t, "v" + key, Duration{600000}), WriteResult::kDone);
  }
  const std::string source_id = node_id(source);
  const std::string target_id = node_id(target);
  const std::string slot_text = std::to_string(slot);
  RawRedis src(source);
  RawRedis dst(target);
  ASSERT_EQ(dst.text({"CLUSTER", "SETSLOT", slot_text, "IMPORTING", source_id}), "OK");
  ASSERT_EQ(src.text({"CLUSTER", "SETSLOT", slot_text, "MIGRATING", target_id}), "OK");
  // `moved` and the slot's token key go to the target; `kept` stays on the source.
  const std::string token_key_of_slot = [&] {
    RawReply keys = src.command({"CLUSTER", "GETKEYSINSLOT", slot_text, "100"});
    for (std::size_t i = 0; keys && i < keys->elements; ++i) {
      const std::string k(keys->element[i]->str, keys->element[i]->len);
      if (k.find("tokens{") != std::string::npos) return k;
    }
    return std::string();
  }();
  ASSERT_FALSE(token_key_of_slot.empty());
  ASSERT_EQ(src.text({"MIGRATE", "127.0.0.1", std::to_string(target), "", "0", "5000", "KEYS",
                      redis::record_key(prefix, scope, moved), token_key_of_slot}),
            "OK");
  // During the migration: a record whose slot's keys are all on the target is found there
  // (ASK, ASKING).
  const AcquireResult on_target = store->acquire(scope, moved, Duration{30000}, Duration{600000});
  ASSERT_TRUE(std::holds_alternative<Replay>(on_target));
  EXPECT_EQ(std::get<Replay>(on_target).payload, "v" + moved);
  // A record still on the source and a new one: the acquire script's keys (the record and
  // the slot's token key) are split between the nodes, which answer TRYAGAIN; the store
  // tries again until the migration of the slot ends.
  auto kept_call = std::async(std::launch::async, [&] {
    return store->acquire(scope, kept, Duration{30000}, Duration{600000});
  });
  auto fresh_call = std::async(std::launch::async, [&] {
    return store->acquire(scope, fresh, Duration{30000}, Duration{600000});
  });
  EXPECT_EQ(fresh_call.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  // The rest of the slot, then the slot itself, to the target, on every primary.
  ASSERT_EQ(src.text({"MIGRATE", "127.0.0.1", std::to_string(target), "", "0", "5000", "KEYS",
                      redis::record_key(prefix, scope, kept)}),
            "OK");
  for (int p : cluster_ports()) {
    RawRedis node(p);
    (void)node.text({"CLUSTER", "SETSLOT", slot_text, "NODE", target_id});
  }
  const AcquireResult kept_result = kept_call.get();
  ASSERT_TRUE(std::holds_alternative<Replay>(kept_result));
  EXPECT_EQ(std::get<Replay>(kept_result).payload, "v" + kept);
  const AcquireResult fresh_result = fresh_call.get();
  ASSERT_TRUE(std::holds_alternative<Acquired>(fresh_result));
  const Token t = std::get<Acquired>(fresh_result).lease.token;
  EXPECT_EQ(store->complete(scope, fresh, t, "vfresh", Duration{600000}), WriteResult::kDone);
  const AcquireResult after = store->acquire(scope, kept, Duration{30000}, Duration{600000});
  ASSERT_TRUE(std::holds_alternative<Replay>(after));
  EXPECT_EQ(owner_port(slot), target);
  EXPECT_EQ(dst.integer({"EXISTS", redis::record_key(prefix, scope, fresh)}), 1);
  // Tokens still increase for the key whose record moved with its slot's token key.
  ASSERT_TRUE(store->forget(scope, moved));
  EXPECT_GT(acquire_token(*store, moved, scope), 0u);
}

// Moves every key of `slot` from the node on port `from` to the node on port `to`, then the
// slot itself (on every primary), as redis-cli --cluster reshard does.
void migrate_slot(unsigned slot, int from, int to) {
  const std::string slot_text = std::to_string(slot);
  const std::string from_id = node_id(from);
  const std::string to_id = node_id(to);
  RawRedis src(from);
  RawRedis dst(to);
  ASSERT_EQ(dst.text({"CLUSTER", "SETSLOT", slot_text, "IMPORTING", from_id}), "OK");
  ASSERT_EQ(src.text({"CLUSTER", "SETSLOT", slot_text, "MIGRATING", to_id}), "OK");
  for (;;) {
    RawReply keys = src.command({"CLUSTER", "GETKEYSINSLOT", slot_text, "5"});
    if (!keys || keys->elements == 0) break;
    std::vector<std::string> migrate = {"MIGRATE", "127.0.0.1", std::to_string(to), "",
                                        "0",       "5000",      "REPLACE",          "KEYS"};
    for (std::size_t i = 0; i < keys->elements; ++i) {
      migrate.emplace_back(keys->element[i]->str, keys->element[i]->len);
    }
    ASSERT_EQ(src.text(migrate), "OK");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the callers meet it
  }
  for (int p : cluster_ports())
    (void)RawRedis(p).text({"CLUSTER", "SETSLOT", slot_text, "NODE", to_id});
}

// Eight threads run fresh keys and then replays of them, all in one slot, while that slot
// migrates to another primary and back, a few keys at a time: no error reaches a caller,
// and every key is acquired exactly once (every other call replays it).
TEST(RedisCluster, ASlotMigratingUnderLoadLosesNothingAndRunsEveryKeyOnce) {
  const std::string prefix = fresh_prefix("reshard");
  const std::string scope = prefix;
  auto store = open_store(with_param(cluster_url(), "prefix", prefix));
  const unsigned slot = redis::hash_slot(redis::record_key(prefix, scope, "m0"));
  const int source = owner_port(slot);
  int target = 0;
  for (unsigned s = 0; s < redis::kHashSlots && target == 0; s += 1000) {
    if (owner_port(s) != source) target = owner_port(s);
  }
  ASSERT_NE(target, 0);
  constexpr int kThreads = 8;
  constexpr int kKeysPerThread = 40;
  std::vector<std::vector<std::string>> keys(kThreads);
  for (int i = 0, found = 0; found < kThreads * kKeysPerThread; ++i) {
    const std::string key = "m" + std::to_string(i);
    if (redis::hash_slot(redis::record_key(prefix, scope, key)) == slot) {
      keys[static_cast<std::size_t>(found % kThreads)].push_back(key);
      ++found;
    }
  }
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::mutex mu;
  std::map<std::string, int> acquired;
  std::string first_error;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; !stop.load(); ++round) {
        for (const std::string& key : keys[static_cast<std::size_t>(t)]) {
          try {
            const AcquireResult r = store->acquire(scope, key, Duration{30000}, Duration{600000});
            if (std::holds_alternative<Acquired>(r)) {
              {
                std::lock_guard lock(mu);
                ++acquired[key];
              }
              if (store->complete(scope, key, std::get<Acquired>(r).lease.token, "v",
                                  Duration{600000}) != WriteResult::kDone) {
                ++errors;
              }
            } else if (!std::holds_alternative<Replay>(r)) {
              ++errors;
            }
          } catch (const std::exception& e) {
            std::lock_guard lock(mu);
            if (first_error.empty()) first_error = e.what();
            ++errors;
          }
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  migrate_slot(slot, source, target);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  migrate_slot(slot, target, source);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0) << first_error;
  EXPECT_EQ(owner_port(slot), source);
  ASSERT_EQ(acquired.size(), static_cast<std::size_t>(kThreads * kKeysPerThread));
  for (const auto& [key, times] : acquired) EXPECT_EQ(times, 1) << key;
}

// A replica takes over from its primary (CLUSTER FAILOVER) while eight threads record fresh
// keys with wait_replicas=1: callers see nothing but StoreUnavailable while it happens,
// every thread records again afterwards, and every key reported recorded is there.
TEST(RedisCluster, AClusterFailoverUnderLoadKeepsEveryRecordedKey) {
  const std::string prefix = fresh_prefix("cfailover");
  auto store = open_store(with_param(cluster_url(), "prefix", prefix) +
                          "&wait_replicas=1&wait_timeout=1000&timeout=3000");
  // The replica of the primary that serves slot 0.
  const int primary = owner_port(0);
  const std::string primary_id = node_id(primary);
  int replica = 0;
  for (int p : cluster_ports()) {
    RawReply role = RawRedis(p).command({"ROLE"});
    if (role && role->elements >= 3 && std::string(role->element[0]->str) == "slave" &&
        role->element[2]->integer == primary) {
      replica = p;
    }
  }
  ASSERT_NE(replica, 0) << "no replica of the primary on port " << primary;
  std::atomic<bool> stop{false};
  std::atomic<int> unavailable{0};
  std::atomic<int> other_errors{0};
  std::mutex mu;
  std::vector<std::string> recorded;
  std::map<int, std::chrono::steady_clock::time_point> last_success;
  std::string first_error;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; !stop.load(); ++i) {
        const std::string key = std::to_string(t) + ":" + std::to_string(i);
        try {
          const AcquireResult r = store->acquire("s", key, Duration{5000}, Duration{600000});
          if (!std::holds_alternative<Acquired>(r)) {
            ++other_errors;
            continue;
          }
          if (store->complete("s", key, std::get<Acquired>(r).lease.token, "v" + key,
                              Duration{600000}) == WriteResult::kDone) {
            std::lock_guard lock(mu);
            recorded.push_back(key);
            last_success[t] = std::chrono::steady_clock::now();
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        } catch (const StoreUnavailable&) {
          ++unavailable;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        } catch (const std::exception& e) {
          std::lock_guard lock(mu);
          if (first_error.empty()) first_error = e.what();
          ++other_errors;
        }
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
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(RawRedis(replica).text({"CLUSTER", "FAILOVER"}), "OK");
  for (int i = 0; i < 100 && owner_port(0) != replica; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(owner_port(0), replica) << "the replica did not take over";
  const auto failover_at = std::chrono::steady_clock::now();
  bool all_recovered = false;
  for (int i = 0; i < 200 && !all_recovered; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::lock_guard lock(mu);
    all_recovered = last_success.size() == 8;
    for (const auto& [t, at] : last_success) {
      all_recovered = all_recovered && at > failover_at + std::chrono::seconds(1);
    }
  }
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_TRUE(all_recovered) << "a caller never recorded again after the failover";
  EXPECT_EQ(other_errors.load(), 0) << first_error;
  std::cout << "recorded " << recorded.size() << " keys; " << unavailable.load()
            << " calls failed with StoreUnavailable during the failover\n";
  auto check = open_store(with_param(cluster_url(), "prefix", prefix));
  for (const std::string& key : recorded) {
    const std::optional<Record> r = check->get("s", key);
    ASSERT_TRUE(r.has_value()) << key << " was reported recorded and is lost";
    EXPECT_EQ(r->state, RecordState::kComplete);
  }
}

}  // namespace
}  // namespace idem::testing
