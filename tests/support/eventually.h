#pragma once

// Waiting for something another thread or process should do soon, without timed assertions:
// the bound is only reached by a broken implementation, never by a slow machine.

#include <chrono>
#include <thread>

namespace idem::testing {

inline constexpr std::chrono::seconds kEventually{30};

// Polls `done` every millisecond until it holds or `bound` passes; returns whether it held.
template <typename F>
bool eventually(F&& done, std::chrono::steady_clock::duration bound = kEventually) {
  const auto give_up = std::chrono::steady_clock::now() + bound;
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace idem::testing
