#include "core/call_counter.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>

namespace idem::detail {
namespace {

// Whether this process may use membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), registered
// once (Linux 4.14 and later, when no seccomp filter forbids it).
bool asymmetric() noexcept {
  static const bool registered =
      ::syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  return registered;
}

// ThreadSanitizer does not model fences (GCC warns, -Wtsan), so under it every count is a
// sequentially consistent read-modify-write and the fence one too, on an atomic of its own:
// slower, and what the sanitizer can follow. The happens-before it checks (a call's work
// before leave(), then total() before the executor's state is destroyed) is the same.
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
void full_fence() noexcept {
  static std::atomic<int> fence{0};
  fence.fetch_add(0, std::memory_order_seq_cst);
}
#else
constexpr bool kThreadSanitizer = false;
void full_fence() noexcept { std::atomic_thread_fence(std::memory_order_seq_cst); }
#endif

std::uint64_t next_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// The slots this thread holds in the executors it used last. Ids are never reused, so an
// entry of an executor that is gone never matches again.
struct Held {
  std::uint64_t id = 0;
  CallCounter::Slot* slot = nullptr;
};
constexpr std::size_t kHeld = 4;
thread_local std::array<Held, kHeld> held{};
thread_local std::size_t next_victim = 0;

}  // namespace

CallCounter::CallCounter() : id_(next_id()), slots_(std::make_unique<Slot[]>(kSlots + 1)) {
  slots_[kSlots].shared = true;
  (void)asymmetric();  // registers before the first call can count
}

CallCounter::Slot* CallCounter::claim() noexcept {
  for (std::size_t i = 0; i < kSlots; ++i) {
    Slot& s = slots_[i];
    if (!s.taken.load(std::memory_order_relaxed) &&
        !s.taken.exchange(true, std::memory_order_acq_rel)) {
      return &s;
    }
  }
  return &slots_[kSlots];
}

CallCounter::Slot* CallCounter::enter() noexcept {
  Slot* slot = nullptr;
  for (const Held& h : held) {
    if (h.id == id_) {
      slot = h.slot;
      break;
    }
  }
  if (slot == nullptr) {
    // A slot claimed here stays this thread's; one evicted from `held` is not used again.
    slot = claim();
    held[next_victim++ % kHeld] = Held{id_, slot};
  }
  if (slot->shared || kThreadSanitizer) {
    slot->calls.fetch_add(1, std::memory_order_seq_cst);
    return slot;
  }
  // Only this thread writes its slot, so a load and a store count it.
  slot->calls.store(slot->calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (asymmetric()) {
    // The store may still sit in this CPU's store buffer when the flag is read;
    // synchronize() drains it from the other side.
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    full_fence();
  }
  return slot;
}

void CallCounter::leave(Slot* slot) noexcept {
  if (slot->shared) {
    slot->calls.fetch_sub(1, std::memory_order_release);
  } else {
    slot->calls.store(slot->calls.load(std::memory_order_relaxed) - 1, std::memory_order_release);
  }
}

void CallCounter::synchronize() noexcept {
  full_fence();
  if (asymmetric()) (void)::syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
}

std::int64_t CallCounter::total() const noexcept {
  std::int64_t n = 0;
  for (std::size_t i = 0; i <= kSlots; ++i) n += slots_[i].calls.load(std::memory_order_acquire);
  return n;
}

}  // namespace idem::detail
