#pragma once

// Concurrent callers sharing round trips (STORE-FACTS: on a 2-core machine, many connections
// each waiting for their own reply are worth far less than one reply for many). Callers of
// one kind of statement queue their requests; whoever finds no batch in flight takes every
// queued request (up to a bound, never two for the same record) and runs them as one
// statement, then hands each caller its answer. A caller alone runs its own request at once,
// so a single caller pays one uncontended mutex and nothing else.

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
    const Request* request;
    std::optional<Response> response;  // set by the batch's runner
    std::exception_ptr error;
    bool taken = false;
    bool done = false;
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
    Entry e{&request, std::nullopt, nullptr};
    std::unique_lock lock(mu_);
    queue_.push_back(&e);
    while (!e.done) {
      if (in_flight_ < max_in_flight_ && !e.taken) {
        ++in_flight_;
        const std::vector<Entry*> batch = take();
        lock.unlock();
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
        lock.lock();
        for (Entry* b : batch) b->done = true;
        --in_flight_;
        changed_.notify_all();
        continue;
      }
      if (e.taken) {
        changed_.wait(lock);  // in a batch that is running; it ends by its own deadline
      } else if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && !e.taken) {
        std::erase(queue_, &e);
        throw StoreUnavailable(store, "timed out after " + std::to_string(timeout.count()) +
                                          " ms waiting for its turn to reach the server");
      }
    }
    if (e.error) std::rethrow_exception(e.error);
    return std::move(*e.response);
  }

 private:
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
  std::condition_variable changed_;
  std::deque<Entry*> queue_;
  std::size_t in_flight_ = 0;
};

}  // namespace idem::postgres
