#pragma once

// The clock a store judges expiry by (SPEC §6). The in-memory and SQLite stores take one so
// tests can move time; PostgreSQL and Redis use the server's clock instead.

#include <atomic>
#include <memory>

#include "idem/types.h"

namespace idem {

class Clock {
 public:
  virtual ~Clock() = default;
  // Safe to call from many threads at once.
  virtual Timestamp now() const = 0;
};

// The wall clock in milliseconds. Processes on one machine agree on it.
class SystemClock final : public Clock {
 public:
  Timestamp now() const override;
  static std::shared_ptr<SystemClock> instance();
};

// A clock that moves only when told to; for tests. Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(Timestamp start = Timestamp{std::chrono::hours(24 * 365 * 50)})
      : now_ms_(start.time_since_epoch().count()) {}

  Timestamp now() const override { return Timestamp{Duration{now_ms_.load()}}; }
  void advance(Duration d) { now_ms_.fetch_add(d.count()); }
  void set(Timestamp t) { now_ms_.store(t.time_since_epoch().count()); }

 private:
  std::atomic<Duration::rep> now_ms_;
};

}  // namespace idem
