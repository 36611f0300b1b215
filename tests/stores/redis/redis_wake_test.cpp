// SPEC §7 on Redis (stores/redis/redis_subscriber.h): a duplicate waiting in another process
// or store object wakes when the owner completes, releases or forgets, through sharded
// publish/subscribe; thousands of watches cost one subscription on one connection; a killed
// subscriber connection comes back and its waiters still answer; without notifications
// (notify=off, or an ACL that denies publishing) the store polls and stays correct. The
// waiting workers poll once an hour: only a notification can end their wait before the
// test's bound. The same check over TLS and behind Sentinel, and that the cluster does not
// watch, are in redis_tls_test, redis_sentinel_test and redis_cluster_test.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "idem/error.h"
#include "idem/executor.h"
#include "idem/open_store.h"
#include "idem/stores/redis_store.h"
#include "idem/testing/matchers.h"  // gtest printers for the store results (ODR)
#include "stores/redis/redis_layout.h"
#include "stores/redis/redis_test_util.h"
#include "support/eventually.h"
#include "support/worker_process.h"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr const char* kHour = "3600000";

Token hold(Store& store, const std::string& key) {
  AcquireResult r = store.acquire("mp", key, 10min, 1h);
  EXPECT_TRUE(std::holds_alternative<Acquired>(r));
  return std::holds_alternative<Acquired>(r) ? std::get<Acquired>(r).lease.token : 0;
}

// This process's subscriber threads, by the name the store gives them.
std::size_t subscriber_threads() {
  std::size_t n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name) && name == "idem-redis-sub") ++n;
  }
  return n;
}

std::string subscriber_name() { return "idem-redis-sub-" + std::to_string(::getpid()); }

// The ids of the server's clients named `name` (CLIENT LIST).
std::vector<std::string> clients_named(RawRedis& raw, const std::string& name) {
  std::vector<std::string> ids;
  std::istringstream lines(raw.text({"CLIENT", "LIST"}));
  for (std::string line; std::getline(lines, line);) {
    if (line.find(" name=" + name + " ") == std::string::npos) continue;
    const std::size_t at = line.find("id=");
    ids.push_back(line.substr(at + 3, line.find(' ', at) - at - 3));
  }
  return ids;
}

// Subscribers of a channel (PUBSUB SHARDNUMSUB).
long long shard_subscribers(RawRedis& raw, const std::string& channel) {
  RawReply r = raw.command({"PUBSUB", "SHARDNUMSUB", channel});
  if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) return -1;
  return r->element[1]->integer;
}

// SPUBLISH calls the server has counted (INFO commandstats), scripts' included.
long long spublish_calls(RawRedis& raw) {
  const std::string info = raw.text({"INFO", "commandstats"});
  const std::size_t at = info.find("cmdstat_spublish:calls=");
  if (at == std::string::npos) return 0;
  return std::stoll(info.substr(at + 23));
}

// Two stores of the test on the shared server under one fresh prefix: one that owns keys,
// one whose watches wait for them; and the URL that opens the same.
class RedisWake : public SharedRedisTest {
 protected:
  void SetUp() override {
    SharedRedisTest::SetUp();
    if (IsSkipped() || HasFailure()) return;
    options_ = shared_options();
    url_ = with_param(url_, "prefix", options_.prefix);
    owner_ = std::make_shared<RedisStore>(options_);
    waiter_ = std::make_shared<RedisStore>(options_);
  }
  std::string channel(const std::string& key) const {
    return redis::record_key(options_.prefix, "mp", key);
  }
  RedisStoreOptions options_;
  std::shared_ptr<RedisStore> owner_;
  std::shared_ptr<RedisStore> waiter_;
};

TEST_F(RedisWake, AWaiterInAnotherProcessWakesWhenTheOwnerCompletes) {
  EXPECT_TRUE(owner_->stats().notify);
  const Token token = hold(*owner_, "job");
  Worker waiter({"wait", url_, "job", kHour});
  ASSERT_EQ(waiter.read_line(), "waiting");
  ASSERT_EQ(owner_->complete("mp", "job", token, "first", 1h), WriteResult::kDone);
  EXPECT_THAT(waiter.read_line(), StartsWith("replay first acquires="));
  EXPECT_EQ(waiter.wait(), 0);
}

