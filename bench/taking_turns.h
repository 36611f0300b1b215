#pragma once

// Raw and store taking turns, for benchmarks on a shared machine whose load moves by a
// factor of two within a minute: each side runs in slices of 250 ms, alternately, so both
// see the same machine and their ratio comes from the same minutes.

#include <atomic>
#include <chrono>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace idem::bench {

// Runs op(thread, i) on `threads` threads for 250 ms; returns the operations done and the
// seconds taken. `op` returns how many operations one call did (a pipeline of 16: 16), or
// nothing for one.
template <typename Op>
std::pair<long, double> slice(int threads, const Op& op) {
  using namespace std::chrono_literals;
  std::atomic<bool> stop{false};
  std::atomic<long> done{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      long n = 0;
      for (long i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        if constexpr (std::is_void_v<decltype(op(t, i))>) {
          op(t, i);
          ++n;
        } else {
          n += op(t, i);
        }
      }
      done += n;
    });
  }
  std::this_thread::sleep_for(250ms);
  stop = true;
  for (auto& w : workers) w.join();
  return {done.load(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

}  // namespace idem::bench
