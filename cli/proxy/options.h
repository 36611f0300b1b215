#pragma once

// What `idem proxy` is told on its command line (docs/proxy.md lists every option). A plain
// aggregate: cmd_proxy.cpp fills it, the server reads it.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <string>
#include <vector>

#include "idem/store.h"
#include "idem/types.h"

namespace idem::proxy {

using namespace std::chrono_literals;

// An inclusive range of HTTP status codes.
struct StatusRange {
  unsigned first = 0;
  unsigned last = 0;
  bool contains(unsigned status) const noexcept { return status >= first && status <= last; }
};

struct ProxyOptions {
  // Where to listen: an IPv4 or IPv6 address and a port (0: any free port, reported on
  // stderr once listening).
  std::string listen_address = "127.0.0.1";
  std::uint16_t listen_port = 0;
  // The service behind the proxy: http://HOST:PORT (no TLS, no path).
  std::string upstream_host;
  std::uint16_t upstream_port = 0;

  // Methods whose requests with an Idempotency-Key go through the executor (upper case).
  std::vector<std::string> methods = {"POST", "PATCH"};
  // Refuse (400) a request of those methods that has no Idempotency-Key.
  bool require_key = false;

  // Identity (SPEC §13). The scope is built from the method and path unless fixed_scope is
  // set; scope_header's value, when named and present, is put in front.
  std::string fixed_scope;
  std::string scope_header;
  // Put a digest of the caller's credentials in the scope: the Authorization header, else
  // the cookies named here. Off only with --no-credential-scope.
  bool credential_scope = true;
  std::vector<std::string> credential_cookies;
  // Request headers whose values join the fingerprint (method, target and body always do).
  std::vector<std::string> fingerprint_headers;

  // Upstream statuses that release the record instead of completing it (default: 5xx).
  std::vector<StatusRange> release_statuses = {{500, 599}};

  // The executor's lease and retention (SPEC §7).
  Duration lease = 30s;
  Duration ttl = 24h;
  // How long a duplicate of a request in flight waits for its answer; 0: 409 at once.
  Duration wait = Duration{0};

  // Largest request body accepted (413 above it).
  std::size_t max_request_body = 1024 * 1024;
  // Largest request header block accepted (431 above it).
  std::size_t max_request_header = 16 * 1024;
  // Largest upstream answer recorded (the encoded record: status, headers and body). A
  // larger answer is passed through once and the record released.
  std::size_t max_record = kDefaultMaxPayloadBytes;
  // Largest upstream answer the proxy passes at all (502 above it).
  std::size_t max_response_body = 64 * 1024 * 1024;

  // Timeouts. client_timeout bounds reading one request (headers and body) and writing one
  // answer; idle_timeout bounds a kept-alive client connection between requests;
  // upstream_timeout bounds one upstream exchange (connecting, sending, the whole answer);
  // upstream_idle bounds how long an idle upstream connection is kept for reuse;
  // drain_timeout bounds the graceful shutdown on SIGTERM or SIGINT.
  Duration client_timeout = 30s;
  Duration idle_timeout = 60s;
  Duration upstream_timeout = 60s;
  Duration connect_timeout = 5s;
  Duration upstream_idle = 4s;
  Duration drain_timeout = 30s;

  // Concurrency. io_threads run the HTTP side; store_threads make the store calls (which
  // block), so a slow store never stalls a connection that does not need it.
  unsigned io_threads = 2;
  unsigned store_threads = 4;
  // Most client connections open at once; the next one is answered 503 and closed.
  std::size_t max_connections = 10'000;
  // Most upstream connections open at once; requests beyond them queue.
  std::size_t upstream_connections = 64;

  // Log one line per request on stderr.
  bool access_log = false;
};

}  // namespace idem::proxy

namespace idem::proxy {

// Parsers for the option values that are not durations or sizes. Each throws
// std::invalid_argument saying what is wrong with the text.

// "127.0.0.1:8080", "[::1]:8080", "0.0.0.0:0".
void parse_listen(std::string_view text, ProxyOptions& options);
// "http://HOST:PORT" (a trailing "/" is allowed; no TLS, no path).
void parse_upstream(std::string_view text, ProxyOptions& options);
// "POST,PATCH": upper-cased, at least one.
std::vector<std::string> parse_methods(std::string_view text);
// "5xx", "500-599", "429", comma-separated; "none" for none.
std::vector<StatusRange> parse_statuses(std::string_view text);

}  // namespace idem::proxy