TEST_F(RedisWake, AWaiterInAnotherProcessWakesWhenTheOwnerReleases) {
  const Token token = hold(*owner_, "job");
  Worker waiter({"wait", url_, "job", kHour});
  ASSERT_EQ(waiter.read_line(), "waiting");
  ASSERT_EQ(owner_->release("mp", "job", token), WriteResult::kDone);
  EXPECT_THAT(waiter.read_line(), StartsWith("ran acquires="));
  EXPECT_EQ(waiter.wait(), 0);
  EXPECT_EQ(owner_->get("mp", "job")->payload, "mine");
}

TEST_F(RedisWake, WithoutANotificationAWaiterStillAnswersByPolling) {
  // This owner never publishes: the waiter must find the result by polling.
  RedisStoreOptions quiet = options_;
  quiet.notify = false;
  RedisStore owner(quiet);
  const Token token = hold(owner, "job");
  Worker waiter({"wait", url_, "job", "20"});
  ASSERT_EQ(waiter.read_line(), "waiting");
  ASSERT_EQ(owner.complete("mp", "job", token, "first", 1h), WriteResult::kDone);
  EXPECT_THAT(waiter.read_line(), StartsWith("replay first acquires="));
  EXPECT_EQ(waiter.wait(), 0);
}

TEST_F(RedisWake, AForgetWakesTheWatchesOfItsRecord) {
  (void)hold(*owner_, "job");
  std::atomic<int> woken{0};
  auto watch = waiter_->watch("mp", "job", [&] { ++woken; });
  ASSERT_NE(watch, nullptr);
  ASSERT_TRUE(eventually([&] { return waiter_->stats().subscribed_channels == 1 && woken > 0; }));
  const int before = woken.load();
  ASSERT_TRUE(owner_->forget("mp", "job"));
  EXPECT_TRUE(eventually([&] { return woken.load() > before; }));
}

TEST_F(RedisWake, ThousandsOfWatchesOnOneKeyShareOneSubscriptionOnOneConnection) {
  RawRedis raw(options_);
  const Token token = hold(*owner_, "hot");
  EXPECT_EQ(subscriber_threads(), 0U);
  std::atomic<int> woken{0};
  std::atomic<int> woken_elsewhere{0};
  std::vector<std::unique_ptr<RecordWatch>> watches;
  for (int i = 0; i < 2000; ++i) {
    watches.push_back(waiter_->watch("mp", "hot", [&] { ++woken; }));
    ASSERT_NE(watches.back(), nullptr);
  }
  watches.push_back(waiter_->watch("mp", "cold", [&] { ++woken_elsewhere; }));
  EXPECT_EQ(subscriber_threads(), 1U);
  // Each confirmed subscription calls the watches its channel has by then once.
  ASSERT_TRUE(eventually([&] {
    return waiter_->stats().subscribed_channels == 2 && woken.load() > 0 &&
           woken_elsewhere.load() == 1;
  }));
  const int before = woken.load();
  EXPECT_EQ(shard_subscribers(raw, channel("hot")), 1);
  EXPECT_EQ(shard_subscribers(raw, channel("cold")), 1);
  // One connection: every store of this process that watched was closed before.
  EXPECT_TRUE(eventually([&] { return clients_named(raw, subscriber_name()).size() == 1; }));
  EXPECT_EQ(waiter_->stats().subscriber_connects, 1U);

  ASSERT_EQ(owner_->complete("mp", "hot", token, "done", 1h), WriteResult::kDone);
  EXPECT_TRUE(eventually([&] { return woken.load() == before + 2000; })) << woken.load();
  EXPECT_EQ(woken_elsewhere.load(), 1);
  EXPECT_EQ(waiter_->stats().notifications, 1U);

  // The last watch of a record ends its subscription; ended watches are never called again.
  watches.clear();
  EXPECT_TRUE(eventually([&] {
    return shard_subscribers(raw, channel("hot")) == 0 &&
           shard_subscribers(raw, channel("cold")) == 0;
  }));
  ASSERT_TRUE(owner_->forget("mp", "hot"));
  EXPECT_EQ(woken.load(), before + 2000);
}

