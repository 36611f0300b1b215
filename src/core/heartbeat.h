#pragma once

// The heartbeat (SPEC §6, §7): one thread per executor that keeps every in-flight lease
// alive by extending it on a schedule kept on the caller's steady clock. Shaped like the
// LockWatcher of redis-plus-plus (patterns/redlock.h): a min-heap of deadlines, leases that
// the owner can drop at any moment without waiting for the thread, and errors reported
// through a callback instead of thrown across the thread boundary. The heap is indexed
// (each lease knows its slot), so removing a lease takes it out at once in O(log n) and the
// heap only ever holds live leases.
//
// A lease is lost, and its stop token requested, when the store fences an extend, or when
// extends keep failing with errors until the local view of the lease deadline has passed.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/record_id.h"
#include "idem/store.h"
#include "idem/types.h"

namespace idem::detail {

using SteadyClock = std::chrono::steady_clock;

// The monotonic clock as of the last timer tick: a few nanoseconds to read instead of a few
// dozen. Never ahead of SteadyClock::now() (the same clock, coarser), so a lease deadline
// counted from it errs on the early, safe side.
SteadyClock::time_point coarse_now() noexcept;

// One lease the heartbeat keeps alive. The owner creates it (the executor derives its
// per-call state from it), registers it with add() and unregisters it with remove().
class HeartbeatLease {
 public:
  // `local_deadline` is the steady time the acquire was sent plus the lease time left that
  // the store reported (SPEC §6: never compare the store's clock with ours);
  // `lease_expires_at` is the store's own deadline, kept only to report it.
  HeartbeatLease(std::string_view scope, std::string_view key, Token token, Duration lease,
                 Duration interval, SteadyClock::time_point local_deadline,
                 Timestamp lease_expires_at);
  HeartbeatLease(const HeartbeatLease&) = delete;
  HeartbeatLease& operator=(const HeartbeatLease&) = delete;

  // The encoded (scope, key), see core/record_id.h.
  std::string_view id() const noexcept { return id_; }
  std::string_view scope() const noexcept;
  std::string_view key() const noexcept;
  Token token() const noexcept { return token_; }
  Duration lease() const noexcept { return lease_; }
  Duration interval() const noexcept { return interval_; }

  // Requested when the lease is lost, and by request_stop().
  std::stop_token stop_token() const noexcept { return stop_.get_token(); }
  // Asks the lease's holder to stop without the lease being lost (a cancellation).
  void request_stop() noexcept { stop_.request_stop(); }
  // Whether the heartbeat found the lease lost (fenced, or unextended past its deadline).
  bool lost() const noexcept { return lost_.load(std::memory_order_acquire); }
  // A store write of the owner's (a complete) was fenced: the lease is lost as if the
  // heartbeat had found it so (Attempt::lease_lost() reads true, its stop is requested).
  void mark_lost() noexcept { lose(); }
  const std::atomic<bool>& lost_flag() const noexcept { return lost_; }

  // The local deadline after the last successful extend (or the acquire).
  SteadyClock::time_point local_deadline() const noexcept;
  // The store's deadline after the last successful extend (or the acquire).
  Timestamp lease_expires_at() const noexcept;
  // Records what the store last said of a lease this process does not hold (a waiter
  // tracking another process's lease); never used for a lease registered with add().
  void observe(SteadyClock::time_point local_deadline, Timestamp lease_expires_at) noexcept;
  // How many extends the store accepted.
  std::uint64_t extends() const noexcept { return extends_.load(std::memory_order_relaxed); }

 private:
  friend class Heartbeat;

  std::string id_;
  Token token_;
  Duration lease_;
  Duration interval_;
  // Marks the lease lost, then requests its stop token.
  void lose() noexcept;
  // Removed or suspended: not to be extended, and an extend's outcome is ignored.
  bool off_schedule() const noexcept {
    return removed_.load(std::memory_order_acquire) || suspended_.load(std::memory_order_acquire);
  }

