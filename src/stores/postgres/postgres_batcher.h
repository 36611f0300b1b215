#pragma once

// Concurrent callers sharing round trips (STORE-FACTS: on a 2-core machine, many connections
// each waiting for their own reply are worth far less than one reply for many). Callers of
// one kind of statement queue their requests; whoever finds no batch in flight takes every
// queued request (up to a bound, never two for the same record) and runs them as one
// statement, then hands each caller its answer, waking that caller alone, and wakes one queued
// caller to run the next batch. A caller alone runs its own request at once, so a single
// caller pays one uncontended mutex and nothing else.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "idem/error.h"
#include "idem/types.h"

namespace idem::postgres {

template <typename Request, typename Response>
class Batcher {
 public:
  struct Entry {
    explicit Entry(const Request* r) : request(r) {}

    const Request* request;
    std::optional<Response> response;  // set by the batch's runner
    std::exception_ptr error;

    // The batcher's own (runners leave them alone).
    bool taken = false;   // in a batch (guarded by the batcher's mu_)
    bool called = false;  // told to run the next batch (guarded by the batcher's mu_)
    // Its caller sleeps on its own lock, so a batch's end wakes each of its callers alone
    // and none of them wakes only to queue for the batcher's lock.
    std::mutex m;
    std::condition_variable wake;
    bool done = false;  // answered (guarded by m)
    bool told = false;  // `called` was set and it has not looked yet (guarded by m)
  };
  // Runs a batch: sets every entry's response, or throws (every entry then gets the error,
  // whatever responses were set).
  using Runner = std::function<void(const std::vector<Entry*>&)>;

  // `max_batch` requests at most per statement; `identity` names a request's record, so two
  // requests for one record never share a statement (one statement changes a row once).
  // At most `max_in_flight` batches run at once (more keep the server's cores busy, fewer
  // make larger batches).
  Batcher(std::size_t max_batch, std::size_t max_in_flight,
          std::function<std::string_view(const Request&)> identity)
      : max_batch_(max_batch), max_in_flight_(max_in_flight), identity_(std::move(identity)) {}

  // Returns the response to `request`, run alone or with others. Throws what the batch
  // threw, or StoreUnavailable naming `store` when `deadline` passes while it still waits
  // for its turn.
  Response submit(const Request& request, std::chrono::steady_clock::time_point deadline,
                  const std::string& store, Duration timeout, const Runner& run) {
    Entry e(&request);
    std::unique_lock lock(mu_);
    queue_.push_back(&e);
    for (;;) {
      e.called = false;  // told or not, it acts now
      if (!e.taken && in_flight_ < max_in_flight_) {
        ++in_flight_;
        const std::vector<Entry*> batch = take();
        lock.unlock();
        if (run_batch(batch, run, e)) break;
        lock.lock();
        continue;
      }
      const bool taken = e.taken;
      lock.unlock();
      {
        std::unique_lock own(e.m);
        if (taken) {
          // In a batch that is running; it ends by its own deadline.
          e.wake.wait(own, [&] { return e.done; });
        } else {
          e.wake.wait_until(own, deadline, [&] { return e.done || e.told; });
        }
        if (e.done) break;
        e.told = false;
      }
      lock.lock();
      if (!e.taken && std::chrono::steady_clock::now() >= deadline) {
        std::erase(queue_, &e);
        if (e.called) call_next();  // the turn it was told of goes to the next caller
        throw StoreUnavailable(store, "timed out after " + std::to_string(timeout.count()) +
                                          " ms waiting for its turn to reach the server");
      }
    }
    if (e.error) std::rethrow_exception(e.error);
    return std::move(*e.response);
  }

 private:
  // Runs `batch` (taken by `self`'s caller), hands each entry its answer and wakes its
  // caller, and tells the next queued caller to run a batch. Whether `self` was answered.
  bool run_batch(const std::vector<Entry*>& batch, const Runner& run, Entry& self) {
    try {
      run(batch);
    } catch (...) {
      // The batch failed as a whole: nobody gets a partial answer.
      const std::exception_ptr error = std::current_exception();
      for (Entry* b : batch) {
        b->response.reset();
        b->error = error;
      }
    }
    {
      std::lock_guard lock(mu_);
      --in_flight_;
      call_next();
    }
    bool answered = false;
    for (Entry* b : batch) {
      if (b == &self) {
        answered = true;
        continue;
      }
      // Under its own lock: its caller cannot see `done` and destroy it before this ends.
      std::lock_guard own(b->m);
      b->done = true;
      b->wake.notify_one();
    }
    return answered;
  }

  // A batch's place is free: the oldest queued caller not yet told runs the next batch (one
  // wake-up, not every waiter's). Under mu_, which a queued caller takes before it leaves,
  // so the entry is still there. REQUIRES: mu_ held.
  void call_next() {
    if (in_flight_ >= max_in_flight_) return;
    for (Entry* q : queue_) {
      if (!q->called) {
        q->called = true;
        std::lock_guard own(q->m);
        q->told = true;
        q->wake.notify_one();
        return;
      }
    }
  }

  // The queued requests of the next batch, oldest first, one per record. Guarded by mu_.
  std::vector<Entry*> take() {
    std::vector<Entry*> batch;
    std::unordered_set<std::string_view> records;
    for (auto it = queue_.begin(); it != queue_.end() && batch.size() < max_batch_;) {
      if (records.insert(identity_(*(*it)->request)).second) {
        (*it)->taken = true;
        batch.push_back(*it);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    return batch;
  }

  const std::size_t max_batch_;
  const std::size_t max_in_flight_;
  const std::function<std::string_view(const Request&)> identity_;
  std::mutex mu_;
  std::deque<Entry*> queue_;
  std::size_t in_flight_ = 0;
};

}  // namespace idem::postgres
