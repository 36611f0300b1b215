// begin/complete, for actions that do not fit in one blocking call (docs/api.md):
//
//  1. A callback: the "upstream" answers later on an I/O thread, and the handle travels
//     inside the completion handler, which completes it there.
//  2. A queue consumer: a receiver thread begins each message and hands the handle to a
//     worker thread, which does the work and completes it.
//
// Every message is delivered twice (a redelivery), so half the begins find the key done.
//
//   begin_complete [STORE_URL]        STORE_URL defaults to "memory:"
//
// Exits 0 when each key's work ran exactly once and every duplicate got the first result.

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "idem/executor.h"
#include "idem/open_store.h"

namespace {

// A queue of work items served by one thread, standing in for an I/O context or a worker
// pool. The destructor finishes what was posted, then stops.
template <typename Item>
class WorkQueue {
 public:
  explicit WorkQueue(std::function<void(Item)> serve)
      : serve_(std::move(serve)), thread_([this] { loop(); }) {}
  ~WorkQueue() {
    {
      std::lock_guard lock(mu_);
      closing_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void post(Item item) {
    {
      std::lock_guard lock(mu_);
      items_.push_back(std::move(item));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return closing_ || !items_.empty(); });
      if (items_.empty()) return;
      Item item = std::move(items_.front());
      items_.pop_front();
      lock.unlock();
      serve_(std::move(item));
      lock.lock();
    }
  }

  std::function<void(Item)> serve_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  bool closing_ = false;
  std::thread thread_;
};

std::atomic<int> upstream_calls{0};
std::atomic<int> bills{0};
std::atomic<int> failures{0};

// --- 1. a callback ----------------------------------------------------------------------

using Callback = std::function<void()>;

// An asynchronous upstream: answers on the I/O thread, some time later.
void async_upstream(WorkQueue<Callback>& io, std::string body, idem::Token fence,
                    std::function<void(std::string)> on_done) {
  ++upstream_calls;
  io.post([body = std::move(body), fence, on_done = std::move(on_done)] {
    on_done("accepted " + body + " under token " + std::to_string(fence));
  });
}

void handle_request(idem::Executor& executor, WorkQueue<Callback>& io, const std::string& key,
                    std::function<void(std::string, bool)> respond) {
  auto b = executor.begin("POST /orders", key);
  if (auto* r = b.replay()) return respond(r->value, true);
  if (b.busy()) return respond("409: in progress", false);
  // std::function needs a copyable callable, so the handle is shared by the callback.
  auto handle = std::make_shared<idem::AttemptHandle<>>(std::move(*b.handle()));
  async_upstream(io, key, handle->token(), [handle, respond](std::string answer) {
    try {
      respond(handle->complete(std::move(answer)).value, false);
    } catch (const idem::Error& e) {
      ++failures;
      respond(std::string("502: ") + e.what(), false);
    }
  });
}

// --- 2. a queue consumer ----------------------------------------------------------------

struct Job {
  std::string message_id;
  idem::AttemptHandle<> handle;
};

void work(Job job) {
  try {
    ++bills;
    job.handle.complete("billed " + job.message_id);
  } catch (const std::exception& e) {
    job.handle.release();  // does nothing if complete() already ended the handle
    ++failures;
    std::fprintf(stderr, "worker: %s\n", e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string url = argc > 1 ? argv[1] : "memory:";
  try {
    idem::Executor executor(idem::open_store(url));
    constexpr int kRequests = 20;

    std::mutex mu;
    std::vector<std::pair<std::string, bool>> responses;
    {
      WorkQueue<Callback> io([](Callback f) { f(); });
      for (int round = 0; round < 2; ++round) {
        for (int i = 0; i < kRequests; ++i) {
          handle_request(executor, io, "order-" + std::to_string(i),
                         [&](std::string body, bool replayed) {
                           std::lock_guard lock(mu);
                           responses.emplace_back(std::move(body), replayed);
                         });
        }
      }
    }  // the I/O thread finishes every callback before it stops

    {
      WorkQueue<Job> workers(work);
      // The receiver: each message arrives twice; the second finds it done or in flight.
      for (int round = 0; round < 2; ++round) {
        for (int i = 0; i < kRequests; ++i) {
          const std::string id = "message-" + std::to_string(i);
          auto b = executor.begin("billing", id);
          if (b.replay() || b.busy()) continue;  // acknowledge again / redeliver later
          workers.post(Job{id, std::move(*b.handle())});
        }
      }
    }

    int replayed = 0;
    for (const auto& r : responses) replayed += r.second ? 1 : 0;
    std::printf("callbacks: %zu responses, %d replayed, %d upstream calls\n", responses.size(),
                replayed, upstream_calls.load());
    std::printf("queue: %d messages billed\n", bills.load());
    // Each key's work ran once: the second round replayed, or found the first in flight.
    const bool ok = upstream_calls == kRequests && bills == kRequests && failures == 0 &&
                    responses.size() == 2 * kRequests;
    return ok ? 0 : 1;
  } catch (const idem::Error& e) {
    std::fprintf(stderr, "begin_complete: %s\n", e.what());
    return 1;
  }
}
