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
#include <vector>

#include "idem/stores/sqlite_store.h"
#include "stores/sqlite/sqlite_test_util.h"
#include "support/worker_process.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using testing::fresh_db_path;
using ::testing::HasSubstr;
using testing::RawDb;
using ::testing::StartsWith;
using testing::kWorkerTimeoutMs;
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

}  // namespace
}  // namespace idem
