// Redis store tests on the shared server, each under a fresh key prefix: binary-safe keys
// and where they land, native expiry, tokens across release, forget and expiry (and a
// server clock that stepped back), the batched extend, the GET replay path, a read-only
// store and the executor's heartbeat over Redis.

#include "idem/stores/redis_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.h"
#include "idem/executor.h"
#include "idem/open_store.h"
#include "idem/testing/matchers.h"
#include "stores/redis/redis_layout.h"
#include "stores/redis/redis_test_util.h"
#include "support/eventually.h"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

std::string bytes(const char* text, std::size_t n) { return std::string(text, n); }

class RedisStoreTest : public SharedRedisTest {
 protected:
  void SetUp() override {
    SharedRedisTest::SetUp();
    if (IsSkipped() || HasFailure()) return;
    options_ = shared_options();
  }
  std::shared_ptr<RedisStore> open(RedisStoreOptions o) { return std::make_shared<RedisStore>(o); }
  std::shared_ptr<RedisStore> open() { return open(options_); }
  std::string redis_key(std::string_view scope, std::string_view key) const {
    return redis::record_key(options_.prefix, scope, key);
  }
  // The record keys under this test's prefix, as the server lists them (not the store's
  // token key).
  std::vector<std::string> keys(RawRedis& raw) {
    std::vector<std::string> out;
    RawReply r = raw.command({"KEYS", options_.prefix + "{*"});
    if (!r) return out;
    for (std::size_t i = 0; i < r->elements; ++i) {
      out.emplace_back(r->element[i]->str, r->element[i]->len);
    }
    return out;
  }
  long long expire_time(RawRedis& raw, std::string_view scope, std::string_view key) {
    return raw.integer({"PEXPIRETIME", redis_key(scope, key)});
  }
  RedisStoreOptions options_;
};

// A record value built by hand from the layout in redis_layout.h, written behind the
// store's back.
std::string value(char kind, std::uint64_t token, std::int64_t at, std::int64_t lease,
                  std::int64_t expires, std::uint32_t attempt, const std::string& tail) {
  std::string v(1, kind);
  for (auto n : {token, static_cast<std::uint64_t>(at), static_cast<std::uint64_t>(lease),
                 static_cast<std::uint64_t>(expires)}) {
    for (int shift = 56; shift >= 0; shift -= 8) v.push_back(static_cast<char>(n >> shift));
  }
  for (int shift = 24; shift >= 0; shift -= 8) v.push_back(static_cast<char>(attempt >> shift));
  return v + tail;
}

std::string no_fingerprint() {
  std::string fp;
  redis::append_fingerprint_section(fp, std::nullopt);
  return fp;
}

TEST_F(RedisStoreTest, HostileScopesAndKeysRoundTripUnderTheirOwnRedisKeys) {
  auto store = open();
  RawRedis raw(options_);
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"a:b", "c"},
      {"a", "b:c"},
      {bytes("s\0", 2), bytes("\0k\0", 3)},
      {"{tag}", "}{"},
      {"%3A", ":"},
      {std::string(255, '\xff'), std::string(1024, ':')},
      {std::string(255, '{'), std::string(1024, '\0')}};
  for (const auto& [scope, key] : pairs) {
    const Lease lease = std::get<Acquired>(store->acquire(scope, key, 30s, 1h, key)).lease;
    ASSERT_THAT(store->complete(scope, key, lease.token, scope + "|" + key, 1h), IsDone());
  }
  for (const auto& [scope, key] : pairs) {
    SCOPED_TRACE(::testing::PrintToString(scope.substr(0, 8)) + " / " +
                 ::testing::PrintToString(key.substr(0, 8)));
    const AcquireResult r = store->acquire(scope, key, 30s, 1h);
    ASSERT_THAT(r, IsReplay(scope + "|" + key));
    EXPECT_EQ(std::get<Replay>(r).fingerprint, std::optional<std::string>(key));
    // SPEC §10: the pair reaches Redis as one key of the injective layout, and nothing else.
    EXPECT_EQ(raw.integer({"EXISTS", redis_key(scope, key)}), 1);
    // Its one hash tag is the whole escaped pair: the record's slot is its own.
    const std::string k = redis_key(scope, key);
    const std::size_t open = k.find('{');
    EXPECT_EQ(redis::hash_slot(k), redis::hash_slot(k.substr(open + 1, k.size() - open - 2)));
  }
  EXPECT_EQ(keys(raw).size(), pairs.size());
  EXPECT_TRUE(store->forget("a:b", "c"));
  EXPECT_THAT(store->acquire("a", "b:c", 30s, 1h), IsReplay("a|b:c"));
  EXPECT_EQ(keys(raw).size(), pairs.size() - 1);
}

