#pragma once

// The server stores a test runs on besides the embedded ones: each store this build
// includes whose server the test script started (the stores' TEST_SERVERS in their
// idem_define_store() calls, generated into idem_test_servers.inc: IDEM_TEST_POSTGRES_URL,
// IDEM_TEST_REDIS_URL), and on request the servers marked `pooler` (the PostgreSQL store
// again behind PgBouncer in transaction pooling, IDEM_TEST_PGBOUNCER_TX_URL). With
// IDEM_REQUIRE_SERVERS=1 a built store whose URL is missing throws, so the run fails instead of
// leaving that store's cases out.

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "idem/open_store.h"
#include "support/require_server.h"

namespace idem::testing {

// (name, URL) pairs, e.g. {"postgres", "postgresql://..."}; `with_poolers` adds
// {"postgres_pgbouncer", ...}, on a table of its own: the same test of the two cases often
// runs at once, and one's purge must not take the other's expired records.
inline std::vector<std::pair<std::string, std::string>> server_store_urls(
    bool with_poolers = false) {
  struct Server {
    const char* name;
    const char* env;
    bool pooler;
    const char* query;  // added to the URL
  };
  // Each built store's TEST_SERVERS (cmake/IdemStores.cmake).
  static constexpr Server kServers[] = {
#define IDEM_TEST_SERVER(name, env, pooler, query) {name, env, pooler, query},
#include "idem_test_servers.inc"
#undef IDEM_TEST_SERVER
      {nullptr, nullptr, false, nullptr}};
  const bool require = servers_required();
  std::vector<std::pair<std::string, std::string>> out;
  for (const Server& s : kServers) {
    if (s.name == nullptr) break;
    if (s.pooler && !with_poolers) continue;
    const char* url = std::getenv(s.env);
    if (url == nullptr || *url == '\0') {
      if (require) {
        throw std::runtime_error(std::string("IDEM_REQUIRE_SERVERS=1 but ") + s.env +
                                 " is not set");
      }
      continue;
    }
    std::string full = url;
    if (*s.query != '\0') {
      full += (full.find('?') == std::string::npos ? "?" : "&") + std::string(s.query);
    }
    out.emplace_back(s.name, full);
  }
  return out;
}

// The Redis store on Redis Cluster and over TLS (scripts/servers.sh: idem_start_redis_cluster,
// idem_start_redis_tls), as (name, URL) pairs, when this build includes the Redis store.
// Both URLs must be set: a run that asks for these stores without their servers fails.
inline std::vector<std::pair<std::string, std::string>> redis_topology_urls() {
  const std::vector<std::string> built = idem::available_schemes();
  if (std::find(built.begin(), built.end(), "redis+cluster") == built.end()) return {};
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, env] : {std::pair{"redis_cluster", "IDEM_TEST_REDIS_CLUSTER_URL"},
                                  std::pair{"redis_tls", "IDEM_TEST_REDIS_TLS_URL"}}) {
    const char* url = std::getenv(env);
    if (url == nullptr || *url == '\0') {
      throw std::runtime_error(std::string(env) + " is not set (scripts/servers.sh)");
    }
    out.emplace_back(name, url);
  }
  return out;
}

}  // namespace idem::testing
