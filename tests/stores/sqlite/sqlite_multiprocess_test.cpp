// Several processes on one SQLite file, through idem::Executor: racing workers complete each
// key once, a killed owner's lease is stolen, a paused owner is fenced (the shared checks of
// support/multiprocess_checks.h), each followed by SQLite's integrity check.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "idem/stores/sqlite_store.h"
#include "stores/sqlite/sqlite_test_util.h"
#include "support/multiprocess_checks.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using testing::fresh_db_path;
using testing::RawDb;
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
  // The workers also race to create the file and its schema.
  testing::check_workers_race(url_of(path), path, [&] {
    return std::make_shared<SqliteStore>(SqliteStoreOptions{.path = path});
  });
  expect_integrity_ok(path);
}

TEST(SqliteMultiProcess, KilledOwnersLeaseIsStolenByAnotherProcess) {
  const std::string path = fresh_db_path("killed");
  auto store = std::make_shared<SqliteStore>(SqliteStoreOptions{.path = path});
  testing::check_killed_owner_is_stolen(url_of(path), *store);
  expect_integrity_ok(path);
}

TEST(SqliteMultiProcess, PausedOwnerIsFencedAfterItsLeaseWasStolen) {
  const std::string path = fresh_db_path("paused");
  auto store = std::make_shared<SqliteStore>(SqliteStoreOptions{.path = path});
  testing::check_paused_owner_is_fenced(url_of(path), *store,
                                        [&](Worker& owner) { stop_outside_write(owner, path); });
  expect_integrity_ok(path);
}

}  // namespace
}  // namespace idem