TEST_F(RedisWake, AKilledSubscriberConnectionComesBackAndTheWaiterStillAnswers) {
  RawRedis raw(options_);
  const Token token = hold(*owner_, "job");
  // A waiter in this process that polls once an hour: only a notification answers it.
  Executor exec(
      waiter_,
      ExecutorOptions{.wait = WaitPolicy{.max_wait = 1h, .initial_backoff = 1h, .max_backoff = 1h},
                      .on_heartbeat_error = nullptr});
  auto waited = std::async(std::launch::async, [&] {
    return exec.run("mp", "job", [](const Attempt&) { return std::string("mine"); });
  });
  ASSERT_TRUE(eventually([&] { return waiter_->stats().subscribed_channels == 1; }));
  std::vector<std::string> ids;
  ASSERT_TRUE(
      eventually([&] { return (ids = clients_named(raw, subscriber_name())).size() == 1; }));
  ASSERT_EQ(raw.integer({"CLIENT", "KILL", "ID", ids.front()}), 1);
  // Opened again and subscribed again.
  ASSERT_TRUE(eventually([&] {
    const RedisStats s = waiter_->stats();
    return s.subscriber_reconnects >= 1 && s.subscribed_channels == 1;
  }));
  ASSERT_EQ(owner_->complete("mp", "job", token, "first", 1h), WriteResult::kDone);
  ASSERT_EQ(waited.wait_for(60s), std::future_status::ready);
  const Result<std::string> r = waited.get();
  EXPECT_TRUE(r.replayed);
  EXPECT_EQ(r.value, "first");
}

TEST_F(RedisWake, NotifyOffGivesNoWatch) {
  auto quiet = open_store(url_ + "&notify=off");
  EXPECT_EQ(quiet->watch("mp", "k", [] {}), nullptr);
  EXPECT_FALSE(dynamic_cast<RedisStore&>(*quiet).stats().notify);
  EXPECT_NE(open_store(url_ + "&notify=ON")->watch("mp", "k", [] {}), nullptr);
}

TEST_F(RedisWake, ABadNotifyValueIsRefusedSayingSo) {
  try {
    (void)open_store(url_ + "&notify=1");
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("notify"));
    EXPECT_THAT(e.what(), HasSubstr("'on' or 'off'"));
    EXPECT_THAT(e.what(), HasSubstr("'1'"));
  }
}

// Tests on a server of their own (INFO's counts, ACL users).
class RedisWakePrivate : public PrivateRedisTest {};

TEST_F(RedisWakePrivate, WithNotifyOffTheScriptsDoNotPublish) {
  PrivateRedis server;
  ASSERT_TRUE(server.ok());
  RawRedis raw(server.port());
  RedisStoreOptions o = server.options();
  o.notify = false;
  {
    RedisStore quiet(o);
    const long long before = spublish_calls(raw);
    Token token = hold(quiet, "a");
    ASSERT_EQ(quiet.complete("mp", "a", token, "p", 1h), WriteResult::kDone);
    token = hold(quiet, "b");
    ASSERT_EQ(quiet.release("mp", "b", token), WriteResult::kDone);
    ASSERT_TRUE(quiet.forget("mp", "a"));
    EXPECT_EQ(spublish_calls(raw), before);
  }
  o.notify = true;
  RedisStore loud(o);
  // The check at open, then one per write.
  const long long before = spublish_calls(raw);
  EXPECT_GE(before, 1);
  Token token = hold(loud, "a");
  ASSERT_EQ(loud.complete("mp", "a", token, "p", 1h), WriteResult::kDone);
  token = hold(loud, "b");
  ASSERT_EQ(loud.release("mp", "b", token), WriteResult::kDone);
  ASSERT_TRUE(loud.forget("mp", "a"));
  EXPECT_EQ(spublish_calls(raw), before + 3);
}

