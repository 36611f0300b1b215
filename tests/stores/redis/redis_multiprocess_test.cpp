// Several processes on the shared Redis server, through idem::Executor (the checks shared
// with the other stores in support/worker_process.h): racing workers complete each key
// once, a killed owner's lease is stolen, a paused owner is fenced, and callers whose clocks
// are hours apart (faketime) agree, because only the server's clock judges them.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>

#include "idem/stores/redis_store.h"
#include "stores/redis/redis_test_util.h"
#include "support/worker_process.h"

namespace idem::testing {
namespace {

using ::testing::StartsWith;

// A fresh key prefix on the shared server, the URL that opens it, and a store of the test's
// own on it for checking what the workers did.
class RedisMultiProcess : public SharedRedisTest {
 protected:
  void SetUp() override {
    SharedRedisTest::SetUp();
    if (IsSkipped() || HasFailure()) return;
    RedisStoreOptions o = shared_options();
    url_ = with_param(url_, "prefix", o.prefix);
    store_ = std::make_shared<RedisStore>(o);
  }
  std::shared_ptr<RedisStore> store_;
};

TEST_F(RedisMultiProcess, WorkersRacingOverKeysCompleteEachKeyOnce) {
  char dir_pattern[] = "/tmp/idem-redis-race-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_pattern), nullptr);
  const std::string dir = dir_pattern;
  const std::map<std::string, std::string> ran =
      run_race(url_, /*workers=*/4, /*keys=*/40, dir + "/worker");
  ::rmdir(dir.c_str());
  for (const auto& [key, payload] : ran) {
    std::optional<Record> rec = store_->get("mp", key);
    ASSERT_TRUE(rec.has_value());
    EXPECT_EQ(rec->state, RecordState::kComplete);
    EXPECT_EQ(rec->payload, payload);
  }
}

TEST_F(RedisMultiProcess, KilledOwnersLeaseIsStolenByAnotherProcess) {
  Worker owner({"hold", url_, "job", "400"});
  const std::string acquired = owner.read_line();
  ASSERT_THAT(acquired, StartsWith("acquired "));
  const Token first = std::stoull(acquired.substr(9));
  owner.signal(SIGKILL);
  owner.wait();

  // The owner died holding the lease; the next process waits for it to expire and steals.
  Worker thief({"run", url_, "job", "new-owner", "5000", "30000"});
  EXPECT_THAT(thief.read_line(), StartsWith("ran stolen=1 attempt=2 token="));
  EXPECT_EQ(thief.wait(), 0);

  std::optional<Record> rec = store_->get("mp", "job");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, RecordState::kComplete);
  EXPECT_EQ(rec->payload, "new-owner");
  EXPECT_GT(rec->token, first);
}

TEST_F(RedisMultiProcess, PausedOwnerIsFencedAfterItsLeaseWasStolen) {
  Worker owner({"hold", url_, "job", "400"});
  const std::string acquired = owner.read_line();
  ASSERT_THAT(acquired, StartsWith("acquired "));
  const Token first = std::stoull(acquired.substr(9));

  // Paused, its heartbeat stops too, so the lease runs out by the server's clock. (Redis
  // holds nothing for a client between calls, so it can be stopped at any instruction.)
  owner.stop();
  wait_for_lease_expiry(*store_, "mp", "job");
  steal_from_paused_owner(owner, url_, *store_, first);
}

TEST_F(RedisMultiProcess, CallersHoursApartAgreeOnExpiryBusyAndSteals) {
  IDEM_SKIP_OR_FAIL_UNLESS(have_program("faketime"),
                           "faketime is not installed (scripts/deps.sh installs it)");
  check_callers_hours_apart_agree(url_, *store_);
}

}  // namespace
}  // namespace idem::testing
