#pragma once

// Concurrent callers sharing round trips (STORE-FACTS: on a 2-core machine, many connections
// each waiting for their own reply are worth far less than one reply for many). Callers of
// one kind of statement queue their requests; whoever finds no batch in flight takes every
// queued request (up to a bound, never two for the same record) and runs them as one
// statement, then hands each caller its answer, waking that caller alone, and wakes one queued
// caller to run the next batch. A caller alone runs its own request at once, so a single
// caller pays one uncontended mutex and nothing else.
//
// A batch beside those already running may start at once (writes: a commit waits on the
// disk, so overlapping them keeps the server busy), or be balanced (reads: the server's CPU
// is the bound, and one larger statement costs it less than two smaller ones): it starts only
// once as many requests are queued as the running batches hold, so two callers alone still
// run side by side, while many callers make a few large batches, not one large and many of
// one; or once the oldest queued request has waited a while, which bounds what a stalled
// batch holds up.

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
#include "stores/kit/own_copy.h"

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
  // make larger batches); when one beside others starts is `overlap`'s (the default: at
  // once).
  struct Overlap {
    // A batch beside others starts only once the queue holds as many requests as the running
    // batches do...
    bool balanced = false;
    // ... or its oldest request has waited this long.
    std::chrono::steady_clock::duration waited{};
  };
  Batcher(std::size_t max_batch, std::size_t max_in_flight,
          std::function<std::string_view(const Request&)> identity, Overlap overlap = {})
      : max_batch_(max_batch),
        max_in_flight_(max_in_flight),
        overlap_(overlap),
        identity_(std::move(identity)) {}

  // Returns the response to `request`, run alone or with others. Throws what the batch
  // threw, or StoreUnavailable naming `store` when `deadline` passes while it still waits
  // for its turn.
  Response submit(const Request& request, std::chrono::steady_clock::time_point deadline,
                  const std::string& store, Duration timeout, const Runner& run) {
    Entry e(&request);
    std::unique_lock lock(mu_);
    // Only a balanced batcher's callers wait for a time of their own.
    const auto overlap_at = overlap_.balanced ? std::chrono::steady_clock::now() + overlap_.waited
                                              : std::chrono::steady_clock::time_point::min();
    queue_.push_back({&e, overlap_at});
    for (;;) {
      e.called = false;  // told or not, it acts now
      if (!e.taken && may_start()) {
        ++in_flight_;
        const std::vector<Entry*> batch = take();
        requests_in_flight_ += batch.size();
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
          // Awake once when it may start a batch beside others, then only when told.
          const bool overlap_ahead =
              overlap_.balanced && overlap_at > std::chrono::steady_clock::now();
          e.wake.wait_until(own, overlap_ahead ? std::min(overlap_at, deadline) : deadline,
                            [&] { return e.done || e.told; });
        }
        if (e.done) break;
        e.told = false;
      }
      lock.lock();
      if (!e.taken && std::chrono::steady_clock::now() >= deadline) {
        std::erase_if(queue_, [&](const Queued& q) { return q.entry == &e; });
        if (e.called) call_next();  // the turn it was told of goes to the next caller
        throw StoreUnavailable(store, "timed out after " + std::to_string(timeout.count()) +
                                          " ms waiting for its turn to reach the server");
      }
    }
    if (e.error) std::rethrow_exception(e.error);
    return std::move(*e.response);
  }

  // Requests queued and not yet in a batch (for tests).
  std::size_t queued() const {
    std::lock_guard lock(mu_);
    return queue_.size();
  }

 private:
  // Runs `batch` (taken by `self`'s caller), hands each entry its answer and wakes its
  // caller, and tells the next queued caller to run a batch. Whether `self` was answered.
  bool run_batch(const std::vector<Entry*>& batch, const Runner& run, Entry& self) {
    try {
      run(batch);
    } catch (...) {
      // The batch failed as a whole: nobody gets a partial answer. Each caller throws an
      // error of its own (kit/own_copy.h).
      const std::exception_ptr error = std::current_exception();
      for (Entry* b : batch) {
        b->response.reset();
        b->error = kit::own_copy(error);
      }
    }
    {
      std::lock_guard lock(mu_);
      --in_flight_;
      requests_in_flight_ -= batch.size();
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
    if (!may_start()) return;
    for (const Queued& q : queue_) {
      if (!q.entry->called) {
        q.entry->called = true;
        std::lock_guard own(q.entry->m);
        q.entry->told = true;
        q.entry->wake.notify_one();
        return;
      }
    }
  }

  // Whether a batch may start now. Every batch's end calls the next caller, so the queue
  // never waits while nothing runs; a balanced batch beside others starts when a caller
  // queues the request that balances it or wakes at its overlap time. REQUIRES: mu_ held.
  bool may_start() const {
    if (in_flight_ == 0) return true;
    if (in_flight_ >= max_in_flight_ || queue_.empty()) return false;
    return !overlap_.balanced || queue_.size() >= requests_in_flight_ ||
           queue_.front().overlap_at <= std::chrono::steady_clock::now();
  }

  // The queued requests of the next batch, oldest first, one per record. Guarded by mu_.
  std::vector<Entry*> take() {
    std::vector<Entry*> batch;
    std::unordered_set<std::string_view> records;
    for (auto it = queue_.begin(); it != queue_.end() && batch.size() < max_batch_;) {
      if (records.insert(identity_(*it->entry->request)).second) {
        it->entry->taken = true;
        batch.push_back(it->entry);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    return batch;
  }

  const std::size_t max_batch_;
  const std::size_t max_in_flight_;
  const Overlap overlap_;
  const std::function<std::string_view(const Request&)> identity_;
  struct Queued {
    Entry* entry;
    // When it may start a batch beside others: it has waited overlap_.waited.
    std::chrono::steady_clock::time_point overlap_at;
  };
  mutable std::mutex mu_;
  std::deque<Queued> queue_;
  std::size_t in_flight_ = 0;
  std::size_t requests_in_flight_ = 0;  // in the batches running
};

}  // namespace idem::postgres
