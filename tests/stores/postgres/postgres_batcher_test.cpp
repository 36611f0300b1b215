// The PostgreSQL store's batcher (src/stores/postgres/postgres_batcher.h) on its own: concurrent
// callers share batches, never two requests for one record in a batch, every caller is answered
// with batches in flight side by side, a balanced batch beside others waits until it is as
// large as they are or a while (not longer), a failed batch fails every caller in it, and a
// caller still queued at its deadline gives up.

#include "stores/postgres/postgres_batcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <exception>
#include <latch>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.h"

namespace idem::postgres {
namespace {

using namespace std::chrono_literals;

struct Req {
  std::string id;
  int value;
};
using IntBatcher = Batcher<Req, int>;

std::string_view id_of(const Req& r) { return r.id; }

auto far_deadline() { return std::chrono::steady_clock::now() + 60s; }

TEST(PostgresBatcher, ConcurrentCallersShareBatchesOneRequestPerRecord) {
  IntBatcher batcher(/*max_batch=*/8, /*max_in_flight=*/1, &id_of);
  constexpr int kThreads = 24;
  std::mutex mu;
  std::vector<std::size_t> sizes;
  std::atomic<int> duplicates{0};
  IntBatcher::Runner run = [&](const std::vector<IntBatcher::Entry*>& batch) {
    std::set<std::string> ids;
    for (auto* e : batch) {
      if (!ids.insert(e->request->id).second) ++duplicates;
      e->response = e->request->value * 2;
    }
    {
      std::lock_guard lock(mu);
      sizes.push_back(batch.size());
    }
    std::this_thread::sleep_for(20ms);  // a slow statement, so others queue meanwhile
  };
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      // Every third thread asks for the same record as another.
      const Req r{"record-" + std::to_string(t % 3 == 0 ? 0 : t), t};
      if (batcher.submit(r, far_deadline(), "store", 1000ms, run) != t * 2) ++wrong;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(duplicates.load(), 0);
  std::size_t total = 0;
  std::size_t largest = 0;
  for (std::size_t n : sizes) {
    total += n;
    largest = std::max(largest, n);
    EXPECT_LE(n, 8u);
  }
  EXPECT_EQ(total, static_cast<std::size_t>(kThreads));
  EXPECT_GT(largest, 1u) << "no two callers ever shared a batch";
}

// A batch's end wakes its own callers and tells one queued caller to run the next batch: the
// callers come in waves, all at once, so a turn lost on the way leaves the wave's last callers
// queued with nobody to run them until their deadline.
TEST(PostgresBatcher, EveryCallerIsAnsweredWithTwoBatchesInFlightAndNoneWaitsOutItsDeadline) {
  IntBatcher batcher(/*max_batch=*/4, /*max_in_flight=*/2, &id_of);
  constexpr int kThreads = 32;
  constexpr int kWaves = 30;
  std::atomic<int> running{0};
  std::atomic<int> most_running{0};
  IntBatcher::Runner run = [&](const std::vector<IntBatcher::Entry*>& batch) {
    const int now = ++running;
    int seen = most_running.load();
    while (now > seen && !most_running.compare_exchange_weak(seen, now)) {
    }
    for (auto* e : batch) e->response = e->request->value + 1;
    std::this_thread::sleep_for(1ms);  // a statement's round trip, so the wave queues
    --running;
  };
  std::barrier wave(kThreads);
  std::atomic<int> wrong{0};
  std::atomic<int> timed_out{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kWaves; ++i) {
        wave.arrive_and_wait();
        // Eight records among the callers: most batches leave a request for a record already
        // in them queued for the next.
        const Req r{"record-" + std::to_string((t + i) % 8), t * kWaves + i};
        try {
          if (batcher.submit(r, std::chrono::steady_clock::now() + 3s, "store", 3000ms, run) !=
              r.value + 1) {
            ++wrong;
          }
        } catch (const StoreUnavailable&) {
          ++timed_out;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(timed_out.load(), 0) << "a caller waited out its deadline: a batch's turn was lost";
  EXPECT_LE(most_running.load(), 2);
  EXPECT_EQ(most_running.load(), 2) << "two batches never ran at once";
}

// Reads' batches are balanced (overlap = {balanced, a time}). A runner whose batches each
// block until released.
class StalledBatches {
 public:
  IntBatcher::Runner run = [this](const std::vector<IntBatcher::Entry*>& batch) {
    {
      std::lock_guard lock(mu_);
      sizes_.push_back(batch.size());
    }
    for (auto* e : batch) e->response = e->request->value;
    while (!release_) std::this_thread::sleep_for(1ms);
  };
  // The sizes of the batches started, in order.
  std::vector<std::size_t> started() {
    std::lock_guard lock(mu_);
    return sizes_;
  }
  void release() { release_ = true; }

 private:
  std::mutex mu_;
  std::vector<std::size_t> sizes_;
  std::atomic<bool> release_{false};
};

template <typename F>
bool within_10s(F done) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!done() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  return done();
}

// Callers submitting one by one, each on its own thread.
class Callers {
 public:
  Callers(IntBatcher& batcher, const IntBatcher::Runner& run) : batcher_(batcher), run_(run) {}
  ~Callers() { join(); }
  void add(int value, std::chrono::steady_clock::time_point deadline = far_deadline()) {
    threads_.emplace_back([this, value, deadline] {
      try {
        if (batcher_.submit(Req{std::to_string(value), value}, deadline, "s", 10000ms, run_) !=
            value) {
          ++wrong;
        }
      } catch (const StoreUnavailable&) {
        ++timed_out;
      }
    });
  }
  void join() {
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  std::atomic<int> wrong{0};
  std::atomic<int> timed_out{0};

 private:
  IntBatcher& batcher_;
  const IntBatcher::Runner& run_;
  std::vector<std::thread> threads_;
};

// Two callers, one after the other, each running a batch of its own: the second, one queued
// beside one running, is balanced, so it starts at once.
void start_two_alone(Callers& callers, StalledBatches& runner) {
  callers.add(0);
  EXPECT_TRUE(within_10s([&] { return runner.started().size() == 1; }));
  callers.add(1);
  EXPECT_TRUE(within_10s([&] { return runner.started().size() == 2; }))
      << "a caller alone beside another did not run at once";
}

// Two callers alone run side by side; a third, queued beside two requests running, waits for
// the fourth, and the two start one batch together.
TEST(PostgresBatcher, ABalancedBatchStartsOnceAsManyAreQueuedAsRun) {
  IntBatcher batcher(/*max_batch=*/8, /*max_in_flight=*/3, &id_of,
                     {.balanced = true, .waited = 1h});
  StalledBatches runner;
  Callers callers(batcher, runner.run);
  start_two_alone(callers, runner);
  callers.add(2);  // one queued beside two running: it waits
  EXPECT_TRUE(within_10s([&] { return batcher.queued() == 1; }));
  EXPECT_EQ(runner.started().size(), 2u) << "an unbalanced batch started";
  callers.add(3);  // two queued beside two running: they start together
  EXPECT_TRUE(within_10s([&] { return runner.started().size() == 3; }))
      << "a balanced batch did not start";
  runner.release();
  callers.join();
  EXPECT_EQ(callers.wrong.load(), 0);
  EXPECT_EQ(callers.timed_out.load(), 0);
  EXPECT_EQ(runner.started(), (std::vector<std::size_t>{1, 1, 2}));
  EXPECT_EQ(batcher.queued(), 0u);
}

// Stalled batches (connections whose server stopped answering) hold up a request queued
// behind them for `waited`, not until its deadline: then it starts a batch beside them.
TEST(PostgresBatcher, ARequestQueuedBehindStalledBatchesStartsBesideThemOnceItHasWaited) {
  IntBatcher batcher(/*max_batch=*/8, /*max_in_flight=*/3, &id_of,
                     {.balanced = true, .waited = 50ms});
  StalledBatches runner;
  Callers callers(batcher, runner.run);
  start_two_alone(callers, runner);
  const auto queued = std::chrono::steady_clock::now();
  callers.add(2, queued + 10s);  // one queued beside two running: unbalanced
  EXPECT_TRUE(within_10s([&] { return runner.started().size() == 3; }))
      << "held up by the stalled batches";
  EXPECT_GE(std::chrono::steady_clock::now() - queued, 50ms) << "it did not wait its time";
  runner.release();
  callers.join();
  EXPECT_EQ(callers.wrong.load(), 0);
  EXPECT_EQ(callers.timed_out.load(), 0) << "held up by the stalled batches until its deadline";
  EXPECT_EQ(runner.started(), (std::vector<std::size_t>{1, 1, 1}));
}

TEST(PostgresBatcher, AFailedBatchFailsEveryCallerInIt) {
  IntBatcher batcher(8, 1, &id_of);
  std::latch start(6);
  IntBatcher::Runner run = [&](const std::vector<IntBatcher::Entry*>& batch) {
    for (auto* e : batch) e->response = 1;  // answers set, then the statement fails
    std::this_thread::sleep_for(10ms);
    throw StoreUnavailable("store", "connection lost");
  };
  // What each caller caught, kept so that no two can share an address by turns.
  std::vector<std::exception_ptr> caught(6);
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      try {
        (void)batcher.submit(Req{std::to_string(t), t}, far_deadline(), "store", 1000ms, run);
      } catch (const StoreUnavailable& e) {
        if (std::string(e.what()).find("connection lost") != std::string::npos) {
          caught[static_cast<std::size_t>(t)] = std::current_exception();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  // Each caller throws an error of its own: one object rethrown in many threads is freed by
  // whichever drops it last, unseen by ThreadSanitizer (kit/own_copy.h).
  std::set<const void*> objects;
  for (const std::exception_ptr& p : caught) {
    ASSERT_TRUE(p) << "a caller was not failed with the batch's error";
    try {
      std::rethrow_exception(p);
    } catch (const StoreUnavailable& e) {
      objects.insert(&e);
    }
  }
  EXPECT_EQ(objects.size(), 6U) << "callers share one exception object";
}

TEST(PostgresBatcher, ACallerStillQueuedAtItsDeadlineGivesUp) {
  IntBatcher batcher(8, 1, &id_of);
  std::latch running(1);
  std::atomic<bool> release{false};
  IntBatcher::Runner slow = [&](const std::vector<IntBatcher::Entry*>& batch) {
    running.count_down();
    while (!release) std::this_thread::sleep_for(1ms);
    for (auto* e : batch) e->response = 0;
  };
  std::thread first([&] { (void)batcher.submit(Req{"a", 0}, far_deadline(), "s", 1000ms, slow); });
  running.wait();
  try {
    (void)batcher.submit(Req{"b", 1}, std::chrono::steady_clock::now() + 50ms, "s", 50ms, slow);
    ADD_FAILURE() << "a queued caller outlived its deadline";
  } catch (const StoreUnavailable& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("timed out"));
  }
  release = true;
  first.join();
}

}  // namespace
}  // namespace idem::postgres
