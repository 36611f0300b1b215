// Several processes on one PostgreSQL table, through idem::Executor: racing workers complete
// each key once, a killed owner's lease is stolen, a paused owner is fenced, and callers
// whose clocks are hours apart (faketime) see the same expiry, busy answers and steals,
// because only the server's clock judges them. The worker is tests/support/store_worker.cpp.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "idem/open_store.h"
#include "stores/postgres/postgres_test_util.h"
#include "support/worker_process.h"

namespace idem::testing {
namespace {

using ::testing::StartsWith;

// A fresh table and the URL that opens it; the table is dropped at the end of the test.
class PostgresMultiProcess : public ::testing::Test {
 protected:
  void TearDown() override { drop_table(postgres_url(), table_); }

  std::string url() const {
    const std::string base = postgres_url();
    return base + (base.find('?') == std::string::npos ? "?" : "&") + "table=" + table_;
  }

  // A store of the test's own on the same table, for checking what the workers did.
  std::shared_ptr<Store> store() {
    if (!store_) store_ = open_store(url());
    return store_;
  }

  std::string table_ = fresh_table("mp");
  std::shared_ptr<Store> store_;
};

TEST_F(PostgresMultiProcess, WorkersRacingOverKeysCompleteEachKeyOnce) {
  char dir_pattern[] = "/tmp/idem-pg-race-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_pattern), nullptr);
  const std::string dir = dir_pattern;
  const std::map<std::string, std::string> ran =
      run_race(url(), /*workers=*/4, /*keys=*/40, dir + "/worker");
  ::rmdir(dir.c_str());
  for (const auto& [key, payload] : ran) {
    std::optional<Record> rec = store()->get("mp", key);
    ASSERT_TRUE(rec.has_value());
    EXPECT_EQ(rec->state, RecordState::kComplete);
    EXPECT_EQ(rec->payload, payload);
  }
}

TEST_F(PostgresMultiProcess, KilledOwnersLeaseIsStolenByAnotherProcess) {
  Worker owner({"hold", url(), "job", "400"});
  const std::string acquired = owner.read_line();
  ASSERT_THAT(acquired, StartsWith("acquired "));
  const Token first = std::stoull(acquired.substr(9));
  owner.signal(SIGKILL);
  owner.wait();

  // The owner died holding the lease; the next process waits for it to expire and steals.
  Worker thief({"run", url(), "job", "new-owner", "5000", "30000"});
  EXPECT_THAT(thief.read_line(), StartsWith("ran stolen=1 attempt=2 token="));
  EXPECT_EQ(thief.wait(), 0);

  std::optional<Record> rec = store()->get("mp", "job");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, RecordState::kComplete);
  EXPECT_EQ(rec->payload, "new-owner");
  EXPECT_GT(rec->token, first);
}

TEST_F(PostgresMultiProcess, PausedOwnerIsFencedAfterItsLeaseWasStolen) {
  Worker owner({"hold", url(), "job", "400"});
  const std::string acquired = owner.read_line();
  ASSERT_THAT(acquired, StartsWith("acquired "));
  const Token first = std::stoull(acquired.substr(9));

  // Paused, its heartbeat stops too, so the lease runs out by the server's clock. (A paused
  // client holds no lock: each of its statements commits on its own.)
  owner.stop();
  wait_for_lease_expiry(*store(), "mp", "job");

  steal_from_paused_owner(owner, url(), *store(), first);
}

TEST_F(PostgresMultiProcess, CallersHoursApartAgreeOnExpiryBusyAndSteals) {
  check_callers_hours_apart_agree(url(), *store());
}

}  // namespace
}  // namespace idem::testing
