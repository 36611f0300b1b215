#include "server.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "admin.h"
#include "core.h"
#include "exchange.h"
#include "idem/error.h"
#include "idem/executor.h"
#include "identity.h"
#include "messages.h"
#include "net.h"
#include "notify.h"
#include "record.h"
#include "session.h"

namespace idem::proxy {

namespace {

// After drain_timeout, how long cancelled requests get to end and answer.
constexpr Duration kAbortGrace{5000};

ExecutorOptions executor_options(const ProxyOptions& o, ExecutorMetrics& metrics) {
  ExecutorOptions e;
  e.lease = o.lease;
  e.on_event = metrics.hook();
  // Each route's max_record is checked before complete; the executor takes what SPEC §10
  // allows.
  e.max_payload = kMaxPayloadBytes;
  return e;
}

std::string shown_address(const tcp::endpoint& e) {
  const std::string address = e.address().to_string();
  return (e.address().is_v6() ? "[" + address + "]" : address) + ":" + std::to_string(e.port());
}

}  // namespace

Server::Core::Core(ProxyOptions opts, std::shared_ptr<Store> raw_store, Logger log)
    : options(std::move(opts)),
      logger(std::move(log)),
      ioc(static_cast<int>(std::max(1u, options.io_threads))),
      work(asio::make_work_guard(ioc)),
      store_pool(std::max(1u, options.store_threads)),
      store(std::make_shared<TimedStore>(std::move(raw_store), metrics)),
      executor(store, executor_options(options, executor_metrics)),
      acceptor(ioc),
      signals(ioc),
      drain_timer(ioc),
      watchdog_timer(ioc) {}

// One client connection. Its steps run one at a time on the connection's strand; store
// calls go to the store pool and come back to the strand.
//
// A request with a key is read whole (its body joins the fingerprint) and goes through the
// executor; any other request streams to the upstream as it arrives. Either way the answer
// streams back to the client as it arrives; for a keyed request the end of the answer goes
// out only once it is recorded, so a client that saw the whole answer always finds the
// record (SPEC §13).

namespace {

// The answer to a client beyond max_connections, written without a session.
void refuse_connection(tcp::socket socket) {
  auto stream = std::make_shared<beast::tcp_stream>(std::move(socket));
  auto res = std::make_shared<Response>(problem(503, "too-many-connections",
                                                "the proxy has as many client connections open "
                                                "as it is allowed; retry later"));
  res->version(11);
  res->keep_alive(false);
  res->set(http::field::retry_after, "1");
  res->prepare_payload();
  stream->expires_after(std::chrono::seconds(5));
  http::async_write(*stream, *res, [stream, res](beast::error_code, std::size_t) {
    beast::error_code ignored;
    stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
  });
}

}  // namespace

namespace {

// Keys abandoned recently, at most: beyond it a 409 for such a key says only what a request
// usually takes (the duplicate then simply asks again sooner).
constexpr std::size_t kMaxHeldKeys = 100'000;

std::string held_id(std::string_view scope, std::string_view key) {
  std::string id(scope);
  id += '\0';
  id += key;
  return id;
}

}  // namespace

void Server::Core::observe(SteadyClock::duration took) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(took).count();
  // An exponentially weighted average (1/8 per sample); a lost update under a race only
  // skips a sample.
  const std::int64_t old = typical_us.load(std::memory_order_relaxed);
  typical_us.store(old == 0 ? us : old + (us - old) / 8, std::memory_order_relaxed);
}

void Server::Core::note_held(std::string_view scope, std::string_view key) {
  const auto now = SteadyClock::now();
  std::lock_guard<std::mutex> lock(held_mu);
  if (held.size() >= kMaxHeldKeys) {
    std::erase_if(held, [now](const auto& entry) { return entry.second <= now; });
    if (held.size() >= kMaxHeldKeys) return;
  }
  held[held_id(scope, key)] = now + options.lease;
}

void Server::Core::forget_held(std::string_view scope, std::string_view key) {
  std::lock_guard<std::mutex> lock(held_mu);
  if (!held.empty()) held.erase(held_id(scope, key));
}

