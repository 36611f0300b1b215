#pragma once

// The executor's pauses between tries: a backoff that doubles from a first pause up to a
// cap, with the jitter that spreads out waiters that started together.

#include <algorithm>
#include <chrono>

#include "idem/types.h"

namespace idem::detail {

class Backoff {
 public:
  Backoff(Duration first, Duration cap) noexcept : pause_(first), cap_(cap) {}

  // The pause of this step.
  Duration pause() const noexcept { return pause_; }

  // The pause of this step with jitter: half of it plus up to half again at random.
  std::chrono::steady_clock::duration jittered() const;

  // On to the next step: the pause doubles, up to the cap.
  void advance() noexcept { pause_ = std::min(pause_ * 2, cap_); }

 private:
  Duration pause_;
  Duration cap_;
};

}  // namespace idem::detail
