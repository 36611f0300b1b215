#pragma once

// The executor's pauses between tries: a backoff that doubles from a first pause up to a
// cap, with the jitter that spreads out waiters that started together.

#include <algorithm>
#include <chrono>
#include <initializer_list>

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

  // Something now says when the key changes: every pause from here on is the watched one
  // (or the cap, if that is longer).
  void watched(Duration pause) noexcept {
    cap_ = std::max(cap_, pause);
    pause_ = cap_;
  }

 private:
  Duration pause_;
  Duration cap_;
};

// SPEC §7: how long a waiter sleeps before it asks the store again: this step's jittered
// pause, never past the owner's lease deadline (the store's own count of the time left)
// nor past the waiting bound. Every waiter of the executor sleeps by this rule.
inline std::chrono::steady_clock::duration poll_pause(
    const Backoff& backoff, Duration lease_remaining,
    std::chrono::steady_clock::duration to_bound) {
  return std::min(
      {backoff.jittered(), std::chrono::steady_clock::duration(lease_remaining), to_bound});
}

}  // namespace idem::detail
