#pragma once

// Multi-process checks shared by every store that processes share (SQLite, Redis): worker
// processes (store_worker.cpp) run keys through idem::Executor on a store URL, and the
// test checks what they did together. Each store's test calls these with its own URL and
// adds its own checks (SQLite's integrity check, Redis's key layout).

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/store.h"

namespace idem::testing {

// Every wait on a worker is bounded by this, so a broken worker fails the test instead of
// hanging it. It is a bound, not an expectation about speed.
inline constexpr int kWorkerTimeoutMs = 60'000;

// A store_worker process with its standard input and output connected to pipes. Killed (if
// still running) and reaped by the destructor. `wrapper` runs the worker under another
// program, e.g. {"faketime", "-f", "+2d"}.
class Worker {
 public:
  explicit Worker(const std::vector<std::string>& args,
                  const std::vector<std::string>& wrapper = {});
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // The next line the worker printed, without its newline; empty after the bound or EOF.
  std::string read_line();
  void write_line(const std::string& line);
  void signal(int sig);
  // Stops the worker with SIGSTOP and returns once it is stopped.
  void stop();
  // Waits for the worker to exit (bounded) and returns its exit status, or -1.
  int wait();

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  std::string buffer_;
};

// The scope every worker uses.
inline constexpr std::string_view kWorkerScope = "mp";

// `workers` processes race over `keys` overlapping keys on the store at `url`; writes
// their reports next to `out_stem`. Each key runs exactly once and every other worker
// replays that run's result; `open` opens the store (after the workers finished) to check
// the records.
void check_workers_race(const std::string& url, const std::string& out_stem,
                        const std::function<std::shared_ptr<Store>()>& open, int workers = 4,
                        int keys = 40);

// A worker holding a lease of 300 ms is SIGKILLed; another process waits for the lease to
// expire and steals it (attempt 2, a larger token) and completes the record.
void check_killed_owner_is_stolen(const std::string& url, Store& store);

// A worker holding a lease of 300 ms is stopped (`stop`: SIGSTOP, at a moment the store
// allows), its lease expires and another process steals it and completes; continued, the
// old owner's complete is fenced and the thief's result stays.
void check_paused_owner_is_fenced(const std::string& url, Store& store,
                                  const std::function<void(Worker&)>& stop);

// Waits until the store reports the lease on (kWorkerScope, key) as expired by its own
// clock.
void wait_for_lease_expiry(Store& store, std::string_view key);

}  // namespace idem::testing