TEST_F(RedisStoreTest, UnixSocketUrlReachesTheSameRecordsAsTcp) {
  const char* socket = std::getenv("IDEM_TEST_REDIS_SOCKET");
  IDEM_SKIP_OR_FAIL_UNLESS(socket != nullptr && *socket != '\0',
                           "IDEM_TEST_REDIS_SOCKET is not set");
  auto tcp = open();
  auto local = open_store(std::string("unix://") + socket + "?db=0&prefix=" + options_.prefix);
  EXPECT_EQ(local->describe(), std::string("unix://") + socket);
  const Lease lease = std::get<Acquired>(local->acquire("s", "k", 30s, 1h)).lease;
  EXPECT_THAT(tcp->acquire("s", "k", 30s, 1h), IsBusy());
  ASSERT_THAT(tcp->complete("s", "k", lease.token, "over tcp", 1h), IsDone());
  EXPECT_THAT(local->acquire("s", "k", 30s, 1h), IsReplay("over tcp"));
}

TEST_F(RedisStoreTest, RecordKeyExpiresWhenSpecAllowsItToBePurged) {
  auto store = open();
  RawRedis raw(options_);
  // SPEC §8: an IN_PROGRESS record lives until max(expires_at, lease_expires_at). Redis keeps
  // a key while now <= its expiry, so the key expires exactly at that instant - 1, however
  // long the script took to reach its SET (a relative PX would count from then).
  auto expect_expiry_at = [&](std::string_view key, Timestamp deadline) {
    EXPECT_EQ(expire_time(raw, "s", key), deadline.time_since_epoch().count() - 1) << key;
  };
  const Lease long_lease = std::get<Acquired>(store->acquire("s", "lease", 1h, 1min)).lease;
  expect_expiry_at("lease", long_lease.lease_expires_at);
  const Lease long_ttl = std::get<Acquired>(store->acquire("s", "ttl", 1min, 1h)).lease;
  expect_expiry_at("ttl", long_ttl.expires_at);

  // The heartbeat pushes it out with the lease, and never pulls it in.
  const ExtendResult e = store->extend("s", "ttl", long_ttl.token, 2h);
  ASSERT_TRUE(e.done());
  expect_expiry_at("ttl", e.lease_expires_at);
  const long long pushed = expire_time(raw, "s", "ttl");
  ASSERT_TRUE(store->extend("s", "ttl", long_ttl.token, 1s).done());
  EXPECT_EQ(expire_time(raw, "s", "ttl"), pushed);

  // A COMPLETE record lives exactly until its expires_at: a key Redis returns is live.
  ASSERT_THAT(store->complete("s", "lease", long_lease.token, "p", 10min), IsDone());
  const Record rec = store->get("s", "lease").value();
  EXPECT_EQ(expire_time(raw, "s", "lease"), rec.expires_at.time_since_epoch().count() - 1);
  // Nothing needs purging.
  EXPECT_EQ(store->purge(1000), 0u);
}

