#include "core/backoff.h"

#include <cstdint>
#include <functional>
#include <random>
#include <thread>

namespace idem::detail {

std::chrono::steady_clock::duration Backoff::jittered() const {
  thread_local std::minstd_rand rng(static_cast<std::uint32_t>(
      std::hash<std::thread::id>{}(std::this_thread::get_id()) ^
      static_cast<std::size_t>(std::chrono::steady_clock::now().time_since_epoch().count())));
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(pause_).count();
  const auto half = us / 2;
  std::uniform_int_distribution<long long> extra(0, us - half);
  return std::chrono::microseconds(half + extra(rng));
}

}  // namespace idem::detail
