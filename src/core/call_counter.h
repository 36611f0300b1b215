#pragma once

// Counts the calls inside an executor, so that shutdown can wait until no call uses the
// executor's state any more, at almost no cost to the calls themselves: each thread counts
// in a slot of its own with plain loads and stores (no locked instruction), and the rare
// shutdown pays for the ordering instead, with one membarrier(2) that makes every other
// running thread execute a memory barrier (the asymmetric fences of folly and liburcu).
// Where membarrier is not available the calls fall back to a fence each.
//
// The protocol, for a flag `closing` that shutdown raises:
//   call:     slot = enter();  if (closing) { leave(slot); refuse; }  ...  leave(slot);
//   shutdown: closing = true;  synchronize();  wait for total() == 0.
// Either the call sees `closing`, or shutdown sees its count: never neither.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace idem::detail {

class CallCounter {
 public:
  struct alignas(64) Slot {
    std::atomic<std::int64_t> calls{0};
    std::atomic<bool> taken{false};
    // The slot that threads share once every other slot is taken: counted with atomic
    // read-modify-writes, since several threads write it.
    bool shared = false;
  };

  CallCounter();
  CallCounter(const CallCounter&) = delete;
  CallCounter& operator=(const CallCounter&) = delete;

  // Counts a call of this thread. Reads that follow it are ordered after the count.
  Slot* enter() noexcept;
  // Stops counting a call. REQUIRES: on the thread that entered with `slot`.
  static void leave(Slot* slot) noexcept;
  // Call after raising the flag and before total(): every call that did not see the flag
  // is counted in total() from here on.
  void synchronize() noexcept;
  // Calls counted now. An acquire read: what a call did before it left happened before.
  std::int64_t total() const noexcept;

 private:
  Slot* claim() noexcept;

  // A thread owns at most one slot in this many executors at once (more: the shared slot).
  static constexpr std::size_t kSlots = 64;
  const std::uint64_t id_;
  // kSlots slots that one thread each claims for good, then the shared one.
  std::unique_ptr<Slot[]> slots_;
};

}  // namespace idem::detail
