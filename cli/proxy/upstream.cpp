#include "net.h"
#include "upstream.h"

#include <sys/socket.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

namespace idem::proxy {
using Failure = UpstreamResult::Failure;

namespace {

// Upstream answers may carry more header than clients usually send.
constexpr std::uint32_t kResponseHeaderLimit = 64 * 1024;

struct Connection {
  explicit Connection(asio::io_context& ioc) : stream(asio::make_strand(ioc)) {}
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  SteadyClock::time_point idle_since{};

  // Whether the upstream closed (or wrote to) this idle connection: a kept-alive
  // connection that is readable while idle is of no further use.
  bool looks_closed() {
    if (buffer.size() != 0) return true;
    char byte = 0;
    ssize_t n = ::recv(stream.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
  }
  void close() {
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.socket().close(ignored);
  }
};

}  // namespace

struct UpstreamPool::Impl : std::enable_shared_from_this<UpstreamPool::Impl> {
  Impl(asio::io_context& ioc, tcp::resolver::results_type endpoints, const ProxyOptions& options)
      : ioc(ioc), endpoints(std::move(endpoints)), options(options) {}

  asio::io_context& ioc;
  const tcp::resolver::results_type endpoints;
  const ProxyOptions options;

  std::mutex mu;
  std::vector<std::unique_ptr<Connection>> idle;  // most recently used last
  std::deque<std::shared_ptr<UpstreamCall>> waiters;
  std::size_t open = 0;
  bool closing = false;

  // Gives `call` a kept-alive connection, a new one, or a place in the queue.
  void acquire(const std::shared_ptr<UpstreamCall>& call);
  // Takes a connection back from a call that is done with it.
  void give_back(std::unique_ptr<Connection> conn, bool reusable);
  // Takes a waiter off the queue; returns whether it was there.
  bool remove_waiter(const UpstreamCall* call);
};

class UpstreamCall : public std::enable_shared_from_this<UpstreamCall> {
 public:
  UpstreamCall(std::shared_ptr<UpstreamPool::Impl> pool, Request request, bool repeatable,
               UpstreamCallback done)
      : pool_(std::move(pool)),
        request_(std::move(request)),
        repeatable_(repeatable),
        deadline_(SteadyClock::now() + pool_->options.upstream_timeout),
        done_(std::move(done)) {}

  SteadyClock::time_point deadline() const { return deadline_; }

  // Called by the pool (under its lock, so only posts).
  void start_reused(std::unique_ptr<Connection> conn) {
    std::lock_guard<std::mutex> lock(conn_mu_);
    conn_ = std::move(conn);
    reused_ = true;
    asio::post(conn_->stream.get_executor(), [self = shared_from_this()] { self->write(); });
  }
  void start_new() {
    std::lock_guard<std::mutex> lock(conn_mu_);
    conn_ = std::make_unique<Connection>(pool_->ioc);
    reused_ = false;
    asio::post(conn_->stream.get_executor(), [self = shared_from_this()] { self->connect(); });
  }
  // Runs `done` with a failure without ever having had a connection (queue timeout, cancel).
  void fail_unconnected(Failure failure, std::string detail) {
    finish(failure, std::move(detail), /*reusable=*/false);
  }

  void cancel() {
    cancelled_.store(true);
    std::shared_ptr<UpstreamCall> self = shared_from_this();
    if (pool_->remove_waiter(this)) {
      fail_unconnected(Failure::kCancelled, "the proxy is shutting down");
      return;
    }
    std::lock_guard<std::mutex> lock(conn_mu_);
    if (conn_) {
      // Cancelled on the connection's strand, and only if the call still uses it.
      Connection* target = conn_.get();
      asio::post(conn_->stream.get_executor(), [self, target] {
        std::lock_guard<std::mutex> inner(self->conn_mu_);
        if (self->conn_.get() == target) self->conn_->stream.cancel();
      });
    }
  }

 private:
  void connect() {
    if (cancelled_) return finish(Failure::kCancelled, "the proxy is shutting down", false);
    auto now = SteadyClock::now();
    auto connect_deadline = std::min(deadline_, now + pool_->options.connect_timeout);
    conn_->stream.expires_after(connect_deadline - now);
    conn_->stream.async_connect(
        pool_->endpoints, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
          if (ec) {
            const bool timed_out = ec == beast::error::timeout;
            return self->finish(self->cancelled_ ? Failure::kCancelled : Failure::kConnect,
                                timed_out ? "connecting to the upstream timed out"
                                          : "could not connect to the upstream: " + ec.message(),
                                false);
          }
          self->write();
        });
  }

  void write() {
    if (cancelled_) return finish(Failure::kCancelled, "the proxy is shutting down", false);
    auto now = SteadyClock::now();
    if (now >= deadline_) {
      return finish(Failure::kTimeout, "no upstream connection was free in time", false);
    }
    conn_->stream.expires_after(deadline_ - now);
    http::async_write(conn_->stream, request_,
                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        if (ec) return self->failed(ec, /*wrote=*/false);
                        self->read();
                      });
  }