TEST_F(RedisStoreTest, TokensIncreasePerKeyAcrossReleaseForgetExpiryAndSteals) {
  auto store = open();
  constexpr int kThreads = 8;
  constexpr int kKeys = 3;
  constexpr int kGrants = 200;
  std::mutex mu[kKeys];
  Token last[kKeys] = {};
  std::atomic<int> granted{0}, violations{0}, stolen{0}, released{0}, forgotten{0}, expiring{0};
  // Until enough tokens were granted and every way a record goes away or changes hands was
  // taken (bounded: a broken store fails instead of spinning).
  auto done = [&] {
    return granted >= kGrants && stolen > 0 && released > 0 && forgotten > 0 && expiring > 0;
  };
  const auto give_up = std::chrono::steady_clock::now() + kEventually;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      while (!done() && std::chrono::steady_clock::now() < give_up) {
        const int k = static_cast<int>(rng() % kKeys);
        const std::string key = "k" + std::to_string(k);
        Token token = 0;
        try {
          std::unique_lock lock(mu[k]);  // the key's acquires in one order, the store's
          const AcquireResult r = store->acquire("s", key, 5ms, 15ms);
          if (const auto* a = std::get_if<Acquired>(&r)) {
            token = a->lease.token;
            if (token <= last[k]) ++violations;
            last[k] = token;
            ++granted;
            if (a->stolen) ++stolen;
          }
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
          return;
        }
        if (token == 0) {
          std::this_thread::sleep_for(1ms);  // busy or replayed: let the deadlines pass
          continue;
        }
        switch (rng() % 4) {
          case 0:  // released (fenced if the 5 ms lease passed and another thread stole it)
            if (store->release("s", key, token) == WriteResult::kDone) ++released;
            break;
          case 1:  // completed and forgotten
            if (store->complete("s", key, token, "p", 15ms) == WriteResult::kDone &&
                store->forget("s", key)) {
              ++forgotten;
            }
            break;
          case 2:  // abandoned: stolen after 5 ms, or dropped by the server after 15 ms
            break;
          default:  // completed, then expired by the server after 15 ms
            if (store->complete("s", key, token, "p", 15ms) == WriteResult::kDone) ++expiring;
            break;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(done()) << granted << " granted, " << stolen << " stolen, " << released
                      << " released, " << forgotten << " forgotten, " << expiring << " expiring";
  EXPECT_EQ(violations.load(), 0);
}

// The store's token key as the acquire script keeps it: 8 bytes, big-endian.
std::string packed_token(std::uint64_t token) {
  std::string v;
  for (int shift = 56; shift >= 0; shift -= 8) v.push_back(static_cast<char>(token >> shift));
  return v;
}

TEST_F(RedisStoreTest, TokensIssuedAheadOfTheServerClockStillOrderLaterTokens) {
  // Tokens issued before the server's clock stepped back are from its "future". The token
  // key holds the largest, so a token made from the clock afterwards is still larger, also
  // for a key whose record was released, forgotten or expired meanwhile
  // (docs/stores/redis.md, "Tokens").
  auto store = open();
  RawRedis raw(options_);
  const std::int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
  const std::uint64_t future = static_cast<std::uint64_t>(now_ms + 60'000) * 1000;
  ASSERT_EQ(raw.text({"SET", redis::token_key(options_.prefix), packed_token(future)}), "OK");
  for (const char* how : {"release", "forget", "absent"}) {
    SCOPED_TRACE(how);
    const std::string k = redis_key("s", how);
    if (std::string(how) != "absent") {
      ASSERT_EQ(raw.text({"SET", k,
                          value('P', future, now_ms, now_ms + 60'000, now_ms + 60'000, 1,
                                no_fingerprint()),
                          "PXAT", std::to_string(now_ms + 120'000)}),
                "OK");
    }
    if (std::string(how) == "release") {
      ASSERT_THAT(store->release("s", how, future), IsDone());
    } else if (std::string(how) == "forget") {
      ASSERT_TRUE(store->forget("s", how));
    }
    EXPECT_EQ(raw.integer({"EXISTS", k}), 0);
    const AcquireResult r = store->acquire("s", how, 30s, 1h);
    ASSERT_THAT(r, IsFreshlyAcquired());
    EXPECT_GT(std::get<Acquired>(r).lease.token, future);
  }
  // A tombstone an earlier version left (a record deleted before the clock passed its
  // token) reads as absent, and its token still orders the next one.
  const std::uint64_t later = future + 5'000'000;
  const std::string k = redis_key("s", "tombstone");
  ASSERT_EQ(
      raw.text({"SET", k, value('T', later, 0, 0, 0, 0, ""), "PXAT", std::to_string(later / 1000)}),
      "OK");
  EXPECT_EQ(store->get("s", "tombstone"), std::nullopt);
  EXPECT_FALSE(store->forget("s", "tombstone"));
  ASSERT_EQ(
      raw.text({"SET", k, value('T', later, 0, 0, 0, 0, ""), "PXAT", std::to_string(later / 1000)}),
      "OK");
  const AcquireResult r = store->acquire("s", "tombstone", 30s, 1h);
  ASSERT_THAT(r, IsFreshlyAcquired());
  EXPECT_GT(std::get<Acquired>(r).lease.token, later);
}

TEST_F(RedisStoreTest, ExtendManyIsOneRoundTripWithResultsInOrder) {
  auto store = open();
  constexpr int kLeases = 200;
  std::vector<std::string> keys;
  std::vector<Token> tokens;
  for (int i = 0; i < kLeases; ++i) {
    keys.push_back("k" + std::to_string(i));
    tokens.push_back(std::get<Acquired>(store->acquire("s", keys.back(), 10s, 1h)).lease.token);
  }
  std::vector<ExtendRequest> requests;
  for (int i = 0; i < kLeases; ++i) {
    // Every third one with a wrong token: fenced, in its place.
    requests.push_back({"s", keys[i], i % 3 == 0 ? tokens[i] + 1 : tokens[i], 1min});
  }
  const RedisStats before = store->stats();
  const std::vector<ExtendResult> results = store->extend_many(requests);
  const RedisStats after = store->stats();
  EXPECT_EQ(after.round_trips - before.round_trips, 1u);
  EXPECT_EQ(after.commands - before.commands, static_cast<std::uint64_t>(kLeases));
  ASSERT_EQ(results.size(), requests.size());
  for (int i = 0; i < kLeases; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(results[i].done(), i % 3 != 0);
    const Record rec = store->get("s", keys[i]).value();
    if (results[i].done()) {
      EXPECT_EQ(results[i].lease_remaining, 1min);
      EXPECT_EQ(rec.lease_expires_at, results[i].lease_expires_at);
    } else {
      EXPECT_LE(rec.lease_expires_at - rec.acquired_at, 10s);
    }
  }
}

TEST_F(RedisStoreTest, ReplayFromAPlainGetIsOneRoundTripAndFreshKeysPayTwo) {
  RedisStoreOptions o = options_;
  o.replay = RedisReplayPath::kGet;
  auto store = open(o);
  RedisStats s0 = store->stats();
  const Lease lease = std::get<Acquired>(store->acquire("s", "k", 30s, 1h, "fp")).lease;
  RedisStats s1 = store->stats();
  EXPECT_EQ(s1.commands - s0.commands, 3u);  // GET (miss) and TIME, then the acquire script
  EXPECT_EQ(s1.round_trips - s0.round_trips, 2u);
  EXPECT_THAT(store->acquire("s", "k", 30s, 1h), IsBusy());
  ASSERT_THAT(store->complete("s", "k", lease.token, "result", 1h), IsDone());
  s1 = store->stats();
  const AcquireResult r = store->acquire("s", "k", 30s, 1h);
  const RedisStats s2 = store->stats();
  ASSERT_THAT(r, IsReplay("result"));
  EXPECT_EQ(std::get<Replay>(r).fingerprint, std::optional<std::string>("fp"));
  EXPECT_EQ(s2.commands - s1.commands, 2u);  // GET and TIME, no script
  EXPECT_EQ(s2.round_trips - s1.round_trips, 1u);
}

TEST_F(RedisStoreTest, ReplayFromAPlainGetNeverServesAnExpiredResult) {
  // A COMPLETE record whose key outlives its expires_at (its token's millisecond is later:
  // the server clock stepped back) must not replay from a GET; the script judges it.
  RedisStoreOptions o = options_;
  o.replay = RedisReplayPath::kGet;
  auto store = open(o);
  RawRedis raw(options_);
  const std::int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
  const std::uint64_t future = static_cast<std::uint64_t>(now_ms + 60'000) * 1000;
  ASSERT_EQ(
      raw.text({"SET", redis_key("s", "k"),
                value('C', future, now_ms - 2000, 0, now_ms - 1000, 0, no_fingerprint() + "stale"),
                "PXAT", std::to_string(future / 1000)}),
      "OK");
  const AcquireResult r = store->acquire("s", "k", 30s, 1h);
  ASSERT_THAT(r, IsFreshlyAcquired());
  EXPECT_GT(std::get<Acquired>(r).lease.token, future);
}

TEST_F(RedisStoreTest, ReadOnlyStoreAnswersReplaysAndBusyAndWritesNothing) {
  auto writer = open();
  const Lease done = std::get<Acquired>(writer->acquire("s", "done", 30s, 1h)).lease;
  ASSERT_THAT(writer->complete("s", "done", done.token, "result", 1h), IsDone());
  const Lease held = std::get<Acquired>(writer->acquire("s", "held", 30s, 1h)).lease;
  RawRedis raw(options_);
  const std::size_t before = keys(raw).size();

  RedisStoreOptions o = options_;
  o.read_only = true;
  auto reader = open(o);
  EXPECT_THAT(reader->acquire("s", "done", 30s, 1h), IsReplay("result"));
  EXPECT_THAT(reader->acquire("s", "held", 30s, 1h), IsBusy());
  EXPECT_EQ(reader->get("s", "done").value().payload, "result");
  EXPECT_EQ(reader->get("s", "absent"), std::nullopt);
  EXPECT_EQ(reader->purge(10), 0u);
  auto refused = [](auto&& step) {
    try {
      step();
      ADD_FAILURE() << "a read-only store wrote";
    } catch (const StoreUnavailable& e) {
      EXPECT_THAT(e.what(), HasSubstr("read-only"));
    }
  };
  refused([&] { (void)reader->acquire("s", "absent", 30s, 1h); });
  refused([&] { (void)reader->complete("s", "held", held.token, "x", 1h); });
  refused([&] { (void)reader->release("s", "held", held.token); });
  refused([&] { (void)reader->extend("s", "held", held.token, 1min); });
  refused([&] { (void)reader->forget("s", "done"); });
  EXPECT_EQ(keys(raw).size(), before);
  EXPECT_EQ(reader->get("s", "held").value().lease_expires_at, held.lease_expires_at);
}

TEST_F(RedisStoreTest, OpenStoreHonoursReadOnly) {
  auto writer = open();
  const Lease done = std::get<Acquired>(writer->acquire("s", "done", 30s, 1h)).lease;
  ASSERT_THAT(writer->complete("s", "done", done.token, "result", 1h), IsDone());
  auto reader =
      open_store(with_param(url_, "prefix", options_.prefix), OpenOptions{.read_only = true});
  EXPECT_THAT(reader->acquire("s", "done", 30s, 1h), IsReplay("result"));
  try {
    (void)reader->acquire("s", "absent", 30s, 1h);
    ADD_FAILURE() << "a store opened read-only by open_store wrote";
  } catch (const StoreUnavailable& e) {
    EXPECT_THAT(e.what(), HasSubstr("read-only"));
  }
  EXPECT_EQ(writer->get("s", "absent"), std::nullopt);
}

TEST_F(RedisStoreTest, HeartbeatKeepsALongActionsLeaseThroughBatchedExtends) {
  auto store = open();
  Executor executor(store, ExecutorOptions{.lease = 300ms});
  const auto r = executor.run("s", "long", [&](const Attempt& attempt) {
    // Wait (bounded) until the heartbeat has pushed the lease out three times over.
    const Timestamp first = store->get("s", "long").value().lease_expires_at;
    EXPECT_TRUE(eventually(
        [&] { return store->get("s", "long").value().lease_expires_at - first >= 900ms; }));
    EXPECT_FALSE(attempt.lease_lost());
    return std::string("finished");
  });
  EXPECT_EQ(r.value, "finished");
  EXPECT_FALSE(r.replayed);
  EXPECT_THAT(store->acquire("s", "long", 1s, 1h), IsReplay("finished"));
}

TEST_F(RedisStoreTest, ThirtyTwoCallersOfRunShareTheConnections) {
  auto store = open();
  Executor executor(store);
  constexpr int kThreads = 32;
  constexpr int kCalls = 40;
  std::atomic<int> ran{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        // Half the keys are shared by pairs of threads, so some calls replay.
        const std::string key = i % 2 == 0
                                    ? "own-" + std::to_string(t) + "-" + std::to_string(i)
                                    : "pair-" + std::to_string(t / 2) + "-" + std::to_string(i);
        try {
          const auto r = executor.run(
              "s", key,
              [&](const Attempt&) {
                ++ran;
                return key;
              },
              CallOptions{.wait = WaitPolicy{.max_wait = 10s}});
          EXPECT_EQ(r.value, key);
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ran.load(), kThreads * kCalls / 2 + kThreads / 2 * kCalls / 2);
  const RedisStats s = store->stats();
  std::cout << "[ pipelining ] " << s.commands << " commands in " << s.round_trips
            << " round trips\n";
  EXPECT_EQ(s.queued, 0u);
}

}  // namespace
}  // namespace idem::testing
