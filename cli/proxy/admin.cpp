#include "admin.h"

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <system_error>

#include "idem/metrics.h"
#include "messages.h"

namespace idem::proxy {

namespace {

// The record a readiness probe reads: any read proves the store answers.
constexpr std::string_view kProbeScope = "idem-proxy";
constexpr std::string_view kProbeKey = "readiness-probe";

}  // namespace

class AdminSession : public std::enable_shared_from_this<AdminSession> {
 public:
  AdminSession(std::shared_ptr<Core> core, tcp::socket socket)
      : core_(std::move(core)), stream_(std::move(socket)) {}

  // Ends the connection (the proxy stops), on its strand.
  void end() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] { self->close(); });
  }

  void read() {
    parser_.emplace();
    parser_->header_limit(8 * 1024);
    parser_->body_limit(0);
    stream_.expires_after(std::chrono::seconds(30));
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       if (ec) return self->close();
                       self->handle(self->parser_->release());
                     });
  }

 private:
  void handle(http::request<http::empty_body> req) {
    req_ = std::move(req);
    if (req_.method() != http::verb::get && req_.method() != http::verb::head) {
      return reply(http::status::method_not_allowed, "GET only\n");
    }
    const std::string_view target = req_.target();
    const std::string_view path = target.substr(0, target.find('?'));
    if (path == "/livez") return reply(http::status::ok, "ok\n");
    if (path == "/metrics") {
      std::size_t connections = 0, live = 0;
      {
        std::lock_guard<std::mutex> lock(core_->live_mu);
        connections = core_->connections;
        live = core_->live.size();
      }
      std::string body = core_->metrics.prometheus(connections, live - std::min(live, connections),
                                                   core_->executor.active_leases());
      body += core_->executor_metrics.prometheus("idem");
      return reply(http::status::ok, std::move(body), "text/plain; version=0.0.4; charset=utf-8");
    }
    if (path == "/readyz") {
      if (core_->draining) return reply(http::status::service_unavailable, "draining\n");
      return core_->on_store([self = shared_from_this()] {
        std::string error;
        try {
          (void)self->core_->executor.store().get(kProbeScope, kProbeKey);
        } catch (const std::exception& e) {
          error = e.what();
        }
        asio::post(self->stream_.get_executor(), [self, error = std::move(error)] {
          if (error.empty()) return self->reply(http::status::ok, "ready\n");
          self->core_->logger.error("readiness: the store does not answer", {{"error", error}});
          self->reply(http::status::service_unavailable, "store unavailable\n");
        });
      });
    }
    reply(http::status::not_found, "not found: /livez, /readyz, /metrics\n");
  }

  void reply(http::status status, std::string body,
             const char* type = "text/plain; charset=utf-8") {
    res_ = {};
    res_.result(status);
    res_.version(req_.version());
    res_.set(http::field::content_type, type);
    res_.set(http::field::cache_control, "no-store");
    res_.set(http::field::date, http_date(std::chrono::system_clock::now()));
    res_.body() = std::move(body);
    res_.keep_alive(req_.keep_alive());
    res_.prepare_payload();
    if (req_.method() == http::verb::head) res_.body().clear();
    stream_.expires_after(std::chrono::seconds(30));
    http::async_write(stream_, res_,
                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        if (ec || !self->res_.keep_alive()) return self->close();
                        self->read();
                      });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  std::shared_ptr<Core> core_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> parser_;
  http::request<http::empty_body> req_;
  http::response<http::string_body> res_;
};

Admin::Admin(std::shared_ptr<Core> core) : core_(std::move(core)), acceptor_(core_->ioc) {}

tcp::endpoint Admin::listen(const std::string& address, std::uint16_t port) {
  beast::error_code ec;
  tcp::endpoint endpoint(asio::ip::make_address(address, ec), port);
  auto fail = [&](const char* what) {
    if (ec) {
      throw std::system_error(ec, "cannot listen on " + address + ":" + std::to_string(port) +
                                      " for --admin (" + what + ")");
    }
  };
  fail("address");
  acceptor_.open(endpoint.protocol(), ec);
  fail("open");
  acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  fail("SO_REUSEADDR");
  acceptor_.bind(endpoint, ec);
  fail("bind");
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  fail("listen");
  return acceptor_.local_endpoint();
}

void Admin::accept() {
  acceptor_.async_accept(
      asio::make_strand(core_->ioc),
      [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
        if (ec) {
          if (ec == asio::error::operation_aborted) return;
          return self->accept();
        }
        auto session = std::make_shared<AdminSession>(self->core_, std::move(socket));
        {
          std::lock_guard<std::mutex> lock(self->mu_);
          std::erase_if(self->sessions_, [](const auto& weak) { return weak.expired(); });
          self->sessions_.push_back(session);
        }
        session->read();
        self->accept();
      });
}

void Admin::close() {
  asio::post(acceptor_.get_executor(), [self = shared_from_this()] {
    beast::error_code ignored;
    self->acceptor_.close(ignored);
    std::lock_guard<std::mutex> lock(self->mu_);
    for (auto& weak : self->sessions_) {
      if (auto session = weak.lock()) session->end();
    }
    self->sessions_.clear();
  });
}

}  // namespace idem::proxy
