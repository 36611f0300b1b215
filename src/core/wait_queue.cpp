#include "core/wait_queue.h"

#include <vector>

namespace idem::detail {

class WaitQueue::Waiter {
 public:
  Waiter(Ask ask, Stop stop) : ask_(std::move(ask)), stop_(std::move(stop)) {}

 private:
  friend class WaitQueue;
  Ask ask_;
  Stop stop_;
  // All guarded by the queue's mu_.
  Clock::time_point at_{};  // its entry in due_, when queued and not in its turn
  bool queued_ = false;     // started
  bool in_turn_ = false;
  bool woken_ = false;            // woken in its turn or before its start: next turn at once
  bool cancelled_ = false;        // its next turn stops it
  bool settled_ = false;          // answered (or stopped): never queued again
  std::shared_ptr<Waiter> self_;  // the queue's reference until it is settled
};

std::shared_ptr<WaitQueue::Waiter> WaitQueue::make(Ask ask, Stop stop) {
  return std::make_shared<Waiter>(std::move(ask), std::move(stop));
}

bool WaitQueue::start(std::shared_ptr<Waiter> waiter, Clock::time_point first) {
  Waiter& w = *waiter;
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return false;
    w.queued_ = true;
    // Woken or cancelled before it started: its first turn comes at once.
    w.at_ = w.cancelled_ || w.woken_ ? Clock::now() : first;
    w.woken_ = false;
    w.self_ = std::move(waiter);
    due_.insert(Due{w.at_, &w});
    wake = due_.begin()->waiter == &w;
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  if (wake) cv_.notify_one();
  return true;
}

bool WaitQueue::schedule(Waiter& w, Clock::time_point at) {
  if (w.settled_) return false;
  if (!w.queued_ || w.in_turn_) {
    w.woken_ = true;
    return false;
  }
  due_.erase(Due{w.at_, &w});
  w.at_ = at;
  due_.insert(Due{at, &w});
  return true;
}

// wake and cancel may hold the last reference to a waiter that has just settled: it then
// goes on their caller's thread, outside the lock (a settled waiter's Ask has let go of
// whatever it must not destroy from there: the watch or stop callback calling in).
void WaitQueue::wake(const Ticket& ticket) {
  bool moved = false;
  const std::shared_ptr<Waiter> w = ticket.lock();
  if (w == nullptr) return;
  {
    std::lock_guard lock(mu_);
    moved = schedule(*w, Clock::now());
  }
  if (moved) cv_.notify_one();
}

void WaitQueue::cancel(const Ticket& ticket) {
  bool moved = false;
  const std::shared_ptr<Waiter> w = ticket.lock();
  if (w == nullptr) return;
  {
    std::lock_guard lock(mu_);
    if (w->settled_) return;
    w->cancelled_ = true;
    moved = schedule(*w, Clock::now());
  }
  if (moved) cv_.notify_one();
}

std::size_t WaitQueue::size() const {
  std::lock_guard lock(mu_);
  return due_.size();
}

void WaitQueue::loop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (due_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const Due first = *due_.begin();
    if (first.at > Clock::now()) {
      cv_.wait_until(lock, first.at);
      continue;
    }
    due_.erase(due_.begin());
    Waiter& w = *first.waiter;
    w.in_turn_ = true;
    w.woken_ = false;
    const bool cancelled = w.cancelled_;
    lock.unlock();
    std::optional<Clock::time_point> next;
    try {
      if (cancelled) {
        w.stop_(false);
      } else {
        next = w.ask_();
      }
    } catch (...) {
      // Ask and Stop answer their waiter themselves and must not throw; one that does is
      // settled, so that it never spins here.
      next.reset();
    }
    lock.lock();
    w.in_turn_ = false;
    if (next) {
      // Woken or cancelled during its turn: the next turn comes at once.
      w.at_ = w.woken_ || w.cancelled_ ? Clock::now() : *next;
      w.woken_ = false;
      due_.insert(Due{w.at_, &w});
      continue;
    }
    w.settled_ = true;
    // The waiter (its Ask, its Stop and what they hold) goes outside the lock: what it
    // holds may wake or cancel waiters as it goes.
    std::shared_ptr<Waiter> done = std::move(w.self_);
    lock.unlock();
    done.reset();
    lock.lock();
  }
}

void WaitQueue::shutdown() noexcept {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<std::shared_ptr<Waiter>> left;
  {
    std::lock_guard lock(mu_);
    for (const Due& d : due_) {
      d.waiter->settled_ = true;
      left.push_back(std::move(d.waiter->self_));
    }
    due_.clear();
  }
  for (auto& w : left) {
    try {
      w->stop_(true);
    } catch (...) {
      // As in loop(): a Stop must not throw.
    }
    w.reset();
  }
}

}  // namespace idem::detail
