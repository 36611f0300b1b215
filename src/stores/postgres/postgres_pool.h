#pragma once

// The PostgreSQL store's connection pool: safe for many threads, at most `size` connections,
// opened on demand and kept while healthy. A connection that failed in a way that leaves it
// unusable is dropped when it is returned; an idle one the server closed (a restart, an
// administrator's pg_terminate_backend) is noticed when it is borrowed, dropped, and
// replaced, so calls after a server restart succeed without the caller doing anything.

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "stores/postgres/postgres_connection.h"

namespace idem::postgres {

class Pool {
 public:
  using Opener = std::function<std::unique_ptr<Connection>(Deadline)>;

  // `open` makes a ready connection (statements prepared) or throws StoreUnavailable.
  Pool(std::size_t size, Opener open, std::string store, Duration timeout);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // A connection lent to one caller; returned (or dropped, if unusable) when destroyed.
  class Lease {
   public:
    Lease(Pool& pool, std::unique_ptr<Connection> c) : pool_(&pool), c_(std::move(c)) {}
    ~Lease();
    Lease(Lease&& other) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Connection& operator*() const { return *c_; }
    Connection* operator->() const { return c_.get(); }

   private:
    Pool* pool_;
    std::unique_ptr<Connection> c_;
  };

  // A healthy connection: an idle one, a new one while fewer than `size` are open, or the
  // next one returned. `fresh`: a new connection, closing an idle one to make room if
  // needed (for a call repeated after its connection was found dead: the idle ones may have
  // been closed by the same server timeout). Throws StoreUnavailable when none is free by
  // `deadline` or a new one cannot be opened.
  Lease borrow(Deadline deadline, bool fresh = false);
  // Adds a connection opened elsewhere (the store's first one) as idle.
  void adopt(std::unique_ptr<Connection> c);

  // Connections open now, lent or idle (for tests).
  std::size_t open_connections() const;

 private:
  void give_back(std::unique_ptr<Connection> c) noexcept;

  const std::size_t size_;
  const Opener opener_;
  const std::string store_;
  const Duration timeout_;

  mutable std::mutex mu_;
  std::condition_variable freed_;
  std::vector<std::unique_ptr<Connection>> idle_;  // most recently returned last
  std::size_t open_ = 0;                           // idle + lent + being opened
};

}  // namespace idem::postgres
