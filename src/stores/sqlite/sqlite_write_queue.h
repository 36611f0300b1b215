#pragma once

// Group commit for the SQLite store, private to it. The writes of one store object queue
// here in memory, first come first served, instead of each connection polling SQLite's
// single write lock (leveldb's DBImpl::Write works the same way). The writer at the front of
// the queue is the leader: it takes the writes queued behind it, up to a bound, applies them
// all in one transaction and hands each its own result; the next writer in line then leads.
// A batch is whatever queued while the previous transaction was in flight, bounded in
// operations and bytes. Nobody sleeps waiting for it to fill: a leader only yields its CPU
// once when other threads are inside a write call but not queued yet (see lead()), so a lone
// writer leads at once and pays for nothing but a mutex.

#include <semaphore.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

namespace idem::sqlite {

// One write waiting for its turn. The store derives its operations from it.
class QueuedWrite {
 public:
  QueuedWrite() noexcept { sem_init(&wake_, 0, 0); }
  ~QueuedWrite() { sem_destroy(&wake_); }
  QueuedWrite(const QueuedWrite&) = delete;
  QueuedWrite& operator=(const QueuedWrite&) = delete;

  // What the write adds to a batch: how many operations it carries and their payload bytes.
  std::size_t operations = 1;
  std::size_t bytes = 0;
  // Set when the write failed; the queue's submit() rethrows it to the writer's caller.
  std::exception_ptr error;

 private:
  friend class WriteQueue;
  enum class State { kQueued, kLead, kDone };
  // Posted once by the leader that applied this write, or that hands it the lead. A POSIX
  // semaphore may be destroyed as soon as sem_wait returns, even while sem_post is still
  // returning, so the waiter can return at once.
  sem_t wake_;
  State state_ = State::kQueued;
  std::uint64_t batch_number_ = 0;
  std::uint32_t index_ = 0;
  std::uint32_t batch_size_ = 0;
};

class WriteQueue {
 public:
  struct Limits {
    // Operations in one batch (a write carrying more is applied alone).
    std::size_t max_operations = 64;
    // Payload bytes in one batch (a larger write is applied alone), so a big payload does
    // not slow down the small writes queued beside it by much.
    std::size_t max_bytes = std::size_t{1} << 20;
  };

  // Applies a batch in one transaction, setting each write's result or its error. Called by
  // one leader at a time, never concurrently; must not throw (if it does, every write of the
  // batch fails with that exception).
  using Apply = std::function<void(std::span<QueuedWrite* const> batch)>;

  WriteQueue(Limits limits, Apply apply);
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  // Queues `w` and returns once a batch holding it was applied, by this thread or by the
  // leader of its batch. Throws w.error when it is set.
  void submit(QueuedWrite& w);

  // Counts a write call from its start (before acquire's read) to its return, so a leader
  // can tell whether other threads are on their way to the queue.
  class Caller {
   public:
    explicit Caller(WriteQueue& queue) noexcept : queue_(queue) {
      queue_.callers_.fetch_add(1, std::memory_order_relaxed);
    }
    ~Caller() { queue_.callers_.fetch_sub(1, std::memory_order_relaxed); }
    Caller(const Caller&) = delete;
    Caller& operator=(const Caller&) = delete;

   private:
    WriteQueue& queue_;
  };

  struct Counts {
    std::uint64_t batches = 0;     // batches applied so far (one transaction each)
    std::uint64_t operations = 0;  // operations in them
    std::size_t in_flight = 0;     // writes in the batch being applied now
    std::size_t queued = 0;        // writes waiting for a batch
  };
  Counts counts() const;

 private:
  void lead(QueuedWrite& self, std::unique_lock<std::mutex>& lock);

  const Limits limits_;
  const Apply apply_;
  mutable std::mutex mu_;
  std::deque<QueuedWrite*> writers_;     // front: the batch in flight (if any), then the queue
  std::size_t in_flight_ = 0;            // writes at the front taken by the current leader
  std::atomic<std::size_t> callers_{0};  // inside a write call (see Caller)
  std::uint64_t batches_started_ = 0;
  std::uint64_t batches_ = 0;
  std::uint64_t operations_ = 0;
};

// Where the calling thread's last submitted write was applied: the batch (counted from 1 in
// its queue), its index in that batch and the batch's size. For tests that check a batch
// against a sequential model.
struct WritePosition {
  std::uint64_t batch = 0;
  std::uint32_t index = 0;
  std::uint32_t batch_size = 0;
};
WritePosition last_write_position() noexcept;

}  // namespace idem::sqlite
