// The in-memory store: the conformance suite (fake clock, one shard, and the system clock,
// which also proves the suite's real-clock paths), plus what only this store has: shards,
// size(), purge's cursor and the "memory:" URL.

#include "idem/stores/memory_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"
#include "idem/testing/matchers.h"
#include "idem/testing/store_conformance.h"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;

StoreTestContext memory_context(std::string name, std::size_t shards, int stress_scale) {
  return StoreTestContext{.name = std::move(name),
                          .make =
                              [shards](std::shared_ptr<ManualClock> clock) {
                                return std::make_shared<MemoryStore>(MemoryStoreOptions{
                                    .clock = std::move(clock), .shards = shards});
                              },
                          .fake_clock = true,
                          .stress_scale = stress_scale};
}

IDEM_INSTANTIATE_STORE_CONFORMANCE(
    Memory, memory_context("Sharded", 0, 20), memory_context("OneShard", 1, 5),
    // The system clock: the suite sleeps instead of moving a fake clock, as it does for
    // servers.
    StoreTestContext{
        .name = "SystemClock",
        .make = [](std::shared_ptr<ManualClock>) { return std::make_shared<MemoryStore>(); },
        .fake_clock = false,
        .tick = Duration{100},
        .stress_scale = 5});

// The suite lives in a static library (idem::testing); the instantiation above must have
// linked every one of its files, whatever file a test of the suite is in.
TEST(MemoryStore, InstantiationLinksEveryTestOfTheSuite) {
  // Three contexts.
  EXPECT_EQ(instantiated_conformance_tests("Memory"), 3 * store_conformance_test_count());
  EXPECT_GT(store_conformance_test_count(), 50);
}

Duration seconds(int n) { return std::chrono::seconds(n); }

// ---- sharding, size() and purge ----

TEST(MemoryStore, SizeCountsRecordsIncludingExpiredOnes) {
  auto clock = std::make_shared<ManualClock>();
  MemoryStore store({.clock = clock});
  EXPECT_EQ(store.size(), 0u);
  for (int i = 0; i < 10; ++i) store.acquire("s", std::to_string(i), seconds(1), seconds(1));
  EXPECT_EQ(store.size(), 10u);
  clock->advance(seconds(2));
  // Expired, not yet purged: still held (SPEC §8, purging is about space).
  EXPECT_EQ(store.size(), 10u);
  EXPECT_TRUE(store.forget("s", "0"));
  EXPECT_EQ(store.size(), 9u);
  EXPECT_EQ(store.purge(4), 4u);
  EXPECT_EQ(store.size(), 5u);
  EXPECT_EQ(store.purge(100), 5u);
  EXPECT_EQ(store.size(), 0u);
}

TEST(MemoryStore, PurgeWithLimitOneReachesEveryShard) {
  auto clock = std::make_shared<ManualClock>();
  MemoryStore store({.clock = clock, .shards = 64});
  constexpr int kRecords = 300;
  for (int i = 0; i < kRecords; ++i) {
    const auto r = store.acquire("s", "k" + std::to_string(i), seconds(1), seconds(1));
    ASSERT_THAT(r, IsAcquired());
    ASSERT_THAT(store.complete("s", "k" + std::to_string(i), std::get<Acquired>(r).lease.token, "p",
                               seconds(1)),
                IsDone());
  }
  clock->advance(seconds(2));
  for (int i = 0; i < kRecords; ++i) ASSERT_EQ(store.purge(1), 1u) << "call " << i;
  EXPECT_EQ(store.purge(1), 0u);
  EXPECT_EQ(store.size(), 0u);
}

TEST(MemoryStore, PurgeFindsOneExpiredRecordWhereverItIs) {
  // Purge remembers where it stopped; it must still wrap around to every shard, including
  // those before its cursor.
  auto clock = std::make_shared<ManualClock>();
  MemoryStore store({.clock = clock, .shards = 16});
  for (int i = 0; i < 64; ++i)
    store.acquire("live", std::to_string(i), seconds(1000), seconds(1000));
  for (int i = 0; i < 100; ++i) {
    store.acquire("s", "k" + std::to_string(i), seconds(1), seconds(1));
    clock->advance(seconds(2));
    ASSERT_EQ(store.purge(1), 1u) << "record " << i;
    ASSERT_EQ(store.get("s", "k" + std::to_string(i)), std::nullopt);
  }
  EXPECT_EQ(store.size(), 64u);
}

TEST(MemoryStore, AnyShardCountWorks) {
  for (std::size_t shards : {1u, 3u, 64u, 1000u}) {
    SCOPED_TRACE(std::to_string(shards) + " shards");
    MemoryStore store({.clock = std::make_shared<ManualClock>(), .shards = shards});
    std::set<Token> tokens;
    for (int i = 0; i < 200; ++i) {
      const auto r = store.acquire("s", std::to_string(i), seconds(10), seconds(10));
      ASSERT_THAT(r, IsFreshlyAcquired());
      tokens.insert(std::get<Acquired>(r).lease.token);
    }
    EXPECT_EQ(tokens.size(), 200u);
    EXPECT_EQ(store.size(), 200u);
    for (int i = 0; i < 200; ++i) {
      EXPECT_THAT(store.acquire("s", std::to_string(i), seconds(10), seconds(10)), IsBusy());
    }
  }
}