Duration Server::Core::retry_after_for(std::string_view scope, std::string_view key,
                                       Duration lease_remaining) {
  {
    std::lock_guard<std::mutex> lock(held_mu);
    auto it = held.find(held_id(scope, key));
    if (it != held.end()) {
      if (it->second > SteadyClock::now()) return lease_remaining;  // it frees up then
      held.erase(it);
    }
  }
  const auto typical = std::chrono::ceil<Duration>(
      std::chrono::microseconds(typical_us.load(std::memory_order_relaxed)));
  return std::clamp(typical, Duration{1000}, std::max(lease_remaining, Duration{1000}));
}

std::uint64_t Server::Core::remember(const std::shared_ptr<Drainable>& d, bool connection) {
  std::lock_guard<std::mutex> lock(live_mu);
  std::uint64_t id = ++next_live;
  live.emplace(id, d);
  if (connection) ++connections;
  return id;
}

void Server::Core::forget(std::uint64_t id, bool connection) {
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(live_mu);
    live.erase(id);
    if (connection) --connections;
    last = live.empty() && draining && !drained;
    if (last) drained = true;
  }
  if (last) asio::post(ioc, [self = shared_self()] { self->finish(); });
}

std::vector<std::shared_ptr<Drainable>> Server::Core::live_now() {
  std::vector<std::shared_ptr<Drainable>> out;
  std::lock_guard<std::mutex> lock(live_mu);
  for (auto& [id, weak] : live) {
    if (auto d = weak.lock()) out.push_back(std::move(d));
  }
  return out;
}

void Server::Core::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (draining) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      // Out of descriptors or similar: say so, and try again shortly rather than spin.
      logger.error("accept failed: " + ec.message());
      auto timer = std::make_shared<asio::steady_timer>(ioc, std::chrono::milliseconds(50));
      return timer->async_wait([this, timer](beast::error_code) { accept(); });
    }
    std::size_t open = 0;
    {
      std::lock_guard<std::mutex> lock(live_mu);
      open = connections;
    }
    if (open >= options.max_connections) {
      refuse_connection(std::move(socket));
    } else {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      start_session(shared_self(), std::move(socket));
    }
    accept();
  });
}

void Server::Core::watchdog(std::chrono::microseconds interval) {
  std::lock_guard<std::mutex> lock(timers_mu);
  if (finished) return;
  notify::watchdog();
  watchdog_timer.expires_after(interval);
  watchdog_timer.async_wait([this, interval](beast::error_code ec) {
    if (!ec) watchdog(interval);
  });
}

void Server::Core::start_drain(const std::string& why) {
  if (draining.exchange(true)) return;
  notify::stopping(why + ": draining");
  beast::error_code ignored;
  acceptor.close(ignored);
  signals.cancel(ignored);
  std::vector<std::shared_ptr<Drainable>> now = live_now();
  logger.info(why + ": stopped accepting; finishing " + std::to_string(now.size()) +
              " connection(s) and late answer(s) (at most " +
              std::to_string(options.drain_timeout.count()) + " ms)");
  for (auto& d : now) d->drain();
  {
    std::lock_guard<std::mutex> lock(live_mu);
    if (live.empty() && !drained) {
      drained = true;
      asio::post(ioc, [this] { finish(); });
      return;
    }
  }
  std::lock_guard<std::mutex> lock(timers_mu);
  if (finished) return;  // the last connection ended meanwhile
  drain_timer.expires_after(options.drain_timeout);
  drain_timer.async_wait([this](beast::error_code ec) {
    if (ec) return;  // finish() cancelled it: everything ended in time
    abort_all();
  });
}

void Server::Core::abort_all() {
  std::vector<std::shared_ptr<Drainable>> now = live_now();
  logger.warn("drain timeout: cancelling " + std::to_string(now.size()) +
              " request(s); keys whose request may have reached the upstream stay held until their "
              "leases run out");
  for (auto& d : now) d->abort();
  std::lock_guard<std::mutex> lock(timers_mu);
  if (finished) return;
  drain_timer.expires_after(kAbortGrace);
  drain_timer.async_wait([this](beast::error_code ec) {
    if (ec) return;
    logger.warn("requests still open after the grace period; stopping");
    ioc.stop();
  });
}