  void read() {
    parser_.emplace();
    parser_->body_limit(pool_->options.max_response_body);
    parser_->header_limit(kResponseHeaderLimit);
    if (request_.method() == http::verb::head) parser_->skip(true);
    http::async_read(conn_->stream, conn_->buffer, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       if (ec) return self->failed(ec, /*wrote=*/true);
                       unsigned status = self->parser_->get().result_int();
                       // An interim answer (103 Early Hints, a stray 100): the real one follows.
                       if (status >= 100 && status < 200 && status != 101) return self->read();
                       self->succeeded();
                     });
  }

  void failed(beast::error_code ec, bool wrote) {
    if (cancelled_) return finish(Failure::kCancelled, "the proxy is shutting down", false);
    if (ec == beast::error::timeout) {
      return finish(Failure::kTimeout, "the upstream did not answer in time", false);
    }
    if (ec == http::error::body_limit) {
      return finish(Failure::kTooLarge,
                    "the upstream's answer is larger than the limit of " +
                        std::to_string(pool_->options.max_response_body) + " bytes",
                    false);
    }
    // A kept-alive connection the upstream closed just before our request arrived: nothing
    // was answered, so a request that may be repeated goes again on a fresh connection.
    const bool nothing_answered = !wrote || (parser_ && !parser_->got_some());
    if (reused_ && nothing_answered && repeatable_ && !retried_) {
      retried_ = true;
      conn_->close();
      {
        std::lock_guard<std::mutex> lock(conn_mu_);
        conn_ = std::make_unique<Connection>(pool_->ioc);
      }
      reused_ = false;
      asio::post(conn_->stream.get_executor(), [self = shared_from_this()] { self->connect(); });
      return;
    }
    if (ec.category() == http::make_error_code(http::error::bad_version).category() && ec != http::error::end_of_stream &&
        ec != http::error::partial_message) {
      return finish(Failure::kBadResponse,
                    "the upstream's answer is not valid HTTP/1.1: " + ec.message(), false);
    }
    return finish(Failure::kBroken,
                  "the upstream connection broke before the whole answer arrived: " + ec.message(),
                  false);
  }

  void succeeded() {
    const bool reusable = parser_->keep_alive();
    response_ = parser_->release();
    finish(Failure::kNone, {}, reusable);
  }

  void finish(Failure failure, std::string detail, bool reusable) {
    std::unique_ptr<Connection> conn;
    {
      std::lock_guard<std::mutex> lock(conn_mu_);
      conn = std::move(conn_);
    }
    if (conn) {
      conn->stream.expires_never();
      if (!reusable) conn->close();
      pool_->give_back(std::move(conn), reusable);
    }
    UpstreamResult result;
    result.failure = failure;
    result.detail = std::move(detail);
    if (failure == Failure::kNone) result.response = std::move(response_);
    UpstreamCallback done = std::move(done_);
    if (done) done(std::move(result));
  }

  std::shared_ptr<UpstreamPool::Impl> pool_;
  Request request_;
  const bool repeatable_;
  const SteadyClock::time_point deadline_;
  UpstreamCallback done_;

  // Guards conn_ against cancel() from another thread; the call's own steps run one at a
  // time on the connection's strand.
  std::mutex conn_mu_;
  std::unique_ptr<Connection> conn_;
  std::optional<http::response_parser<http::string_body>> parser_;
  Response response_;
  bool reused_ = false;
  bool retried_ = false;
  std::atomic<bool> cancelled_{false};
};

void UpstreamPool::Impl::acquire(const std::shared_ptr<UpstreamCall>& call) {
  std::vector<std::unique_ptr<Connection>> stale;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto now = SteadyClock::now();
    bool started = false;
    while (!idle.empty()) {
      std::unique_ptr<Connection> conn = std::move(idle.back());
      idle.pop_back();
      if (now - conn->idle_since > options.upstream_idle || conn->looks_closed()) {
        --open;
        stale.push_back(std::move(conn));
        continue;
      }
      call->start_reused(std::move(conn));
      started = true;
      break;
    }
    if (!started) {
      if (open < options.upstream_connections) {
        ++open;
        call->start_new();
      } else {
        waiters.push_back(call);
      }
    }
  }
  for (auto& conn : stale) conn->close();
}

void UpstreamPool::Impl::give_back(std::unique_ptr<Connection> conn, bool reusable) {
  std::vector<std::shared_ptr<UpstreamCall>> expired;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto now = SteadyClock::now();
    if (reusable && closing) {
      conn->close();
      reusable = false;
    }
    if (!reusable) {
      // The connection is closed; its place goes to the first waiter still in time.
      --open;
      conn.reset();
    }
    while (!waiters.empty()) {
      std::shared_ptr<UpstreamCall> next = std::move(waiters.front());
      waiters.pop_front();
      if (now >= next->deadline()) {
        expired.push_back(std::move(next));
        continue;
      }
      if (conn) {
        next->start_reused(std::move(conn));
      } else {
        ++open;
        next->start_new();
      }
      break;
    }
    if (conn) {
      conn->idle_since = now;
      idle.push_back(std::move(conn));
    }
  }
  for (auto& call : expired) {
    call->fail_unconnected(Failure::kTimeout, "no upstream connection was free in time");
  }
}

bool UpstreamPool::Impl::remove_waiter(const UpstreamCall* call) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = waiters.begin(); it != waiters.end(); ++it) {
    if (it->get() == call) {
      waiters.erase(it);
      return true;
    }
  }
  return false;
}

UpstreamPool::UpstreamPool(asio::io_context& ioc, tcp::resolver::results_type endpoints,
                           const ProxyOptions& options)
    : impl_(std::make_shared<Impl>(ioc, std::move(endpoints), options)) {}

UpstreamPool::~UpstreamPool() { close_idle(); }

std::shared_ptr<UpstreamCall> UpstreamPool::send(Request request, bool repeatable,
                                                 UpstreamCallback done) {
  auto call = std::make_shared<UpstreamCall>(impl_, std::move(request), repeatable, std::move(done));
  impl_->acquire(call);
  return call;
}

void UpstreamPool::cancel(const std::shared_ptr<UpstreamCall>& call) {
  if (call) call->cancel();
}

void UpstreamPool::close_idle() {
  std::vector<std::unique_ptr<Connection>> idle;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->closing = true;
    idle.swap(impl_->idle);
    impl_->open -= idle.size();
  }
  for (auto& conn : idle) conn->close();
}

}  // namespace idem::proxy
