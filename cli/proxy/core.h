#pragma once

// The state `idem proxy` shares between its listener, its client connections (Session, in
// server.cpp) and their upstream exchanges (exchange.h): the options, the executor, the
// store threads, the upstream pool, and the registry that the graceful shutdown walks.

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "idem/executor.h"
#include "idem/metrics.h"
#include "idem/purger.h"
#include "log.h"
#include "metrics.h"
#include "net.h"
#include "options.h"
#include "server.h"
#include "upstream.h"

namespace idem::proxy {

class Admin;
class Exchange;

// Something the graceful shutdown waits for and, when the drain runs out, aborts: a client
// connection, or an exchange that reads an upstream's late answer in the background.
class Drainable {
 public:
  virtual ~Drainable() = default;
  // The drain began: close now if there is nothing in flight.
  virtual void drain() = 0;
  // The drain ran out: give up what is in flight (an outcome the proxy cannot know).
  virtual void abort() = 0;
  // The I/O threads stopped with this still open (the grace after abort() ran out): end
  // its lease without a store call that could block. Only called when no other thread runs.
  virtual void abandon_unfinished() noexcept = 0;
};

struct Server::Core : std::enable_shared_from_this<Server::Core> {
  Core(ProxyOptions opts, std::shared_ptr<Store> store, Logger log);

  const ProxyOptions options;
  const Logger logger;
  ProxyMetrics metrics;
  ExecutorMetrics executor_metrics;
  asio::io_context ioc;
  // Keeps the I/O threads running while store calls are out on the pool; dropped when the
  // drain ends.
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  asio::thread_pool store_pool;
  // The store, timed into `metrics` (TimedStore), and the executor over it.
  std::shared_ptr<Store> store;
  Executor executor;
  std::optional<UpstreamPool> upstream;
  std::shared_ptr<Admin> admin;
  std::optional<Purger> purger;
  tcp::acceptor acceptor;
  asio::signal_set signals;
  // The two timers are armed and cancelled from several I/O threads (the signal's, the last
  // connection's, a timer's own handler), so only under timers_mu, and never again once
  // finished: a timer re-armed by a handler that ran beside finish() would keep the I/O
  // threads running, and the process alive, for ever.
  std::mutex timers_mu;
  bool finished = false;           // guarded by timers_mu
  asio::steady_timer drain_timer;  // guarded by timers_mu
  // Pings systemd's watchdog (WatchdogSec=) from the I/O threads.
  asio::steady_timer watchdog_timer;  // guarded by timers_mu

  std::mutex live_mu;
  std::unordered_map<std::uint64_t, std::weak_ptr<Drainable>> live;  // guarded by live_mu
  std::uint64_t next_live = 0;                                       // guarded by live_mu
  std::size_t connections = 0;  // client connections among `live`; guarded by live_mu
  std::atomic<std::int64_t> typical_us{0};
  std::mutex held_mu;
  std::unordered_map<std::string, SteadyClock::time_point> held;  // guarded by held_mu
  std::atomic<bool> draining{false};
  // Whether the log said once that answers setting cookies are not replayed.
  std::atomic<bool> warned_cookie{false};
  bool drained = false;  // guarded by live_mu

  // What the proxy observes of its keyed requests, for the Retry-After of a 409 (a lease's
  // time left says nothing of how long a request takes): a moving average of how long keyed
  // requests took, and the keys whose lease was abandoned (held until it runs out).
  void observe(SteadyClock::duration took);
  void note_held(std::string_view scope, std::string_view key);
  // A held key was taken over: it is an ordinary request in flight again.
  void forget_held(std::string_view scope, std::string_view key);
  // How long a duplicate of (scope, key) should wait, given the holder's lease time left.
  Duration retry_after_for(std::string_view scope, std::string_view key, Duration lease_remaining);

  // Registers a connection or a background exchange; returns its id for forget().
  std::uint64_t remember(const std::shared_ptr<Drainable>& d, bool connection);
  void forget(std::uint64_t id, bool connection);
  std::vector<std::shared_ptr<Drainable>> live_now();

  // Runs a store call: on the store pool, or inline on this I/O thread when the proxy runs
  // with --store-threads 0.
  template <typename F>
  void on_store(F&& f) {
    if (options.store_threads == 0) return f();
    asio::post(store_pool, std::forward<F>(f));
  }

  void accept();
  void watchdog(std::chrono::microseconds interval);
  void start_drain(const std::string& why);
  void abort_all();
  // Ends run(): nothing is left, or the grace after aborting ran out.
  void finish();
  std::shared_ptr<Core> shared_self() { return shared_from_this(); }
};

using Core = Server::Core;

}  // namespace idem::proxy
