#pragma once

// The connections to the service behind the proxy: at most `upstream_connections` open at
// once, kept alive between requests (idle ones for at most `upstream_idle`), requests beyond
// the bound queued in order. The pool only hands connections out and takes them back; an
// Exchange (exchange.h) does the I/O on the strand of the request that holds one.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "net.h"
#include "options.h"

namespace idem::proxy {

// One connection to the upstream. Its socket lives on the io_context's own executor (no
// strand): only the request that holds it starts operations on it, and their handlers run
// on that request's strand.
struct Connection {
  explicit Connection(asio::io_context& ioc) : socket(ioc) {}
  tcp::socket socket;
  beast::flat_buffer buffer;
  // Whether it is connected (a new one from the pool is not: its holder connects it).
  bool connected = false;
  SteadyClock::time_point idle_since{};

  // Whether the upstream closed (or wrote to) this idle connection: a kept-alive
  // connection that is readable while idle is of no further use.
  bool looks_closed();
  void close();
};

class UpstreamPool {
 public:
  // Called with the connection, on the executor given to acquire().
  using Ready = std::function<void(std::unique_ptr<Connection>)>;
  struct Waiter;

  // `endpoints`: the upstream's addresses, resolved once at start.
  UpstreamPool(asio::io_context& ioc, tcp::resolver::results_type endpoints,
               const ProxyOptions& options);
  ~UpstreamPool();
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;

  const tcp::resolver::results_type& endpoints() const { return endpoints_; }

  // Hands `ready` a kept-alive connection, a new unconnected one (when fewer than
  // upstream_connections are open), or queues it until one is given back. `ready` runs on
  // `executor`, exactly once unless cancel() takes the waiter off the queue first.
  std::shared_ptr<Waiter> acquire(asio::any_io_executor executor, Ready ready);
  // Takes a waiter off the queue; false when it already got its connection (then `ready`
  // runs, and its holder must give the connection back).
  bool cancel(const std::shared_ptr<Waiter>& waiter);
  // Takes a connection back: kept for reuse when `reusable` (the answer was read whole and
  // the upstream keeps it alive), else closed; either way the next waiter gets one.
  void give_back(std::unique_ptr<Connection> conn, bool reusable);

  // Closes idle connections and refuses to keep more (shutdown).
  void close_idle();

 private:
  asio::io_context& ioc_;
  const tcp::resolver::results_type endpoints_;
  const ProxyOptions& options_;

  std::mutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_;  // most recently used last
  std::deque<std::shared_ptr<Waiter>> waiters_;
  std::size_t open_ = 0;
  bool closing_ = false;
};

}  // namespace idem::proxy
