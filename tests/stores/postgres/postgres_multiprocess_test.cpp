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

  void wait_for_expiry(std::string_view key) {
    for (int i = 0; i < kWorkerTimeoutMs / 20; ++i) {
      std::optional<Record> r = store()->get("mp", key);
      ASSERT_TRUE(r.has_value());
      if (r->expires_at <= r->now) return;
      std::this_thread::sleep_for(20ms);
    }
    FAIL() << "the record never expired";
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

// --- clock skew: callers under faketime, hours ahead and behind ---

struct Skewed {
  std::vector<std::string> prefix;
  long long offset_ms;
};

const Skewed kAhead{{"faketime", "-f", "+5h"}, 5LL * 3600 * 1000};
const Skewed kBehind{{"faketime", "-f", "-5h"}, -5LL * 3600 * 1000};

long long wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Runs the worker under a shifted clock and returns its answer line, after checking that
// its clock really was shifted.
std::string skewed(const Skewed& skew, const std::vector<std::string>& args) {
  const long long before = wall_ms();
  Worker w(args, skew.prefix);
  std::string line = w.read_line();
  if (args.front() == "acquire") {
    EXPECT_THAT(line, StartsWith("clock "));
    const long long seen = std::stoll(line.substr(6)) - before;
    // Within an hour of the intended shift (the worker starts within seconds).
    EXPECT_LT(std::llabs(seen - skew.offset_ms), 3600LL * 1000) << "faketime did not shift";
    line = w.read_line();
  }
  EXPECT_EQ(w.wait(), 0);
  return line;
}

TEST_F(PostgresMultiProcess, CallersHoursApartAgreeOnExpiryBusyAndSteals) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "faketime preloads a library, which a sanitizer runtime refuses";
#endif
  // The worker's steady clock stays true: only the wall clock is shifted.
  ASSERT_EQ(::setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1", 1), 0);
  constexpr int kLease = 1500;
  std::istringstream first(skewed(kAhead, {"acquire", url(), "k", std::to_string(kLease), "3600000"}));
  std::string what;
  Token ahead_token = 0;
  first >> what >> ahead_token;
  ASSERT_EQ(what, "acquired");

  // Five hours behind, the lease is still live, with at most its length left.
  std::istringstream busy(skewed(kBehind, {"acquire", url(), "k", "60000", "3600000"}));
  long long remaining = -1;
  busy >> what >> remaining;
  EXPECT_EQ(what, "busy");
  EXPECT_GT(remaining, 0);
  EXPECT_LE(remaining, kLease);

  // Once the server says the lease passed, the caller behind steals it.
  wait_for_lease_expiry(*store(), "mp", "k");
  std::istringstream steal(skewed(kBehind, {"acquire", url(), "k", "60000", "3600000"}));
  Token behind_token = 0;
  int attempt = 0;
  int stolen = 0;
  steal >> what >> behind_token >> attempt >> stolen >> remaining;
  ASSERT_EQ(what, "acquired");
  EXPECT_EQ(attempt, 2);
  EXPECT_EQ(stolen, 1);
  EXPECT_GT(behind_token, ahead_token);
  EXPECT_GT(remaining, 0);
  EXPECT_LE(remaining, 60000);

  // The caller ahead is fenced; the thief completes with a short TTL.
  EXPECT_EQ(skewed(kAhead, {"complete", url(), "k", std::to_string(ahead_token), "ahead", "1500"}),
            "fenced");
  EXPECT_EQ(
      skewed(kBehind, {"complete", url(), "k", std::to_string(behind_token), "behind", "1500"}),
      "done");
  // Five hours ahead, the result has not expired: the server says so.
  EXPECT_EQ(skewed(kAhead, {"acquire", url(), "k", "60000", "3600000"}), "replay behind");

  // Once it expired by the server's clock, the caller five hours behind starts afresh.
  wait_for_expiry("k");
  std::istringstream fresh(skewed(kBehind, {"acquire", url(), "k", "60000", "3600000"}));
  fresh >> what >> behind_token >> attempt >> stolen;
  EXPECT_EQ(what, "acquired");
  EXPECT_EQ(attempt, 1);
  EXPECT_EQ(stolen, 0);
  ::unsetenv("FAKETIME_DONT_FAKE_MONOTONIC");
}

}  // namespace
}  // namespace idem::testing
