// Several processes on one SQLite file, through idem::Executor: racing workers complete each
// key once, a killed owner's lease is stolen, a paused owner is fenced. The worker is
// tests/support/store_worker.cpp, driven through support/worker_process.h.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
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
#include "support/worker_process.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using testing::fresh_db_path;
using ::testing::HasSubstr;
using testing::kWorkerTimeoutMs;
using testing::RawDb;
using ::testing::StartsWith;
using testing::Worker;

std::string url_of(const std::string& path) { return "sqlite://" + path; }

void expect_integrity_ok(const std::string& path) {
  RawDb raw(path);
  EXPECT_EQ(raw.query_text("PRAGMA integrity_check"), "ok");
}

// Whether nobody holds the file's write lock right now.
bool write_lock_free(const std::string& path) {
  RawDb raw(path);
  if (raw.exec("BEGIN IMMEDIATE", /*expect_ok=*/false) != SQLITE_OK) return false;
  raw.exec("ROLLBACK");
  return true;
}

// Stops `worker` at a moment when it does not hold the write lock: its heartbeat may be in
// the middle of an extend, and a writer frozen inside its transaction would block every
// other process until the busy timeout.
void stop_outside_write(Worker& worker, const std::string& path) {
  for (int i = 0; i < 100; ++i) {
    worker.stop();
    if (write_lock_free(path)) return;
    worker.signal(SIGCONT);
    std::this_thread::sleep_for(5ms);
  }
  FAIL() << "the worker always held the write lock";
}

TEST(SqliteMultiProcess, WorkersRacingOverKeysCompleteEachKeyOnce) {
  const std::string path = fresh_db_path("race");
  const std::map<std::string, std::string> ran =
      testing::run_race(url_of(path), /*workers=*/4, /*keys=*/40, path + ".worker");
  auto store = std::make_shared<SqliteStore>(SqliteStoreOptions{.path = path});
  for (const auto& [key, payload] : ran) {
    std::optional<Record> rec = store->get("mp", key);
    ASSERT_TRUE(rec.has_value());
    EXPECT_EQ(rec->state, RecordState::kComplete);
    EXPECT_EQ(rec->payload, payload);
  }
  expect_integrity_ok(path);
}

TEST(SqliteMultiProcess, KilledOwnersLeaseIsStolenByAnotherProcess) {
  const std::string path = fresh_db_path("killed");
  auto store = std::make_shared<SqliteStore>(SqliteStoreOptions{.path = path});

  Worker owner({"hold", url_of(path), "job", "300"});
  const std::string acquired = owner.read_line();
  ASSERT_THAT(acquired, StartsWith("acquired "));
  const Token first = std::stoull(acquired.substr(9));
  owner.signal(SIGKILL);
  owner.wait();

  // The owner died holding the lease; the next process waits for it to expire and steals.
  Worker thief({"run", url_of(path), "job", "new-owner", "5000", "30000"});
  const std::string line = thief.read_line();
  EXPECT_THAT(line, StartsWith("ran stolen=1 attempt=2 token="));
  EXPECT_EQ(thief.wait(), 0);

  std::optional<Record> rec = store->get("mp", "job");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, RecordState::kComplete);
  EXPECT_EQ(rec->payload, "new-owner");
  EXPECT_GT(rec->token, first);
  expect_integrity_ok(path);
}

TEST(SqliteMultiProcess, PausedOwnerIsFencedAfterItsLeaseWasStolen) {
  const std::string path = fresh_db_path("paused");
  auto store = std::make_shared<SqliteStore>(SqliteStoreOptions{.path = path});

  Worker owner({"hold", url_of(path), "job", "300"});
  const std::string acquired = owner.read_line();
  ASSERT_THAT(acquired, StartsWith("acquired "));
  const Token first = std::stoull(acquired.substr(9));

  // Paused, its heartbeat stops too, so the lease runs out.
  stop_outside_write(owner, path);
  testing::wait_for_lease_expiry(*store, "mp", "job");

  testing::steal_from_paused_owner(owner, url_of(path), *store, first);
  expect_integrity_ok(path);
}

// SQLite's write lock is not fair, least of all with synchronous=full: a process that
// commits back to back used to starve another one's writes past the busy timeout. With
// every write of a process queued in memory and one transaction per batch, and a busy
// handler that tries again within a millisecond, another process gets its turn.
TEST(SqliteMultiProcess, AProcessWritesWhileAnotherHammersTheFile) {
  const std::string path = fresh_db_path("hammer");
  const std::string url = url_of(path) + "?synchronous=full";
  auto store = open_store(url);  // creates the file before the hammer starts
  Worker hammer({"hammer", url, "16"});
  ASSERT_EQ(hammer.read_line(), "running");

  // Write until this process has done its share and the hammer has visibly gone on writing
  // meanwhile, so the two really overlapped. Each write here waits at most the default busy
  // timeout (5 s) for the lock; one that waited longer throws and fails the test.
  RawDb raw(path);
  auto hammered = [&] {
    return raw.query_int("SELECT count(*) FROM idem_records WHERE scope = CAST('mp' AS BLOB)");
  };
  const std::int64_t hammered_before = hammered();
  constexpr int kMine = 100;
  int mine = 0;
  std::vector<std::string> errors;
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kWorkerTimeoutMs);
  while ((mine < kMine || hammered() < hammered_before + kMine) &&
         std::chrono::steady_clock::now() < give_up) {
    const std::string key = "mine-" + std::to_string(mine++);
    try {
      AcquireResult r = store->acquire("mine", key, 30s, 1h);
      ASSERT_TRUE(std::holds_alternative<Acquired>(r));
      EXPECT_EQ(store->complete("mine", key, std::get<Acquired>(r).lease.token, "mine", 1h),
                WriteResult::kDone);
    } catch (const StoreUnavailable& e) {
      errors.push_back(e.what());
    }
  }
  EXPECT_THAT(errors, ::testing::IsEmpty());
  EXPECT_GE(mine, kMine);
  EXPECT_GE(hammered(), hammered_before + kMine) << "the hammer stalled";

  hammer.write_line("stop");
  const std::string done = hammer.read_line();
  EXPECT_THAT(done, StartsWith("done "));
  EXPECT_THAT(done, ::testing::EndsWith(" 0")) << hammer.read_line();
  EXPECT_EQ(hammer.wait(), 0);
  expect_integrity_ok(path);
}

}  // namespace
}  // namespace idem
