// One worker of the transactional crash test (txn_crash_test.cpp). It runs every key of
// the test once through the executor, each run writing one row into the application's own
// `effects` table, until every key is recorded; the test kills workers with SIGKILL at
// random moments and starts new ones.
//
//   txn_crash_worker MODE CALLER STORE EFFECTS KEYS PAUSE_US SEED
//
// MODE tx:  Executor::run_in_transaction: the effect and the COMPLETE record commit together.
// MODE two: the usual two commits: run()'s action writes the effect (its own commit), then
//           the executor records the result (a second commit).
// CALLER is the application's database ("sqlite:/path" or a PostgreSQL URL), STORE the idem
// store's URL on the same database. After the effect, the action works on for PAUSE_US
// microseconds (the rest of a real action), the same in both modes.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.h"
#include "idem/executor.h"
#include "idem/open_store.h"
#include "stores/transaction/caller_conn.h"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s tx|two CALLER STORE EFFECTS KEYS PAUSE_US SEED\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const std::string effects = argv[4];
  const int keys = std::atoi(argv[5]);
  const auto pause = std::chrono::microseconds(std::atoi(argv[6]));
  std::mt19937 rng(static_cast<unsigned>(std::atoi(argv[7])));
  try {
    auto caller = idem::testing::connect_caller(argv[2]);
    idem::ExecutorOptions options;
    // Short leases, so that the keys of a killed worker are taken over quickly.
    options.lease = std::chrono::milliseconds(400);
    idem::Executor exec(idem::open_store(argv[3]), options);
    std::vector<int> pending(static_cast<std::size_t>(keys));
    for (int i = 0; i < keys; ++i) pending[static_cast<std::size_t>(i)] = i;
    std::shuffle(pending.begin(), pending.end(), rng);
    while (!pending.empty()) {
      std::vector<int> left;
      for (const int k : pending) {
        const std::string key = "k" + std::to_string(k);
        auto action = [&](const idem::Attempt& a) {
          caller->exec("INSERT INTO " + effects + " (k, v) VALUES ('" + key + "', '" +
                       std::to_string(a.token()) + "')");
          std::this_thread::sleep_for(pause);
          return std::to_string(a.token());
        };
        try {
          if (mode == "tx") {
            (void)exec.run_in_transaction(caller->conn(), "crash", key, action);
          } else {
            (void)exec.run("crash", key, action);
          }
        } catch (const idem::InProgress&) {
          left.push_back(k);
        } catch (const std::exception& e) {
          // A store outage, a lost lease, a busy database: the key is tried again later.
          std::fprintf(stderr, "worker %d: %s: %s\n", static_cast<int>(::getpid()), key.c_str(),
                       e.what());
          left.push_back(k);
        }
      }
      if (left.size() == pending.size()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      pending = std::move(left);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker %d: %s\n", static_cast<int>(::getpid()), e.what());
    return 1;
  }
  return 0;
}
