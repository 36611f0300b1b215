#pragma once

// What `idem proxy` is told on its command line, its environment and its routes file
// (docs/proxy.md lists every option). Plain aggregates: cmd_proxy.cpp fills them, the server
// reads them.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
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
  bool operator==(const StatusRange&) const = default;
};

// What a key must look like, beyond SPEC §10's limits.
enum class KeyFormat {
  kAny,   // any structured-field string or token of 1 to 1024 bytes
  kUuid,  // a UUID in its 36-character text form (any version, either case)
};

// How the proxy's log lines are written.
enum class LogFormat {
  kLogfmt,  // key=value pairs, one line per event
  kJson,    // one JSON object per line
};

// What the proxy does for the requests of one route (docs/proxy.md, "Routes"). Every field
// has the value of the matching flag unless a route of the routes file sets it.
struct Policy {
  // Whether keyed requests of this route go through idem at all (false: pass through).
  bool protect = true;
  // Methods whose requests with a key go through the executor (upper case).
  std::vector<std::string> methods = {"POST", "PATCH"};
  // Refuse (400) a request of those methods that has no key.
  bool require_key = false;
  KeyFormat key_format = KeyFormat::kAny;
  // A fixed scope instead of "<METHOD> <path>" (SPEC §13).
  std::string fixed_scope;
  // How long a recorded answer is replayed (SPEC §8).
  Duration ttl = 24h;
  // Upstream statuses that say the request did not run: they release the record instead of
  // completing it (SPEC §13; by default 408, 429 and 5xx, as Stripe does).
  std::vector<StatusRange> release_statuses = {{408, 408}, {429, 429}, {500, 599}};
  // Largest answer recorded in full (the encoded record: status, headers and body). A larger
  // one is recorded as a marker (status and headers, no body): duplicates get 410
  // too-large-to-replay, never a second execution.
  std::size_t max_record = 4 * 1024 * 1024;
  // Release the record after an outcome the proxy cannot know (an upstream timeout, a
  // broken connection after the request was written, a drain that ran out), as idem did
  // before: only for upstreams known to be safe to run twice. Off: the key stays held
  // (SPEC §13).
  bool release_uncertain = false;
};

// A route of the routes file: requests whose path matches `path` get `policy`.
struct Route {
  // An exact path, or a glob: `*` matches within one path segment, `**` across segments.
  std::string path;
  Policy policy;
};

struct ProxyOptions {
  // Where to listen: an IPv4 or IPv6 address and a port (0: any free port, reported on
  // stderr once listening).
  std::string listen_address = "127.0.0.1";
  std::uint16_t listen_port = 0;
  // The service behind the proxy: http://HOST:PORT (no TLS, no path).
  std::string upstream_host;
  std::uint16_t upstream_port = 0;

  // The policy of requests no route matches, and the routes (first match wins).
  Policy policy;
  std::vector<Route> routes;

  // The request header that carries the key (the draft's name by default).
  std::string key_header = "Idempotency-Key";

  // Identity (SPEC §13). scope_header's value, when named and present, leads the scope.
  std::string scope_header;
  // Put a digest of the caller's credentials in the scope: the Authorization header, else
  // the cookies named here. Off only with --no-credential-scope.
  bool credential_scope = true;
  std::vector<std::string> credential_cookies;
  // Put the request's host in the scope, so virtual hosts never share records. Off only
  // with --no-host-scope.
  bool host_scope = true;
  // Request headers whose values join the fingerprint (method, target and body always do).
  std::vector<std::string> fingerprint_headers;

  // The executor's lease (SPEC §7).
  Duration lease = 30s;
  // How long a duplicate of a request in flight waits for its answer; 0: 409 at once.
  Duration wait = Duration{0};
  // After an outcome the proxy cannot know, how long it keeps reading the upstream's answer
  // in the background to record it; the key stays held meanwhile. Then the lease is left
  // to run out. 0: do not read on.
  Duration late_answer = 60s;

  // Largest request body accepted for a keyed request, which is read whole (413 above).
  std::size_t max_request_body = 1024 * 1024;
  // Largest request header block accepted (431 above it).
  std::size_t max_request_header = 16 * 1024;
  // Largest upstream answer the proxy passes at all (502 above it, or the connection cut
  // when the answer is already streaming); 0: no limit.
  std::size_t max_response_body = 0;

  // Timeouts. client_timeout bounds reading one request (the first one on a connection
  // included) and each write of an answer; idle_timeout bounds a kept-alive client
  // connection between requests; upstream_timeout bounds an upstream exchange until the
  // answer's header arrives (queueing for a connection included), then each wait for more
  // of its body; upstream_idle bounds how long an idle upstream connection is kept for
  // reuse; drain_timeout bounds the graceful shutdown on SIGTERM or SIGINT.
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

  // Problem answers: `type` is this URL followed by the problem's code, or "about:blank".
  std::string problem_type_base;

  // The admin listener (/livez, /readyz, /metrics); an empty address: none.
  std::string admin_address;
  std::uint16_t admin_port = 0;

  // Purge expired records in the background every purge_interval (SPEC §8).
  bool purge = true;
  Duration purge_interval = 5min;

  // Logs: one line per request (the access log) besides the error log, which is always on.
  bool access_log = false;
  LogFormat log_format = LogFormat::kLogfmt;
};

// The policy of the first route whose pattern matches `path` (without the query), else the
// options' own.
const Policy& policy_for(const ProxyOptions& options, std::string_view path);

// Whether `path` matches the route pattern `pattern` (see Route::path).
bool path_matches(std::string_view pattern, std::string_view path);

// Parsers for the option values that are not durations or sizes. Each throws
// std::invalid_argument saying what is wrong with the text.

// "127.0.0.1:8080", "[::1]:8080", "0.0.0.0:0".
void parse_listen(std::string_view text, ProxyOptions& options);
// The same into an address and a port (the admin listener's).
void parse_address(std::string_view text, std::string& address, std::uint16_t& port);
// "http://HOST:PORT" (a trailing "/" is allowed; no TLS, no path).
void parse_upstream(std::string_view text, ProxyOptions& options);
// "POST,PATCH": upper-cased, at least one.
std::vector<std::string> parse_methods(std::string_view text);
// "5xx", "500-599", "429", comma-separated; "none" for none.
std::vector<StatusRange> parse_statuses(std::string_view text);
// "any" or "uuid".
KeyFormat parse_key_format(std::string_view text);
// "logfmt" or "json".
LogFormat parse_log_format(std::string_view text);
// A header name (an RFC 9110 token).
std::string parse_header_name(std::string_view text);

}  // namespace idem::proxy
