#pragma once

// A store wrapper for tests: counts every call, and on request makes chosen operations
// throw StoreUnavailable (as a store that cannot be reached would) or block until resumed
// (as a slow store would). Everything not injected is forwarded to the wrapped store.
//
// A failure comes in two halves, as on a real network: fail_next() throws before the call
// reaches the store (nothing happened), lose_reply_next() lets the call take effect in the
// store and then throws (the reply was lost; store.h: "it then may or may not have taken
// effect").
//
//   auto faults = std::make_shared<idem::testing::FaultStore>(memory);
//   faults->fail_next(idem::testing::Op::kComplete);       // one transient error
//   faults->lose_reply_next(idem::testing::Op::kComplete); // recorded, but the caller
//                                                          // sees StoreUnavailable
//   faults->pause(idem::testing::Op::kExtend);              // heartbeats block ...
//   faults->resume(idem::testing::Op::kExtend);             // ... until now

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>

#include "idem/store_wrapper.h"

namespace idem::testing {

// kExtend is one lease's extend: every extend, batched or not, passes it once per request.
// kExtendMany is a whole Store::extend_many batch, seen once before its first request and
// once after its last: a failure injected on it fails the batch before any extend, a lost
// reply loses the batch's reply after every extend of it took effect.
enum class Op { kAcquire, kComplete, kRelease, kExtend, kPurge, kGet, kForget, kExtendMany };
inline constexpr std::size_t kOpCount = 8;

const char* to_string(Op op);

class FaultStore : public StoreWrapper {
 public:
  explicit FaultStore(std::shared_ptr<Store> target);

  // The next `n` calls of `op` throw StoreUnavailable without reaching the wrapped store.
  void fail_next(Op op, int n = 1);
  // Every call of `op` throws StoreUnavailable until fail_always(op, false).
  void fail_always(Op op, bool on = true);
  // The next `n` calls of `op` reach the wrapped store and take effect, then throw
  // StoreUnavailable instead of returning (the reply was lost).
  void lose_reply_next(Op op, int n = 1);
  // Every call of `op` takes effect and then throws, until lose_reply_always(op, false).
  void lose_reply_always(Op op, bool on = true);
  // Calls of `op` block (before reaching the wrapped store) until resume(op).
  void pause(Op op);
  void resume(Op op);

  // Calls of `op` made so far, failed and blocked ones included.
  std::size_t calls(Op op) const;
  // Calls of every operation made so far (a batch's extends count once each, under kExtend).
  std::size_t total_calls() const;
  // Calls of `op` currently blocked by pause(op).
  std::size_t blocked(Op op) const;
  // Calls of `op` failed before reaching the store, and calls whose reply was lost, so far.
  std::size_t failed(Op op) const;
  std::size_t lost_replies(Op op) const;

  // Waits until calls(op) >= n, or blocked(op) >= n, for at most `timeout`; returns
  // whether it happened. Tests use these to sequence threads without sleeping.
  bool wait_for_calls(Op op, std::size_t n,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  bool wait_for_blocked(Op op, std::size_t n,
                        std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;

 protected:
  AcquireResult do_acquire(std::string_view scope, std::string_view key, Duration lease,
                           Duration ttl, std::optional<std::string_view> fingerprint) override;
  WriteResult do_complete(std::string_view scope, std::string_view key, Token token,
                          std::string_view payload, Duration ttl) override;
  WriteResult do_release(std::string_view scope, std::string_view key, Token token) override;
  ExtendResult do_extend(std::string_view scope, std::string_view key, Token token,
                         Duration lease) override;
  // One extend at a time through do_extend, so faults injected on kExtend apply to every
  // lease of a batched heartbeat and calls(kExtend) counts leases extended.
  std::vector<ExtendResult> do_extend_many(std::span<const ExtendRequest> requests) override;
  std::size_t do_purge(std::size_t limit) override;
  std::optional<Record> do_get(std::string_view scope, std::string_view key) override;
  bool do_forget(std::string_view scope, std::string_view key) override;

 private:
  struct OpState {
    std::size_t calls = 0;
    int fail_next = 0;
    bool fail_always = false;
    bool paused = false;
    std::size_t blocked = 0;
    int lose_next = 0;
    bool lose_always = false;
    std::size_t failed = 0;
    std::size_t lost = 0;
  };

  // Counts the call, blocks while paused, and throws when a failure is due.
  void enter(Op op);
  // After the wrapped store answered: throws when a lost reply is due.
  void leave(Op op);
  // Forwards `f` between enter(op) and leave(op).
  template <typename F>
  auto forward(Op op, F&& f) -> decltype(f()) {
    enter(op);
    auto result = f();
    leave(op);
    return result;
  }

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::array<OpState, kOpCount> ops_{};
};

}  // namespace idem::testing
