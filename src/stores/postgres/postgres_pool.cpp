#include "stores/postgres/postgres_pool.h"

#include <new>
#include <utility>

#include "idem/error.h"

namespace idem::postgres {

Pool::Pool(std::size_t size, Opener open, std::string store, Duration timeout)
    : size_(size), opener_(std::move(open)), store_(std::move(store)), timeout_(timeout) {}

Pool::~Pool() = default;

Pool::Lease::~Lease() {
  if (c_) pool_->give_back(std::move(c_));
}

void Pool::adopt(std::unique_ptr<Connection> c) {
  std::lock_guard lock(mu_);
  ++open_;
  idle_.push_back(std::move(c));
}

std::size_t Pool::open_connections() const {
  std::lock_guard lock(mu_);
  return open_;
}

Pool::Lease Pool::borrow(Deadline deadline, bool fresh) {
  std::vector<std::unique_ptr<Connection>> dead;  // closed outside the lock
  std::unique_lock lock(mu_);
  for (;;) {
    if (fresh && open_ >= size_ && !idle_.empty()) {
      dead.push_back(std::move(idle_.front()));  // the one idle the longest
      idle_.erase(idle_.begin());
      --open_;
    }
    while (!fresh && !idle_.empty()) {
      std::unique_ptr<Connection> c = std::move(idle_.back());
      idle_.pop_back();
      if (c->alive_when_idle()) {
        lock.unlock();
        dead.clear();
        return Lease(*this, std::move(c));
      }
      --open_;
      dead.push_back(std::move(c));
    }
    if (open_ < size_) {
      ++open_;
      lock.unlock();
      dead.clear();
      try {
        return Lease(*this, opener_(deadline));
      } catch (...) {
        lock.lock();
        --open_;
        lock.unlock();
        freed_.notify_one();
        throw;
      }
    }
    if (freed_.wait_until(lock, deadline) == std::cv_status::timeout && (fresh || idle_.empty()) &&
        open_ >= size_) {
      throw StoreUnavailable(store_, "timed out after " + std::to_string(timeout_.count()) +
                                         " ms waiting for a free connection (all " +
                                         std::to_string(size_) + " of the pool are in use)");
    }
  }
}

void Pool::give_back(std::unique_ptr<Connection> c) noexcept {
  {
    std::lock_guard lock(mu_);
    if (c->usable()) {
      try {
        idle_.push_back(std::move(c));
      } catch (const std::bad_alloc&) {
        --open_;  // out of memory: close it instead of keeping it
      }
    } else {
      --open_;
    }
  }
  freed_.notify_one();
  // A dropped connection (if any) is closed here, outside the lock.
}

}  // namespace idem::postgres