TEST(MemoryStore, TokensAreUniqueAcrossThreadsAndShards) {
  MemoryStore store({.clock = std::make_shared<ManualClock>(), .shards = 8});
  constexpr int kThreads = 8;
  constexpr int kKeys = 500;
  std::vector<std::vector<Token>> tokens(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kKeys; ++i) {
        const auto r =
            store.acquire("t" + std::to_string(t), std::to_string(i), seconds(10), seconds(10));
        if (const auto* a = std::get_if<Acquired>(&r)) tokens[t].push_back(a->lease.token);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<Token> all;
  for (const auto& list : tokens) {
    EXPECT_EQ(list.size(), static_cast<std::size_t>(kKeys));
    all.insert(list.begin(), list.end());
  }
  EXPECT_EQ(all.size(), static_cast<std::size_t>(kThreads * kKeys));
}

TEST(MemoryStore, PurgeRunsSafelyAlongsideWrites) {
  // Writers on their own keys while another thread purges: every completed record whose
  // TTL passed goes, nothing live does, and nothing tears (run under TSan too).
  auto clock = std::make_shared<ManualClock>();
  MemoryStore store({.clock = clock, .shards = 4});
  constexpr int kWriters = 4;
  constexpr int kKeys = 300;
  std::atomic<int> writers_left{kWriters};
  std::atomic<std::size_t> purged{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kWriters; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kKeys; ++i) {
        const std::string key = std::to_string(t) + "/" + std::to_string(i);
        // Odd keys expire at once (a TTL of 1 ms with the clock never moving would not,
        // so they get a TTL that has passed by the final purge).
        const Duration ttl = i % 2 ? Duration{1} : seconds(1000);
        const auto r = store.acquire("s", key, seconds(1000), ttl);
        if (const auto* a = std::get_if<Acquired>(&r)) {
          (void)store.complete("s", key, a->lease.token, "p", ttl);
        }
      }
      --writers_left;
    });
  }
  threads.emplace_back([&] {
    for (int n = 0; n < 10000 && writers_left > 0; ++n) purged += store.purge(8);
  });
  for (auto& th : threads) th.join();
  // The clock never moved, so nothing was purgeable yet.
  EXPECT_EQ(purged.load(), 0u);
  clock->advance(Duration{1});
  EXPECT_EQ(store.purge(kWriters * kKeys), static_cast<std::size_t>(kWriters * kKeys / 2));
  EXPECT_EQ(store.size(), static_cast<std::size_t>(kWriters * kKeys / 2));
}

TEST(MemoryStore, DefaultClockIsTheSystemClock) {
  MemoryStore store;
  const auto before = std::chrono::time_point_cast<Duration>(std::chrono::system_clock::now());
  const auto r = store.acquire("s", "k", seconds(10), seconds(10));
  const auto after = std::chrono::time_point_cast<Duration>(std::chrono::system_clock::now());
  ASSERT_THAT(r, IsAcquired());
  EXPECT_GE(std::get<Acquired>(r).lease.acquired_at, before);
  EXPECT_LE(std::get<Acquired>(r).lease.acquired_at, after);
}

TEST(MemoryStore, DescribesItselfAsMemoryUrl) {
  MemoryStore store;
  EXPECT_EQ(store.describe(), "memory:");
}

// ---- open_store("memory:") ----

TEST(MemoryStoreUrl, OpensAFreshEmptyStoreEachTime) {
  const std::shared_ptr<Store> a = open_store("memory:");
  const std::shared_ptr<Store> b = open_store("memory:");
  ASSERT_NE(dynamic_cast<MemoryStore*>(a.get()), nullptr);
  ASSERT_NE(dynamic_cast<MemoryStore*>(b.get()), nullptr);
  EXPECT_EQ(a->describe(), "memory:");
  EXPECT_EQ(dynamic_cast<MemoryStore&>(*a).size(), 0u);
  EXPECT_THAT(a->acquire("s", "k", seconds(10), seconds(10)), IsFreshlyAcquired());
  // A second "memory:" is a different store.
  EXPECT_THAT(b->acquire("s", "k", seconds(10), seconds(10)), IsFreshlyAcquired());
}

TEST(MemoryStoreUrl, SchemeIsCaseInsensitive) {
  EXPECT_NE(dynamic_cast<MemoryStore*>(open_store("MEMORY:").get()), nullptr);
}

TEST(MemoryStoreUrl, UsesTheClockItIsGiven) {
  auto clock = std::make_shared<ManualClock>();
  const std::shared_ptr<Store> store = open_store("memory:", {.clock = clock});
  const auto r = store->acquire("s", "k", seconds(2), seconds(100));
  ASSERT_THAT(r, IsAcquired());
  EXPECT_EQ(std::get<Acquired>(r).lease.acquired_at, clock->now());
  clock->advance(seconds(3));
  EXPECT_THAT(store->acquire("s", "k", seconds(2), seconds(100)), IsStolen(2));
}

TEST(MemoryStoreUrl, IgnoresReadOnlyAndCreateIfMissing) {
  // OpenOptions documents both as ignored here: the store is new, empty and private.
  const std::shared_ptr<Store> store =
      open_store("memory:", {.read_only = true, .create_if_missing = false});
  EXPECT_EQ(store->describe(), "memory:");
  EXPECT_FALSE(store->get("s", "k").has_value());
  EXPECT_THAT(store->acquire("s", "k", seconds(10), seconds(10)), IsFreshlyAcquired());
}

TEST(MemoryStoreUrl, RejectsAnythingAfterTheScheme) {
  for (const char* url : {"memory://", "memory://host", "memory:/path", "memory:name",
                          "memory:?shards=4", "memory://user:secret@host/x"}) {
    SCOPED_TRACE(url);
    try {
      open_store(url);
      ADD_FAILURE() << "opened";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), "store URL");
      EXPECT_THAT(e.what(), ::testing::HasSubstr("memory:"));
      EXPECT_THAT(e.what(), ::testing::Not(::testing::HasSubstr("secret")));
    }
  }
}

}  // namespace
}  // namespace idem::testing
