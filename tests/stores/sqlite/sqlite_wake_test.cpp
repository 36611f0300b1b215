// SPEC §7 on SQLite: a duplicate waiting in another process wakes when the owner completes
// or releases, through the signal page beside the database (stores/sqlite/sqlite_wake.h),
// and still answers by polling when no signal comes. The waiting workers poll once an hour:
// only a signal can end their wait before the test's bound.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"
#include "idem/stores/sqlite_store.h"
#include "idem/testing/matchers.h"  // gtest printers for the store results (ODR)
#include "stores/sqlite/sqlite_test_util.h"
#include "support/eventually.h"
#include "support/threads.h"
#include "support/worker_process.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using testing::eventually;
using testing::fresh_db_path;
using testing::Worker;

constexpr const char* kHour = "3600000";

std::string url_of(const std::string& path) { return "sqlite://" + path; }

Token hold(Store& store, const std::string& key) {
  AcquireResult r = store.acquire("mp", key, 10min, 1h);
  EXPECT_TRUE(std::holds_alternative<Acquired>(r));
  return std::holds_alternative<Acquired>(r) ? std::get<Acquired>(r).lease.token : 0;
}

// The store's listener threads, by the name it gives them.
std::size_t listener_threads() { return testing::threads_named("idem-sqlitewake"); }

TEST(SqliteWake, AWaiterInAnotherProcessWakesWhenTheOwnerCompletes) {
  const std::string path = fresh_db_path("wake-complete");
  SqliteStore store(SqliteStoreOptions{.path = path});
  const Token token = hold(store, "job");
  Worker waiter({"wait", url_of(path), "job", kHour});
  ASSERT_EQ(waiter.read_line(), "waiting");
  ASSERT_EQ(store.complete("mp", "job", token, "first", 1h), WriteResult::kDone);
  // Two busy answers, then the replay the signal sent it to.
  EXPECT_EQ(waiter.read_line(), "replay first acquires=3");
  EXPECT_EQ(waiter.wait(), 0);
  EXPECT_TRUE(std::filesystem::exists(path + "-wake"));
}

TEST(SqliteWake, AWaiterInAnotherProcessWakesWhenTheOwnerReleases) {
  const std::string path = fresh_db_path("wake-release");
  SqliteStore store(SqliteStoreOptions{.path = path});
  const Token token = hold(store, "job");
  Worker waiter({"wait", url_of(path), "job", kHour});
  ASSERT_EQ(waiter.read_line(), "waiting");
  ASSERT_EQ(store.release("mp", "job", token), WriteResult::kDone);
  EXPECT_EQ(waiter.read_line(), "ran acquires=3");
  EXPECT_EQ(waiter.wait(), 0);
  EXPECT_EQ(store.get("mp", "job")->payload, "mine");
}

TEST(SqliteWake, WithoutASignalAWaiterStillAnswersByPolling) {
  const std::string path = fresh_db_path("wake-lost");
  // This owner's store never signals: the waiter must find the result by polling.
  SqliteStore store(SqliteStoreOptions{.path = path, .notify = false});
  const Token token = hold(store, "job");
  Worker waiter({"wait", url_of(path), "job", "20"});
  ASSERT_EQ(waiter.read_line(), "waiting");
  ASSERT_EQ(store.complete("mp", "job", token, "first", 1h), WriteResult::kDone);
  EXPECT_THAT(waiter.read_line(), ::testing::StartsWith("replay first acquires="));
  EXPECT_EQ(waiter.wait(), 0);
}

// SPEC §7: once the notification watches the key, polls are only its fallback. A waiter
// that would poll every millisecond polls once an hour instead while the owner holds the
// key, and is woken when it completes: three acquires in all (the first busy answer, the
// one after the watch began, the one after the wake), where polling alone would have
// made hundreds in the time the owner held it.
TEST(SqliteWake, AWatchedWaiterPollsAtItsWatchedPaceNotItsBackoff) {
  const std::string path = fresh_db_path("wake-watched");
  SqliteStore store(SqliteStoreOptions{.path = path});
  const Token token = hold(store, "job");
  Worker waiter({"wait", url_of(path), "job", "1", "2", kHour});
  ASSERT_EQ(waiter.read_line(), "waiting");
  std::this_thread::sleep_for(300ms);  // a millisecond backoff would poll here
  ASSERT_EQ(store.complete("mp", "job", token, "first", 1h), WriteResult::kDone);
  EXPECT_EQ(waiter.read_line(), "replay first acquires=3");
  EXPECT_EQ(waiter.wait(), 0);
}

TEST(SqliteWake, ThousandsOfWatchesShareOneListenerAndEachIsWoken) {
  const std::string path = fresh_db_path("wake-many");
  SqliteStore watched(SqliteStoreOptions{.path = path});
  SqliteStore writer(SqliteStoreOptions{.path = path});
  const Token token = hold(writer, "hot");
  EXPECT_EQ(listener_threads(), 0U);
  std::atomic<int> woken{0};
  std::atomic<int> woken_elsewhere{0};
  std::vector<std::unique_ptr<RecordWatch>> watches;
  for (int i = 0; i < 2000; ++i) {
    watches.push_back(watched.watch("mp", "hot", [&] { ++woken; }));
    ASSERT_NE(watches.back(), nullptr);
  }
  // A record in another slot (the scopes differ, so the hashes do).
  watches.push_back(watched.watch("other-scope", "cold", [&] { ++woken_elsewhere; }));
  EXPECT_EQ(listener_threads(), 1U);

  ASSERT_EQ(writer.complete("mp", "hot", token, "done", 1h), WriteResult::kDone);
  EXPECT_TRUE(eventually([&] { return woken.load() == 2000; })) << woken.load();
  EXPECT_EQ(woken_elsewhere.load(), 0);
  watches.clear();
  // Ended watches are never called again.
  ASSERT_TRUE(writer.forget("mp", "hot"));
  EXPECT_EQ(woken.load(), 2000);
}

TEST(SqliteWake, AReadOnlyOrUnsignallingStoreHasNoWatchAndCreatesNoFile) {
  const std::string path = fresh_db_path("wake-none");
  {
    SqliteStore quiet(SqliteStoreOptions{.path = path, .notify = false});
    EXPECT_EQ(quiet.watch("mp", "k", [] {}), nullptr);
  }
  {
    // The same from a URL; any other value is refused.
    auto quiet = open_store(url_of(path) + "?notify=off");
    EXPECT_EQ(quiet->watch("mp", "k", [] {}), nullptr);
    EXPECT_THROW(open_store(url_of(path) + "?notify=1"), InvalidArgument);
  }
  EXPECT_FALSE(std::filesystem::exists(path + "-wake"));
  SqliteStore reader(SqliteStoreOptions{.path = path, .read_only = true});
  EXPECT_EQ(reader.watch("mp", "k", [] {}), nullptr);
  EXPECT_FALSE(std::filesystem::exists(path + "-wake"));
}

}  // namespace
}  // namespace idem
