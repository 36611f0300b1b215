#pragma once

// The waiters of Executor::begin_async (SPEC §7): duplicates that wait for a busy key
// without blocking their caller. They sleep here, on one thread per executor, which asks
// again for each when its pause ends or when it is woken (a watch on its key said the key
// may have changed), and answers it once it is settled. Nothing here knows about keys or
// stores: a waiter is what to do when it is its turn, and what to do when it must stop.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

namespace idem::detail {

class WaitQueue {
 public:
  using Clock = std::chrono::steady_clock;
  // Its turn: asks again. Returns when to ask next, or nullopt when the waiter is settled
  // (it has answered). Runs on the queue's thread, never under the queue's lock.
  using Ask = std::function<std::optional<Clock::time_point>()>;
  // It must stop before it is settled: cancelled (false) or the queue shuts down (true).
  // Answers without asking. Runs on the queue's thread, or on shutdown's.
  using Stop = std::function<void(bool shutting_down)>;

  class Waiter;
  // What wakes or cancels a waiter; it does not keep the waiter.
  using Ticket = std::weak_ptr<Waiter>;

  WaitQueue() = default;
  ~WaitQueue() { shutdown(); }
  WaitQueue(const WaitQueue&) = delete;
  WaitQueue& operator=(const WaitQueue&) = delete;

  // A waiter, not queued yet: its ticket can be handed out (and used) before it starts.
  static std::shared_ptr<Waiter> make(Ask ask, Stop stop);
  // Queues it, its first turn at `first` (at once if it was cancelled meanwhile); the queue
  // keeps it until it is settled. False after shutdown: nothing queued, nothing called.
  bool start(std::shared_ptr<Waiter> waiter, Clock::time_point first);

  // Its turn comes now (a watch saw its key change). Any thread, also before the waiter
  // starts (its first turn then comes at once); nothing once settled.
  void wake(const Ticket& ticket);
  // It stops: Stop(false) runs on the queue's thread, unless it is settled first. Any
  // thread, also before the waiter starts.
  void cancel(const Ticket& ticket);

  // Every waiter still queued stops (Stop(true)), and the thread ends. Waits for a turn in
  // progress. Idempotent. Must not run on the queue's own thread (from an Ask or a Stop).
  void shutdown() noexcept;

  // Waiters queued and not settled (for tests and metrics).
  std::size_t size() const;

 private:
  struct Due {
    Clock::time_point at;
    Waiter* waiter;
    bool operator<(const Due& o) const {
      return at != o.at ? at < o.at : std::less<Waiter*>{}(waiter, o.waiter);
    }
  };

  void loop();
  // Reschedules under the lock; false if the waiter is no longer queued.
  bool schedule(Waiter& w, Clock::time_point at);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<Due> due_;  // guarded by mu_; every queued waiter is here once
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace idem::detail