TEST_F(RedisWakePrivate, ASilentServerIsPingedAndTheSubscriptionComesBack) {
  PrivateRedis server;
  ASSERT_TRUE(server.ok());
  RedisStoreOptions o = server.options();
  o.timeout = 300ms;
  o.connect_timeout = 300ms;
  RedisStore waiter(o);
  RedisStore owner(o);
  std::atomic<int> woken{0};
  auto watch = waiter.watch("mp", "job", [&] { ++woken; });
  ASSERT_NE(watch, nullptr);
  ASSERT_TRUE(eventually([&] { return waiter.stats().subscribed_channels == 1 && woken > 0; }));
  // A server that stops answering without closing the socket: only the PING after 5 s of
  // silence finds out.
  server.pause();
  ASSERT_TRUE(eventually([&] { return waiter.stats().subscribed_channels == 0; }));
  server.resume();
  ASSERT_TRUE(eventually([&] {
    const RedisStats s = waiter.stats();
    return s.subscriber_reconnects >= 1 && s.subscribed_channels == 1;
  }));
  const int before = woken.load();
  const Token token = hold(owner, "job");
  ASSERT_EQ(owner.complete("mp", "job", token, "done", 1h), WriteResult::kDone);
  EXPECT_TRUE(eventually([&] { return woken.load() > before; }));
}

// Behind Sentinel, on servers of the test's own (a failover of the shared sentinel set
// would disturb other tests): after SENTINEL FAILOVER the subscriber is on the new primary,
// subscribed again, and a complete there wakes the watch.
TEST_F(RedisWakePrivate, TheSubscriptionFollowsASentinelFailover) {
  PrivateRedis first;
  PrivateRedis second;
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_EQ(RawRedis(second.port()).text({"REPLICAOF", "127.0.0.1", std::to_string(first.port())}),
            "OK");
  PrivateRedis sentinel({"--sentinel"}, {}, sentinel_config("wake", first.port(), 1000));
  ASSERT_TRUE(sentinel.ok());
  RawRedis ask(sentinel.port());  // a sentinel kills no client of its own
  ASSERT_TRUE(ready_to_fail_over(ask, "wake", first.port()));
  const std::string prefix = fresh_prefix("wake-failover");
  const std::string url =
      "redis+sentinel://127.0.0.1:" + std::to_string(sentinel.port()) + "/wake?prefix=" + prefix;
  auto owner_store = open_store(url);
  auto& owner = dynamic_cast<RedisStore&>(*owner_store);
  auto waiter_store = open_store(url);
  auto& waiter = dynamic_cast<RedisStore&>(*waiter_store);
  std::atomic<int> woken{0};
  auto watch = waiter.watch("mp", "job", [&] { ++woken; });
  ASSERT_NE(watch, nullptr);
  ASSERT_TRUE(eventually([&] { return waiter.stats().subscribed_channels == 1 && woken > 0; }));
  {
    RawRedis old_primary(first.port());
    ASSERT_EQ(clients_named(old_primary, subscriber_name()).size(), 1U);
  }
  // Both stores follow the sentinel before the failover, so both hear of it.
  ASSERT_TRUE(
      eventually([&] { return owner.stats().switch_events && waiter.stats().switch_events; }));

  ASSERT_EQ(ask.text({"SENTINEL", "FAILOVER", "wake"}), "OK");
  // A connection of its own each time: the sentinel kills the clients of the servers it
  // reconfigures (CLIENT KILL TYPE normal and pubsub).
  ASSERT_TRUE(eventually([&] {
    const RedisStats s = waiter.stats();
    RawRedis new_primary(second.port());
    return s.primary_switches >= 1 && s.subscriber_reconnects >= 1 && s.subscribed_channels == 1 &&
           clients_named(new_primary, subscriber_name()).size() == 1;
  }));
  // The owner's connections follow the failover too, on its own watch's thread: until they
  // have, its writes would still go to the old primary, which takes them until the sentinel
  // makes it a replica, and publish there. Its first calls after may still meet the
  // failover.
  ASSERT_TRUE(eventually([&] { return owner.stats().primary_switches >= 1; }));
  Token token = 0;
  ASSERT_TRUE(eventually([&] {
    try {
      token = hold(owner, "job");
      return token != 0;
    } catch (const StoreUnavailable&) {
      return false;
    }
  }));
  const int before = woken.load();
  ASSERT_EQ(owner.complete("mp", "job", token, "done", 1h), WriteResult::kDone);
  if (!eventually([&] { return woken.load() > before; })) {
    RawRedis new_primary(second.port());
    ADD_FAILURE() << "no wake; the record on the new primary: "
                  << new_primary.integer({"EXISTS", redis::record_key(prefix, "mp", "job")})
                  << ", the waiter's subscriber on it: "
                  << clients_named(new_primary, subscriber_name()).size();
  }
}

