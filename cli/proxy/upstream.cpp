#include "upstream.h"

#include <sys/socket.h>

#include <boost/asio/post.hpp>
#include <cerrno>

namespace idem::proxy {

bool Connection::looks_closed() {
  if (buffer.size() != 0) return true;
  char byte = 0;
  ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
}

void Connection::close() {
  beast::error_code ignored;
  socket.shutdown(tcp::socket::shutdown_both, ignored);
  socket.close(ignored);
}

struct UpstreamPool::Waiter {
  asio::any_io_executor executor;
  Ready ready;
};

namespace {

void hand_over(const std::shared_ptr<UpstreamPool::Waiter>& waiter,
               std::unique_ptr<Connection> conn) {
  asio::post(waiter->executor, [ready = std::move(waiter->ready),
                                conn = std::move(conn)]() mutable { ready(std::move(conn)); });
}

}  // namespace

UpstreamPool::UpstreamPool(asio::io_context& ioc, tcp::resolver::results_type endpoints,
                           const ProxyOptions& options)
    : ioc_(ioc), endpoints_(std::move(endpoints)), options_(options) {}

UpstreamPool::~UpstreamPool() { close_idle(); }

std::shared_ptr<UpstreamPool::Waiter> UpstreamPool::acquire(asio::any_io_executor executor,
                                                            Ready ready) {
  auto waiter = std::make_shared<Waiter>(Waiter{std::move(executor), std::move(ready)});
  std::vector<std::unique_ptr<Connection>> stale;
  std::unique_ptr<Connection> conn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = SteadyClock::now();
    while (!idle_.empty()) {
      std::unique_ptr<Connection> candidate = std::move(idle_.back());
      idle_.pop_back();
      if (now - candidate->idle_since > options_.upstream_idle || candidate->looks_closed()) {
        --open_;
        stale.push_back(std::move(candidate));
        continue;
      }
      conn = std::move(candidate);
      break;
    }
    if (!conn) {
      if (open_ < options_.upstream_connections) {
        ++open_;
        conn = std::make_unique<Connection>(ioc_);
      } else {
        waiters_.push_back(waiter);
      }
    }
  }
  for (auto& c : stale) c->close();
  if (conn) hand_over(waiter, std::move(conn));
  return waiter;
}

bool UpstreamPool::cancel(const std::shared_ptr<Waiter>& waiter) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
    if (*it == waiter) {
      waiters_.erase(it);
      return true;
    }
  }
  return false;
}

void UpstreamPool::give_back(std::unique_ptr<Connection> conn, bool reusable) {
  std::shared_ptr<Waiter> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn && (!reusable || closing_ || !conn->connected)) {
      conn->close();
      conn.reset();
    }
    if (!conn) {
      // Its place goes to the first waiter, as a new connection.
      --open_;
      if (!waiters_.empty()) {
        ++open_;
        conn = std::make_unique<Connection>(ioc_);
      }
    }
    if (!waiters_.empty()) {
      next = std::move(waiters_.front());
      waiters_.pop_front();
    } else if (conn) {
      conn->idle_since = SteadyClock::now();
      idle_.push_back(std::move(conn));
    }
  }
  if (next) hand_over(next, std::move(conn));
}

void UpstreamPool::close_idle() {
  std::vector<std::unique_ptr<Connection>> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    idle.swap(idle_);
    open_ -= idle.size();
  }
  for (auto& conn : idle) conn->close();
}

}  // namespace idem::proxy