void Server::Core::finish() {
  {
    std::lock_guard<std::mutex> lock(timers_mu);
    finished = true;
    drain_timer.cancel();
    watchdog_timer.cancel();
  }
  if (upstream) upstream->close_idle();
  if (admin) admin->close();
  work.reset();
}

Server::Server(ProxyOptions options, std::shared_ptr<Store> store, Logger log)
    : core_(std::make_shared<Core>(std::move(options), std::move(store), std::move(log))) {}

Server::~Server() = default;

void Server::run() {
  Core& core = *core_;
  const ProxyOptions& o = core.options;

  tcp::resolver resolver(core.ioc);
  beast::error_code ec;
  auto endpoints = resolver.resolve(o.upstream_host, std::to_string(o.upstream_port), ec);
  if (ec) {
    throw std::invalid_argument("cannot resolve the upstream host \"" + o.upstream_host +
                                "\": " + ec.message());
  }
  core.upstream.emplace(core.ioc, std::move(endpoints), core.options);

  auto address = asio::ip::make_address(o.listen_address, ec);
  if (ec) throw std::invalid_argument("\"" + o.listen_address + "\" is not an IP address");
  tcp::endpoint endpoint(address, o.listen_port);
  auto fail = [&](const char* what) {
    if (ec) {
      throw std::system_error(ec, std::string("cannot listen on ") + o.listen_address + ":" +
                                      std::to_string(o.listen_port) + " (" + what + ")");
    }
  };
  core.acceptor.open(endpoint.protocol(), ec);
  fail("open");
  core.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  fail("SO_REUSEADDR");
  core.acceptor.bind(endpoint, ec);
  fail("bind");
  core.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  fail("listen");
  core.logger.info("listening on " + shown_address(core.acceptor.local_endpoint()) +
                   ", forwarding to http://" + o.upstream_host + ":" +
                   std::to_string(o.upstream_port) + ", store " + core.executor.store().describe());
  if (!o.admin_address.empty()) {
    core.admin = std::make_shared<Admin>(core_);
    tcp::endpoint admin = core.admin->listen(o.admin_address, o.admin_port);
    core.logger.info("admin listening on " + shown_address(admin) + " (/livez, /readyz, /metrics)");
    core.admin->accept();
  }
  if (o.purge) {
    // SPEC §8: expired records go in bounded batches, off the request path.
    core.purger.emplace(
        core.store,
        PurgerOptions{.interval = o.purge_interval, .on_error = [&core](const std::exception& e) {
                        core.logger.error("purging expired records failed", {{"error", e.what()}});
                      }});
    core.logger.info("purging expired records every " +
                     std::to_string(o.purge_interval.count() / 1000) + " s");
  }

  // systemd (Type=notify): ready now that both listeners are up.
  if (notify::requested()) {
    if (!notify::supported()) {
      core.logger.warn(
          "NOTIFY_SOCKET is set, but this build of idem cannot notify systemd (built without "
          "libsystemd): use Type=exec in the unit, or a build with IDEM_WITH_SYSTEMD=ON");
    }
    notify::ready("listening on " + shown_address(core.acceptor.local_endpoint()));
    if (auto interval = notify::watchdog_interval()) core.watchdog(*interval);
  }

  core.signals.add(SIGTERM);
  core.signals.add(SIGINT);
  core.signals.async_wait([&core](beast::error_code ec, int sig) {
    if (ec) return;
    core.start_drain(sig == SIGTERM ? "SIGTERM" : "SIGINT");
  });
  core.accept();

  std::vector<std::thread> threads;
  for (unsigned i = 1; i < std::max(1u, o.io_threads); ++i) {
    threads.emplace_back([&core] { core.ioc.run(); });
  }
  core.ioc.run();
  for (auto& t : threads) t.join();
  // Store calls still out (bounded by the store's own timeouts) finish before the executor
  // goes. Then whatever is still open ends its lease without a store call: a request that
  // may have reached the upstream leaves its key held (SPEC §13), one that never did
  // releases it.
  core.store_pool.join();
  for (auto& d : core.live_now()) d->abandon_unfinished();
  core.purger.reset();
  core.logger.info("stopped");
}

}  // namespace idem::proxy