  std::stop_source stop_;
  std::atomic<bool> lost_{false};
  // Set once by Heartbeat::remove (under the heartbeat's lock); a lease being extended when
  // it is removed is dropped by the thread when the store call returns.
  std::atomic<bool> removed_{false};
  // Set by Heartbeat::suspend and cleared by resume (under the heartbeat's lock): the lease
  // stays counted but is not extended, and the outcome of an extend in flight is ignored.
  std::atomic<bool> suspended_{false};
  // Where the heartbeat holds the lease: its slot in the heap, or one of the two values
  // below. Guarded by the heartbeat's lock.
  static constexpr std::size_t kOff = static_cast<std::size_t>(-1);
  static constexpr std::size_t kExtending = static_cast<std::size_t>(-2);
  std::size_t slot_ = kOff;
  std::atomic<SteadyClock::rep> local_deadline_;
  std::atomic<Duration::rep> lease_expires_at_ms_;
  std::atomic<std::uint64_t> extends_{0};
};

class Heartbeat {
 public:
  using ErrorHandler = std::function<void(const std::exception&)>;
  // `error` is the store's error for a failed extend of `lease`, or null when `lease` was
  // found lost.
  using LeaseHandler =
      std::function<void(const HeartbeatLease& lease, const std::exception* error)>;

  // `store` must outlive the heartbeat. `on_error` is called on the heartbeat thread for
  // each failed store call, `on_lease` for each lease that call concerned and for each
  // lease found lost. They must not throw (if they do, the exception is swallowed).
  Heartbeat(Store& store, ErrorHandler on_error, LeaseHandler on_lease = nullptr);
  // Stops the thread, waiting for a store call in progress to return.
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Starts keeping `lease` alive; its first extend is due one interval from now. Starts
  // the thread on first use.
  void add(std::shared_ptr<HeartbeatLease> lease);
  // Stops keeping `lease` alive. Never blocks on the store: an extend in flight for this
  // or any other lease finishes on its own and its outcome is ignored. Idempotent: returns
  // whether this call removed it (false when it had been removed already).
  bool remove(HeartbeatLease& lease) noexcept;
  // Stops extending `lease` for a while without removing it (SPEC §14: its complete was
  // written on a caller's transaction that holds the record, and an extend would wait for
  // that transaction and then find the record COMPLETE). Never blocks on the store: an
  // extend in flight finishes on its own and its outcome is ignored. Returns false when the
  // lease was removed already (or is suspended).
  bool suspend(HeartbeatLease& lease) noexcept;
  // Extends a suspended lease again, the first extend at once. Returns false when it was
  // removed meanwhile (or was not suspended).
  bool resume(const std::shared_ptr<HeartbeatLease>& lease);
  // Leases added and not yet removed (lost ones included until they are removed).
  std::size_t active() const noexcept { return active_.load(std::memory_order_relaxed); }
  // Whether the thread was started (for tests).
  bool started() const;

 private:
  struct Item {
    SteadyClock::time_point due;
    std::shared_ptr<HeartbeatLease> lease;
  };
  void loop();
  // Extends the leases of `batch` in one Store::extend_many call and sets each one's next
  // due time, or requests its stop token when it is lost. `requests` and `sent_for` are
  // scratch space kept across calls.
  void beat(std::vector<Item>& batch, std::vector<ExtendRequest>& requests,
            std::vector<std::size_t>& sent_for);
  // After a failed extend: the next try, or the lease lost once its local deadline passed.
  void retry_after_error(Item& item);
  void report(const std::exception& e) noexcept;
  void report(const HeartbeatLease& lease, const std::exception* error) noexcept;
  void lose(HeartbeatLease& lease) noexcept;
  // The indexed heap's moves, guarded by mu_: every move records the item's new slot.
  void place(std::size_t slot, Item item) noexcept;
  void sift_up(std::size_t slot, Item item) noexcept;
  void sift_down(std::size_t slot, Item item) noexcept;
  void push(Item item);
  // Takes the item at `slot` out of the heap and returns it.
  Item take(std::size_t slot) noexcept;

  Store& store_;
  ErrorHandler on_error_;
  LeaseHandler on_lease_;
  std::atomic<std::size_t> active_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Item> heap_;  // a min-heap on `due`, guarded by mu_; only live leases
  // When the sleeping thread will next look at the heap; add() wakes it only for an
  // earlier deadline, so registering a lease rarely costs a wake-up.
  SteadyClock::time_point wake_at_ = SteadyClock::time_point::max();
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace idem::detail
