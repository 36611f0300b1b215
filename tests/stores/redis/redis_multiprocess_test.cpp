// Several processes on the shared Redis server, through idem::Executor (the checks shared
// with SQLite in support/multiprocess_checks.h), and callers whose clocks are days off
// (faketime): expiry is judged by the server's clock alone.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>

#include "idem/stores/redis_store.h"
#include "stores/redis/redis_test_util.h"
#include "support/multiprocess_checks.h"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::AllOf;
using ::testing::StartsWith;

// Runs a worker with its clock moved by `offset` ("+2d", "-2d"). libfaketime is preloaded
// ahead of AddressSanitizer's runtime, which ASan refuses unless told not to check.
std::vector<std::string> skewed(const char* offset) {
#if defined(__SANITIZE_ADDRESS__)
  return {"env", "ASAN_OPTIONS=verify_asan_link_order=0", "faketime", "-f", offset};
#else
  return {"faketime", "-f", offset};
#endif
}

class RedisMultiProcess : public SharedRedisTest {
 protected:
  void SetUp() override {
    SharedRedisTest::SetUp();
    if (IsSkipped() || HasFailure()) return;
    prefix_ = fresh_prefix("mp");
    worker_url_ = with_param(url_, "prefix", prefix_);
  }
  std::shared_ptr<RedisStore> open() {
    RedisStoreOptions o = shared_options();
    o.prefix = prefix_;
    return std::make_shared<RedisStore>(o);
  }
  std::string prefix_;
  std::string worker_url_;
};

TEST_F(RedisMultiProcess, WorkersRacingOverKeysCompleteEachKeyOnce) {
  const std::string stem = ::testing::TempDir() + "/idem-redis-race-" + std::to_string(::getpid());
  check_workers_race(worker_url_, stem, [&] { return open(); });
}

TEST_F(RedisMultiProcess, KilledOwnersLeaseIsStolenByAnotherProcess) {
  auto store = open();
  check_killed_owner_is_stolen(worker_url_, *store);
}

TEST_F(RedisMultiProcess, PausedOwnerIsFencedAfterItsLeaseWasStolen) {
  auto store = open();
  // Redis holds no lock for a client, so the owner can be stopped at any instruction.
  check_paused_owner_is_fenced(worker_url_, *store, [](Worker& owner) { owner.stop(); });
}

TEST_F(RedisMultiProcess, CallersWithSkewedClocksAgreeWithTheServer) {
  if (!have_program("faketime")) {
    if (servers_required()) FAIL() << "faketime is not installed (scripts/deps.sh installs it)";
    GTEST_SKIP() << "faketime is not installed";
  }
  auto store = open();
  // The owner's clock is two days behind, a duplicate's two days ahead: more than the
  // 24-hour TTL either way. By its own clock the duplicate would find the lease long gone
  // and, later, the result expired; by the server's it finds neither.
  Worker owner({"hold", worker_url_, "job", "3000"}, skewed("-2d"));
  const std::string acquired = owner.read_line();
  ASSERT_THAT(acquired, StartsWith("acquired "));

  Worker busy({"run", worker_url_, "job", "thief", "3000", "0"}, skewed("+2d"));
  EXPECT_THAT(busy.read_line(), AllOf(StartsWith("error "), HasSubstr("lease")));
  EXPECT_EQ(busy.wait(), 0);

  owner.write_line("go");
  EXPECT_EQ(owner.read_line(), "completed");
  EXPECT_EQ(owner.wait(), 0);

  Worker late({"run", worker_url_, "job", "thief", "3000", "0"}, skewed("+2d"));
  EXPECT_EQ(late.read_line(), "replay old-owner");
  EXPECT_EQ(late.wait(), 0);

  // The record's times are the server's, not the skewed callers'.
  const Record rec = store->get(kWorkerScope, "job").value();
  EXPECT_LE(rec.now - rec.completed_at, 1min);
  EXPECT_GE(rec.expires_at - rec.now, 23h);
}

}  // namespace
}  // namespace idem::testing
