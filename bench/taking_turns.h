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

// Runs `a` on `threads_a` threads and `b` on `threads_b` in turns, `slices` slices each;
// returns each side's operations per second.
template <typename A, typename B>
std::pair<double, double> taking_turns(int slices, int threads_a, const A& a, int threads_b,
                                       const B& b) {
  long a_ops = 0, b_ops = 0;
  double a_s = 0, b_s = 0;
  for (int i = 0; i < slices; ++i) {
    const auto [an, as] = slice(threads_a, a);
    const auto [bn, bs] = slice(threads_b, b);
    a_ops += an;
    a_s += as;
    b_ops += bn;
    b_s += bs;
  }
  return {static_cast<double>(a_ops) / a_s, static_cast<double>(b_ops) / b_s};
}

}  // namespace idem::bench
