#include "idem/clock.h"

namespace idem {

Timestamp SystemClock::now() const {
  return std::chrono::time_point_cast<Duration>(std::chrono::system_clock::now());
}

std::shared_ptr<SystemClock> SystemClock::instance() {
  static const auto clock = std::make_shared<SystemClock>();
  return clock;
}

}  // namespace idem
