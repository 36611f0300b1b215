#pragma once

// The admin listener (--admin ADDR:PORT), apart from the proxied port so that probes and
// scrapes never queue behind client traffic and the port can stay private:
//
//   GET /livez    200 while the proxy's I/O threads serve (liveness)
//   GET /readyz   200 when the store answers a read and the proxy is not draining, else 503
//                 (readiness: a load balancer sends it nothing meanwhile)
//   GET /metrics  the Prometheus text format: requests by outcome, store and upstream latency
//                 histograms, the executor's counters (idem::ExecutorMetrics)

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core.h"

namespace idem::proxy {

class AdminSession;

class Admin : public std::enable_shared_from_this<Admin> {
 public:
  explicit Admin(std::shared_ptr<Core> core);
  // Binds and listens; returns the address bound (port 0 picks one). Throws
  // std::system_error when it cannot.
  tcp::endpoint listen(const std::string& address, std::uint16_t port);
  void accept();
  // Stops accepting and closes the connections open (when the proxy stops).
  void close();

 private:
  std::shared_ptr<Core> core_;
  tcp::acceptor acceptor_;
  std::mutex mu_;
  std::vector<std::weak_ptr<AdminSession>> sessions_;  // guarded by mu_
};

}  // namespace idem::proxy
