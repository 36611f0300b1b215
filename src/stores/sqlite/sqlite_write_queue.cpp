#include "stores/sqlite/sqlite_write_queue.h"

#include <thread>
#include <utility>

#include "stores/kit/own_copy.h"

namespace idem::sqlite {
namespace {

thread_local WritePosition t_last_position;
// The batch a leader applies. Per thread, since the next leader starts while this one is
// still waking its followers.
thread_local std::vector<QueuedWrite*> t_batch;

}  // namespace

WritePosition last_write_position() noexcept { return t_last_position; }

WriteQueue::WriteQueue(Limits limits, Apply apply) : limits_(limits), apply_(std::move(apply)) {}

WriteQueue::Counts WriteQueue::counts() const {
  std::lock_guard lock(mu_);
  return Counts{batches_, operations_, in_flight_, writers_.size() - in_flight_};
}

void WriteQueue::submit(QueuedWrite& w) {
  // Reserved before queueing, so leading a batch never allocates (and never fails).
  t_batch.reserve(limits_.max_operations);
  std::unique_lock lock(mu_);
  writers_.push_back(&w);
  if (writers_.size() > 1) {
    // Somebody leads already: wait to be applied by a leader, or to lead the next batch.
    lock.unlock();
    while (sem_wait(&w.wake_) != 0) {
      // EINTR: a signal handler ran; wait on.
    }
    if (w.state_ == QueuedWrite::State::kLead) {
      lock.lock();
      lead(w, lock);
    }
  } else {
    lead(w, lock);
  }
  t_last_position = WritePosition{w.batch_number_, w.index_, w.batch_size_};
  if (w.error) std::rethrow_exception(w.error);
}

// REQUIRES: `self` is at the front of the queue and `lock` holds mu_.
void WriteQueue::lead(QueuedWrite& self, std::unique_lock<std::mutex>& lock) {
  // When other threads are inside a write call but have not queued yet (they are reading
  // first, or lost their CPU on the way), give way once: on a busy machine they then run and
  // queue behind this leader, instead of the threads taking turns on the CPU and each
  // committing alone. A lone writer never waits here.
  if (callers_.load(std::memory_order_relaxed) > writers_.size()) {
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
  // The batch: the front writes, in the order they queued, up to the bounds; the first one
  // always, whatever its size.
  std::vector<QueuedWrite*>& batch = t_batch;
  batch.clear();
  std::size_t operations = 0;
  std::size_t bytes = 0;
  for (QueuedWrite* w : writers_) {
    if (!batch.empty() && (batch.size() == limits_.max_operations ||
                           operations + w->operations > limits_.max_operations ||
                           bytes + w->bytes > limits_.max_bytes)) {
      break;
    }
    operations += w->operations;
    bytes += w->bytes;
    batch.push_back(w);
  }
  in_flight_ = batch.size();
  const std::uint64_t number = ++batches_started_;
  lock.unlock();

  for (std::size_t i = 0; i < batch.size(); ++i) {
    batch[i]->batch_number_ = number;
    batch[i]->index_ = static_cast<std::uint32_t>(i);
    batch[i]->batch_size_ = static_cast<std::uint32_t>(batch.size());
  }
  try {
    apply_(std::span<QueuedWrite* const>(batch));
  } catch (...) {
    // Each write throws an error of its own (kit/own_copy.h).
    const std::exception_ptr error = std::current_exception();
    for (QueuedWrite* w : batch) {
      if (!w->error) w->error = kit::own_copy(error);
    }
  }

  lock.lock();
  writers_.erase(writers_.begin(), writers_.begin() + static_cast<std::ptrdiff_t>(batch.size()));
  in_flight_ = 0;
  ++batches_;
  operations_ += operations;
  QueuedWrite* next = writers_.empty() ? nullptr : writers_.front();
  lock.unlock();

  // The next leader first, so its transaction starts while this one wakes its followers.
  // Once woken, a write may return and be destroyed: nothing touches it after sem_post.
  if (next != nullptr) {
    next->state_ = QueuedWrite::State::kLead;
    sem_post(&next->wake_);
  }
  for (QueuedWrite* w : batch) {
    if (w == &self) continue;
    w->state_ = QueuedWrite::State::kDone;
    sem_post(&w->wake_);
  }
  self.state_ = QueuedWrite::State::kDone;
}

}  // namespace idem::sqlite
