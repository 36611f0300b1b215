#pragma once

// The p-th percentile (0 to 1) of latency samples, nearest rank below: what the wake benches
// (wake_latency.cpp, wake_in_process.cpp) report.

#include <algorithm>
#include <cstddef>
#include <vector>

namespace idem::bench {

inline double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

}  // namespace idem::bench
