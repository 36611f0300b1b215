#pragma once

// A background thread that purges expired records on an interval (SPEC §8), in bounded
// batches so it never blocks acquisitions for long.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>

#include "idem/store.h"

namespace idem {

struct PurgerOptions {
  // Pause between purge passes; the wait ends early on trigger() or destruction.
  Duration interval = std::chrono::seconds(60);
  // Records deleted per store call.
  std::size_t batch = 1000;
  // Store calls per pass at most; a pass ends early when a batch comes back short.
  std::size_t max_batches_per_pass = 100;
  // Called with each store error (the purger keeps going). Must not throw. Null: ignored.
  std::function<void(const std::exception&)> on_error{};
};

class Purger {
 public:
  // Starts the thread; the first pass runs at once. Throws InvalidArgument for a null store,
  // an interval that is not positive, or a batch or max_batches_per_pass of 0.
  explicit Purger(std::shared_ptr<Store> store, PurgerOptions options = {});
  // Stops the thread, waiting for a store call in progress to return.
  ~Purger();
  Purger(const Purger&) = delete;
  Purger& operator=(const Purger&) = delete;

  // One pass now, on the caller's thread: purges in batches until a batch comes back
  // short or max_batches_per_pass is reached. Returns how many records were deleted.
  // Throws StoreUnavailable from the store (unlike the thread, which reports to on_error).
  std::size_t run_once();

  // Records deleted by the background thread so far.
  std::size_t purged() const;
  // Wakes the thread for a pass now instead of at the end of the interval.
  void trigger();

 private:
  void loop(std::stop_token stop);

  std::shared_ptr<Store> store_;
  PurgerOptions options_;
  mutable std::mutex mu_;
  std::condition_variable_any cv_;
  bool triggered_ = false;
  std::size_t purged_ = 0;
  std::jthread thread_;
};

}  // namespace idem
