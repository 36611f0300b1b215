// SPEC §14 under crashes: worker processes (txn_crash_worker.cpp) run the same keys, each run
// writing one row of the application's own into `effects`, while this test SIGKILLs a random
// worker every few dozen milliseconds (before the effect, between the effect and the
// completion, after the COMMIT: wherever it happens to be) and starts a new one. Then every
// key must have exactly one effect and a COMPLETE record naming that effect's lease.
//
// The same run with the usual two commits (the effect's, then the record's) shows the
// duplicate that transactional completion closes, so the check can fail: a worker killed
// between its two commits leaves the effect committed and the key IN_PROGRESS, and the next
// worker runs the key again once the lease has run out.
//
// Figures go to the log (ctest --verbose) for docs/RELIABILITY.md. IDEM_TXN_CRASH_SECONDS
// sets the killing time per run (default 8).

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "idem/open_store.h"
#include "idem/store.h"
#include "stores/transaction/caller_conn.h"

#ifdef IDEM_TEST_WITH_POSTGRES
#include "stores/postgres/postgres_test_util.h"
#endif

extern char** environ;

namespace idem {
namespace {

using namespace std::chrono_literals;

constexpr int kWorkers = 4;
constexpr int kKeys = 500;
constexpr int kPauseUs = 3000;

pid_t spawn(const std::vector<std::string>& args) {
  std::vector<std::string> full = args;
  full.insert(full.begin(), IDEM_TXN_CRASH_WORKER);
  std::vector<char*> argv;
  for (std::string& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    ADD_FAILURE() << "cannot start " << argv[0];
    return -1;
  }
  return pid;
}

std::chrono::seconds kill_time() {
  const char* s = std::getenv("IDEM_TXN_CRASH_SECONDS");
  return std::chrono::seconds(s != nullptr ? std::atoi(s) : 8);
}

struct Outcome {
  int kills = 0;
  int keys_with_duplicates = 0;
  int extra_effects = 0;
  int keys_without_effect = 0;
  int records_not_matching = 0;
};

// Runs the workers of one mode to the end, killing them at random for kill_time(), and
// checks every key.
Outcome run(const std::string& mode, const std::string& caller, const std::string& store_url,
            const std::string& effects) {
  auto setup = testing::connect_caller(caller);
  setup->exec("CREATE TABLE " + effects + " (k text NOT NULL, v text NOT NULL)");
  std::mt19937 rng(12345);
  int seed = 0;
  auto start = [&] {
    return spawn({mode, caller, store_url, effects, std::to_string(kKeys), std::to_string(kPauseUs),
                  std::to_string(++seed)});
  };
  std::vector<pid_t> workers;
  for (int i = 0; i < kWorkers; ++i) workers.push_back(start());
  Outcome out;
  const auto stop_killing = std::chrono::steady_clock::now() + kill_time();
  std::uniform_int_distribution<int> gap(5, 60);
  std::uniform_int_distribution<int> which(0, kWorkers - 1);
  while (std::chrono::steady_clock::now() < stop_killing) {
    std::this_thread::sleep_for(std::chrono::milliseconds(gap(rng)));
    pid_t& victim = workers[static_cast<std::size_t>(which(rng))];
    // Only ever a worker of ours that is still running: never kill(-1), never a pid that
    // was reaped (and may have been reused).
    if (victim <= 0) continue;
    int status = 0;
    if (::waitpid(victim, &status, WNOHANG) == victim) {
      // It finished every key: nothing left to kill there; the others will finish too.
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a worker failed";
      victim = -1;
      bool all_done = true;
      for (pid_t p : workers) all_done = all_done && p <= 0;
      if (all_done) break;
      continue;
    }
    ::kill(victim, SIGKILL);
    ::waitpid(victim, &status, 0);
    ++out.kills;
    victim = start();
  }
  // The survivors finish every key (taking over the leases of the killed), within a bound
  // that only a hung worker reaches.
  const auto give_up = std::chrono::steady_clock::now() + 120s;
  for (pid_t& p : workers) {
    if (p <= 0) continue;
    int status = 0;
    while (::waitpid(p, &status, WNOHANG) != p) {
      if (std::chrono::steady_clock::now() > give_up) {
        ADD_FAILURE() << "worker " << p << " did not finish its keys";
        ::kill(p, SIGKILL);
        ::waitpid(p, &status, 0);
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a worker failed";
    p = -1;
  }
  auto store = open_store(store_url);
  for (int k = 0; k < kKeys; ++k) {
    const std::string key = "k" + std::to_string(k);
    const long long n =
        setup->count("SELECT count(*) FROM " + effects + " WHERE k = '" + key + "'");
    if (n == 0) ++out.keys_without_effect;
    if (n > 1) {
      ++out.keys_with_duplicates;
      out.extra_effects += static_cast<int>(n - 1);
    }
    const auto record = store->get("crash", key);
    const bool matches = record && record->state == RecordState::kComplete &&
                         setup->count("SELECT count(*) FROM " + effects + " WHERE k = '" + key +
                                      "' AND v = '" + record->payload + "'") == 1;
    if (!matches) ++out.records_not_matching;
  }
  std::printf(
      "txn crash, %s, %s: %d keys, %d workers, %d kills in %lld s: %d keys with a duplicate "
      "effect (%d extra), %d without, %d records not matching their effect\n",
      caller.rfind("sqlite:", 0) == 0 ? "SQLite" : "PostgreSQL", mode.c_str(), kKeys, kWorkers,
      out.kills, static_cast<long long>(kill_time().count()), out.keys_with_duplicates,
      out.extra_effects, out.keys_without_effect, out.records_not_matching);
  std::fflush(stdout);
  return out;
}

TEST(TxnCrash, Sqlite) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("idem_txn_crash_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "app.db").string();
  {
    const Outcome tx = run("tx", "sqlite:" + path, "sqlite://" + path + "?shared=1", "effects_tx");
    EXPECT_GT(tx.kills, 0);
    EXPECT_EQ(tx.keys_with_duplicates, 0);
    EXPECT_EQ(tx.keys_without_effect, 0);
    EXPECT_EQ(tx.records_not_matching, 0);
  }
  {
    // A file of its own, so the keys start absent.
    const std::string two = (dir / "two.db").string();
    const Outcome out = run("two", "sqlite:" + two, "sqlite://" + two + "?shared=1", "effects_two");
    EXPECT_GT(out.keys_with_duplicates, 0)
        << "no duplicate in the two-commit flow: the kills missed the window the test exists for";
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

#ifdef IDEM_TEST_WITH_POSTGRES
TEST(TxnCrash, Postgres) {
  const std::string url = testing::postgres_url();
  const std::string tx_table = testing::fresh_table("crash_tx");
  const std::string two_table = testing::fresh_table("crash_two");
  const std::string sep = url.find('?') == std::string::npos ? "?" : "&";
  {
    const Outcome tx = run("tx", url, url + sep + "table=" + tx_table, tx_table + "_effects");
    EXPECT_GT(tx.kills, 0);
    EXPECT_EQ(tx.keys_with_duplicates, 0);
    EXPECT_EQ(tx.keys_without_effect, 0);
    EXPECT_EQ(tx.records_not_matching, 0);
  }
  {
    const Outcome out = run("two", url, url + sep + "table=" + two_table, two_table + "_effects");
    EXPECT_GT(out.keys_with_duplicates, 0)
        << "no duplicate in the two-commit flow: the kills missed the window the test exists for";
  }
  testing::PgConn(url).exec("DROP TABLE IF EXISTS " + tx_table + ", " + tx_table + "_effects, " +
                            two_table + ", " + two_table + "_effects");
}
#endif

}  // namespace
}  // namespace idem
