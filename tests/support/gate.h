#pragma once

// A one-shot signal between threads: one thread opens it, others wait (boundedly) for it.

#include <condition_variable>
#include <mutex>

#include "support/eventually.h"

namespace idem::testing {

class Gate {
 public:
  void open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // Returns whether the gate opened within kEventually.
  bool wait() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, kEventually, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace idem::testing
