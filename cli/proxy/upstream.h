#pragma once

// The connections to the service behind the proxy: at most `upstream_connections` open at
// once, kept alive between requests (idle ones for at most `upstream_idle`), requests beyond
// the bound queued in order. Every exchange has one deadline (`upstream_timeout` from when
// it was asked for, queueing included); connecting has `connect_timeout` as well.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <memory>
#include <string>

#include "messages.h"
#include "options.h"

namespace idem::proxy {

struct UpstreamResult {
  enum class Failure {
    kNone,
    kConnect,      // could not connect (refused, unreachable, connect timeout)
    kTimeout,      // the exchange ran past upstream_timeout
    kBroken,       // the connection broke or closed before the whole answer arrived
    kTooLarge,     // the answer is larger than max_response_body
    kBadResponse,  // the upstream did not speak HTTP/1.1
    kCancelled,    // cancel() was called (graceful shutdown gave up waiting)
  };
  Failure failure = Failure::kNone;
  // What went wrong, for the problem answer and the log.
  std::string detail;
  // The answer, when failure is kNone.
  Response response;
};

// Runs once per send(), on an I/O thread.
using UpstreamCallback = std::function<void(UpstreamResult)>;

class UpstreamCall;

class UpstreamPool {
 public:
  // `endpoints`: the upstream's addresses, resolved once at start.
  UpstreamPool(boost::asio::io_context& ioc, boost::asio::ip::tcp::resolver::results_type endpoints,
               const ProxyOptions& options);
  ~UpstreamPool();
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;

  // Sends `request` and calls `done` with the answer or the failure, exactly once.
  // `repeatable`: the request may be sent again on a fresh connection when a kept-alive one
  // turns out to have been closed by the upstream before it answered a single byte (only
  // for methods that are idempotent by themselves; a keyed request is never repeated).
  // The returned call can be cancelled.
  std::shared_ptr<UpstreamCall> send(Request request, bool repeatable, UpstreamCallback done);

  // Ends a call early: `done` gets kCancelled unless the answer already arrived.
  static void cancel(const std::shared_ptr<UpstreamCall>& call);

  // Closes idle connections and refuses to keep more (shutdown).
  void close_idle();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace idem::proxy
