#pragma once

// `idem proxy`'s HTTP server: accepts clients, forwards to the upstream through an
// UpstreamPool, and sends requests that carry an Idempotency-Key through the executor's
// begin / complete (SPEC §13, docs/proxy.md). The executor learns nothing about HTTP: a
// request's scope, key and fingerprint go in, and a recorded answer's bytes come out.
//
// Threads: `io_threads` run the sockets; every store call (begin, complete, release) runs on
// a pool of `store_threads`, because store calls block (an SQLite lock, a server round trip)
// and must not stall the connections that do not need the store.

#include <functional>
#include <memory>
#include <string>

#include "idem/store.h"
#include "log.h"
#include "options.h"

namespace idem::proxy {

class Server {
 public:
  // `log` writes the error log and, with options.access_log, the access log.
  Server(ProxyOptions options, std::shared_ptr<Store> store, Logger log);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Resolves the upstream, listens, logs "listening on ADDRESS:PORT", and serves until
  // SIGTERM or SIGINT. Then it stops accepting, lets requests in flight finish for up to
  // drain_timeout, cancels the rest (their records are released and their clients get 503),
  // and returns. Throws std::system_error when it cannot listen and std::invalid_argument
  // when the upstream's name does not resolve.
  void run();

  // The shared state of the server and its connections (server.cpp).
  struct Core;

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace idem::proxy