TEST_F(RedisWakePrivate, AnAclUserWithoutPublishRightsPollsAndStaysCorrect) {
  PrivateRedis server;
  ASSERT_TRUE(server.ok());
  RawRedis raw(server.port());
  // What the store needs to keep records, and no publish/subscribe.
  ASSERT_EQ(raw.text(least_acl_user("app", "s3cret-pw", "idem-acl:*")), "OK");
  const std::string url =
      "redis://app:s3cret-pw@127.0.0.1:" + std::to_string(server.port()) + "/0?prefix=idem-acl:";
  auto store = open_store(url);
  auto other = open_store(url);
  EXPECT_FALSE(dynamic_cast<RedisStore&>(*store).stats().notify);
  EXPECT_EQ(store->watch("mp", "k", [] {}), nullptr);
  // Correct without notifications: a waiter answers by polling.
  const Token token = hold(*store, "job");
  Executor exec(
      other, ExecutorOptions{
                 .wait = WaitPolicy{.max_wait = 1min, .initial_backoff = 5ms, .max_backoff = 20ms},
                 .on_heartbeat_error = nullptr});
  auto waited = std::async(std::launch::async, [&] {
    return exec.run("mp", "job", [](const Attempt&) { return std::string("mine"); });
  });
  ASSERT_EQ(store->complete("mp", "job", token, "first", 1h), WriteResult::kDone);
  ASSERT_EQ(waited.wait_for(60s), std::future_status::ready);
  EXPECT_EQ(waited.get().value, "first");
}

TEST_F(RedisWakePrivate, AnAclUserThatMayPublishButNotSubscribeEndsUpPolling) {
  PrivateRedis server;
  ASSERT_TRUE(server.ok());
  RawRedis raw(server.port());
  ASSERT_EQ(raw.text({"ACL", "SETUSER", "pub", "on", ">pw", "~idem-acl:*", "&idem-acl:*",
                      "+evalsha", "+eval", "+script|load", "+info", "+get", "+set", "+del",
                      "+append", "+time", "+spublish", "+client|setname"}),
            "OK");
  auto store = open_store("redis://pub:pw@127.0.0.1:" + std::to_string(server.port()) +
                          "/0?prefix=idem-acl:");
  auto& redis = dynamic_cast<RedisStore&>(*store);
  EXPECT_TRUE(redis.stats().notify);
  // The first watch starts the subscriber, whose SSUBSCRIBE the server refuses: from then
  // on the store hands out no watch, and its waiters poll.
  auto first = store->watch("mp", "k", [] {});
  EXPECT_TRUE(eventually([&] { return store->watch("mp", "k", [] {}) == nullptr; }));
  const Token token = hold(*store, "job");
  ASSERT_EQ(store->complete("mp", "job", token, "done", 1h), WriteResult::kDone);
  EXPECT_EQ(store->get("mp", "job")->payload, "done");
}

}  // namespace
}  // namespace idem::testing
