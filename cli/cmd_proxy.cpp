// `idem proxy`: an Idempotency-Key reverse proxy in front of an HTTP service (SPEC §13,
// docs/proxy.md). This file turns options into a ProxyOptions; the HTTP side lives in
// cli/proxy/.

#include <fmt/core.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "common.h"
#include "proxy/log.h"
#include "proxy/options.h"
#include "proxy/server.h"

namespace idem::cli {
namespace {

constexpr const char* kName = "proxy";

struct ProxyArgs {
  std::string listen;
  std::string upstream;
  std::string store;
  std::string methods = "POST,PATCH";
  bool require_key = false;
  std::string scope;
  std::string scope_header;
  bool no_credential_scope = false;
  bool no_host_scope = false;
  std::vector<std::string> credential_cookies;
  std::vector<std::string> fingerprint_headers;
  std::string release_status = "408,429,5xx";
  bool release_uncertain = false;
  std::string late_answer = "60s";
  std::string lease = "30s";
  std::string ttl = "24h";
  std::string wait = "0s";
  std::string max_request_body = "1MiB";
  std::string max_header = "16KiB";
  std::string max_record = "4MiB";
  std::string max_response_body = "none";
  std::string client_timeout = "30s";
  std::string idle_timeout = "60s";
  std::string upstream_timeout = "60s";
  std::string connect_timeout = "5s";
  std::string upstream_idle = "4s";
  std::string drain_timeout = "30s";
  unsigned threads = 2;
  unsigned store_threads = 4;
  std::size_t max_connections = 10'000;
  std::size_t upstream_connections = 64;
  bool access_log = false;
  std::string problem_type_base;
  std::string routes;
  std::string admin;
  bool no_purge = false;
  std::string purge_interval = "5m";
  std::string log_format = "logfmt";
  std::string key_header = "Idempotency-Key";
  std::string key_format = "any";
};

template <typename F>
auto option_value(std::string_view option, F&& parse) {
  try {
    return parse();
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string(option), e.what());
  }
}

std::size_t size_option(std::string_view option, const std::string& text, std::size_t limit) {
  std::optional<std::size_t> size = parse_size(text);
  if (!size || *size == 0) {
    throw UsageError(
        std::string(option),
        fmt::format("'{}' is not a byte count above 0 (e.g. 65536, 64KiB, 1MiB)", printable(text)));
  }
  if (*size > limit) {
    throw UsageError(std::string(option), fmt::format("at most {} bytes", limit));
  }
  return *size;
}

// A route's value as the routes file gives it: a string (a duration, a size, a list) or,
// for sizes and lists, a number or an array.
std::string text_of(const nlohmann::json& value, std::string_view where) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_unsigned()) return std::to_string(value.get<std::uint64_t>());
  if (value.is_array()) {
    std::string joined;
    for (const auto& item : value) {
      if (!item.is_string() && !item.is_number_unsigned()) {
        throw std::invalid_argument(std::string(where) + ": expected strings or numbers");
      }
      if (!joined.empty()) joined += ",";
      joined +=
          item.is_string() ? item.get<std::string>() : std::to_string(item.get<std::uint64_t>());
    }
    return joined;
  }
  throw std::invalid_argument(std::string(where) + ": expected a string");
}

bool bool_of(const nlohmann::json& value, std::string_view where) {
  if (!value.is_boolean())
    throw std::invalid_argument(std::string(where) + ": expected true or false");
  return value.get<bool>();
}

// Reads the routes file (docs/proxy.md, "Routes"): {"routes": [{"path": ..., ...}, ...]}.
// Each route starts from the flags' policy and overrides what it names; an unknown field is
// an error, so a typo never goes unnoticed.
std::vector<proxy::Route> load_routes(const std::string& path, const proxy::Policy& defaults) {
  std::ifstream in(path);
  if (!in) throw UsageError("--routes", fmt::format("cannot read '{}'", printable(path)));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("--routes",
                     fmt::format("'{}' is not valid JSON: {}", printable(path), e.what()));
  }
  if (!doc.is_object() || !doc.contains("routes") || !doc["routes"].is_array() || doc.size() != 1) {
    throw UsageError("--routes", fmt::format("'{}' must hold one object with a \"routes\" array",
                                             printable(path)));
  }
  std::vector<proxy::Route> routes;
  std::size_t n = 0;
  for (const auto& entry : doc["routes"]) {
    const std::string where = fmt::format("route {}", ++n);
    auto fail = [&](const std::string& why) {
      return UsageError("--routes", fmt::format("{} in '{}': {}", where, printable(path), why));
    };
    if (!entry.is_object()) throw fail("expected an object");
    proxy::Route route;
    route.policy = defaults;
    proxy::Policy& p = route.policy;
    try {
      for (const auto& [name, value] : entry.items()) {
        const std::string field = where + " \"" + name + "\"";
        if (name == "path") {
          route.path = text_of(value, field);
        } else if (name == "protect") {
          p.protect = bool_of(value, field);
        } else if (name == "methods") {
          p.methods = proxy::parse_methods(text_of(value, field));
        } else if (name == "require_key") {
          p.require_key = bool_of(value, field);
        } else if (name == "key_format") {
          p.key_format = proxy::parse_key_format(text_of(value, field));
        } else if (name == "scope") {
          p.fixed_scope = text_of(value, field);
          if (p.fixed_scope.size() > kMaxScopeBytes) throw fail("\"scope\": at most 255 bytes");
        } else if (name == "ttl") {
          p.ttl = duration_option("\"ttl\"", text_of(value, field), false);
        } else if (name == "release_status") {
          p.release_statuses = proxy::parse_statuses(text_of(value, field));
        } else if (name == "max_record") {
          p.max_record = size_option("\"max_record\"", text_of(value, field), kMaxPayloadBytes);
        } else if (name == "release_uncertain") {
          p.release_uncertain = bool_of(value, field);
        } else {
          throw fail("unknown field \"" + name +
                     "\" (path, protect, methods, require_key, "
                     "key_format, scope, ttl, release_status, max_record, release_uncertain)");
        }
      }
    } catch (const std::invalid_argument& e) {
      throw fail(e.what());
    } catch (const UsageError& e) {
      if (e.option() == "--routes") throw;
      throw fail(e.what());
    }
    if (route.path.empty() || route.path.front() != '/') {
      throw fail("\"path\" must be given and start with /");
    }
    routes.push_back(std::move(route));
  }
  return routes;
}

proxy::ProxyOptions to_options(const ProxyArgs& a) {
  proxy::ProxyOptions o;
  option_value("--listen", [&] { proxy::parse_listen(a.listen, o); });
  option_value("--upstream", [&] { proxy::parse_upstream(a.upstream, o); });
  proxy::Policy& p = o.policy;
  p.methods = option_value("--methods", [&] { return proxy::parse_methods(a.methods); });
  p.release_statuses =
      option_value("--release-status", [&] { return proxy::parse_statuses(a.release_status); });
  p.release_uncertain = a.release_uncertain;
  p.require_key = a.require_key;
  if (a.scope.size() > kMaxScopeBytes) throw UsageError("--scope", "at most 255 bytes");
  p.fixed_scope = a.scope;
  o.scope_header = a.scope_header;
  o.credential_scope = !a.no_credential_scope;
  o.host_scope = !a.no_host_scope;
  o.credential_cookies = a.credential_cookies;
  o.fingerprint_headers = a.fingerprint_headers;
  o.lease = duration_option("--lease", a.lease, false);
  p.ttl = duration_option("--ttl", a.ttl, false);
  o.wait = duration_option("--wait", a.wait, true);
  o.late_answer = duration_option("--late-answer", a.late_answer, true);
  o.max_request_body = size_option("--max-request-body", a.max_request_body, kMaxPayloadBytes);
  o.max_request_header = size_option("--max-header", a.max_header, 1024 * 1024);
  p.max_record = size_option("--max-record", a.max_record, kMaxPayloadBytes);
  o.max_response_body = a.max_response_body == "none"
                            ? 0
                            : size_option("--max-response-body", a.max_response_body,
                                          std::numeric_limits<std::size_t>::max());
  o.client_timeout = duration_option("--client-timeout", a.client_timeout, false);
  o.idle_timeout = duration_option("--idle-timeout", a.idle_timeout, false);
  o.upstream_timeout = duration_option("--upstream-timeout", a.upstream_timeout, false);
  o.connect_timeout = duration_option("--connect-timeout", a.connect_timeout, false);
  o.upstream_idle = duration_option("--upstream-idle", a.upstream_idle, false);
  o.drain_timeout = duration_option("--drain-timeout", a.drain_timeout, false);
  if (a.threads == 0) throw UsageError("--threads", "must be at least 1");
  if (a.max_connections == 0) throw UsageError("--max-connections", "must be at least 1");
  if (a.upstream_connections == 0) throw UsageError("--upstream-connections", "must be at least 1");
  o.io_threads = a.threads;
  o.store_threads = a.store_threads;
  o.max_connections = a.max_connections;
  o.upstream_connections = a.upstream_connections;
  o.access_log = a.access_log;
  if (!a.problem_type_base.empty() && a.problem_type_base.find(':') == std::string::npos) {
    throw UsageError("--problem-type-base",
                     "expected an absolute URL, such as https://api.example.com/problems/");
  }
  o.problem_type_base = a.problem_type_base;
  o.key_header =
      option_value("--key-header", [&] { return proxy::parse_header_name(a.key_header); });
  p.key_format =
      option_value("--key-format", [&] { return proxy::parse_key_format(a.key_format); });
  if (!a.admin.empty()) {
    option_value("--admin", [&] { proxy::parse_address(a.admin, o.admin_address, o.admin_port); });
  }
  o.purge = !a.no_purge;
  o.purge_interval = duration_option("--purge-interval", a.purge_interval, false);
  o.log_format =
      option_value("--log-format", [&] { return proxy::parse_log_format(a.log_format); });
  // Last: every route starts from the flags' policy.
  if (!a.routes.empty()) o.routes = load_routes(a.routes, o.policy);
  return o;
}

// Raises the soft limit on open files to the hard one (a proxy holds two descriptors per
// request in flight), and says when even that is below what the connection limits need.
void raise_open_files(const proxy::ProxyOptions& o, const proxy::Logger& log) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t before = limit.rlim_cur;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    // An unlimited hard limit is still capped by the kernel (fs.nr_open).
    raised.rlim_cur = limit.rlim_max == RLIM_INFINITY ? rlim_t{1} << 20 : limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur != before) {
    log.info(fmt::format("open files: raised the limit from {} to {}", before, limit.rlim_cur));
  }
  const std::size_t needed = o.max_connections + o.upstream_connections + 64;
  if (limit.rlim_cur < needed) {
    log.warn(
        fmt::format("the open-file limit ({}) is below what --max-connections "
                    "and --upstream-connections need ({}); connections beyond it fail. "
                    "Raise it (ulimit -n, or LimitNOFILE= in a systemd unit), or lower "
                    "--max-connections",
                    limit.rlim_cur, needed));
  }
}

int run_proxy(const ProxyArgs& args) {
  proxy::ProxyOptions options = to_options(args);
  // The error log is always on, on stderr, one line a write (docs/proxy.md, "Logs").
  proxy::Logger log(options.log_format, [](std::string_view line) { (void)write_all(2, line); });
  raise_open_files(options, log);
  proxy::Server server(options, open_cli_store(args.store, StoreAccess::kCreate), log);
  try {
    server.run();
  } catch (const std::invalid_argument& e) {
    throw UsageError("--upstream", e.what());
  }
  return kExitOk;
}

}  // namespace

Command add_proxy_command(CLI::App& parent) {
  auto a = std::make_shared<ProxyArgs>();
  CLI::App* app = parent.add_subcommand(
      kName,
      "An HTTP reverse proxy that runs each request with an Idempotency-Key at most once "
      "and replays its recorded answer to duplicates (docs/proxy.md)");
  auto opt = [&](const char* name, std::string& value, const char* help) {
    return app->add_option(name, value, help)->capture_default_str();
  };
  opt("--listen", a->listen, "Address and port to listen on (ADDR:PORT; port 0: any)")
      ->required()
      ->type_name("ADDR:PORT");
  opt("--upstream", a->upstream, "The service behind the proxy")
      ->required()
      ->type_name("http://HOST:PORT");
  add_store_option(*app, a->store);
  opt("--methods", a->methods, "Methods whose keyed requests go through idem")->type_name("LIST");
  app->add_flag("--require-key", a->require_key,
                "Answer 400 to a request of those methods without an Idempotency-Key");
  opt("--scope", a->scope, "A fixed scope instead of METHOD PATH")->type_name("S");
  opt("--scope-header", a->scope_header, "A request header whose value leads the scope (a tenant)")
      ->type_name("NAME");
  app->add_flag("--no-credential-scope", a->no_credential_scope,
                "Leave the caller's credentials (Authorization, cookies) out of the scope");
  app->add_flag("--no-host-scope", a->no_host_scope,
                "Leave the request's Host out of the scope (only when one proxy serves one host)");
  app->add_option("--credential-cookie", a->credential_cookies,
                  "A cookie that identifies the caller when there is no Authorization header "
                  "(repeatable)")
      ->type_name("NAME");
  app->add_option("--fingerprint-header", a->fingerprint_headers,
                  "A request header that joins the fingerprint (repeatable)")
      ->type_name("NAME");
  opt("--release-status", a->release_status,
      "Upstream statuses that say the request did not run: they release the record instead "
      "of recording it (5xx, 429, 500-503, none)")
      ->type_name("LIST");
  app->add_flag("--release-uncertain", a->release_uncertain,
                "Release the record after an outcome the proxy cannot know (an upstream "
                "timeout, a connection broken mid-answer, a drain that ran out), so a retry "
                "runs the request again: only for upstreams that are safe to run twice");
  opt("--late-answer", a->late_answer,
      "After an upstream timeout, how long to keep reading its answer in the background to "
      "record it; the key stays held meanwhile (0: do not)")
      ->type_name("DURATION");
  opt("--lease", a->lease, "How long a request holds its key without a heartbeat")
      ->type_name("DURATION");
  opt("--ttl", a->ttl, "How long a recorded answer is replayed")->type_name("DURATION");
  opt("--wait", a->wait, "How long a duplicate waits for the first request's answer (0: 409)")
      ->type_name("DURATION");
  opt("--max-request-body", a->max_request_body,
      "Largest body of a request with a key, which is read whole (413 above); other requests "
      "stream with no limit")
      ->type_name("BYTES");
  opt("--max-header", a->max_header, "Largest request header block (431 above)")
      ->type_name("BYTES");
  opt("--max-record", a->max_record,
      "Largest answer recorded in full; a larger one is recorded as a marker and its "
      "duplicates get 410 (never a second run)")
      ->type_name("BYTES");
  opt("--max-response-body", a->max_response_body,
      "Largest upstream answer passed at all (502 above; none: no limit)")
      ->type_name("BYTES");
  opt("--client-timeout", a->client_timeout, "Reading a request, writing an answer")
      ->type_name("DURATION");
  opt("--idle-timeout", a->idle_timeout, "A kept-alive client connection between requests")
      ->type_name("DURATION");
  opt("--upstream-timeout", a->upstream_timeout,
      "How long the upstream gets to answer: until the answer's header (queueing for a "
      "connection included), then between two pieces of its body")
      ->type_name("DURATION");
  opt("--connect-timeout", a->connect_timeout, "Connecting to the upstream")->type_name("DURATION");
  opt("--upstream-idle", a->upstream_idle, "How long an idle upstream connection is kept")
      ->type_name("DURATION");
  opt("--drain-timeout", a->drain_timeout, "On SIGTERM, how long requests in flight get to finish")
      ->type_name("DURATION");
  app->add_option("--threads", a->threads, "I/O threads")->capture_default_str()->type_name("N");
  app->add_option("--store-threads", a->store_threads,
                  "Threads making store calls (0: the I/O threads make them)")
      ->capture_default_str()
      ->type_name("N");
  app->add_option("--max-connections", a->max_connections, "Most client connections at once")
      ->capture_default_str()
      ->type_name("N");
  app->add_option("--upstream-connections", a->upstream_connections,
                  "Most upstream connections at once")
      ->capture_default_str()
      ->type_name("N");
  app->add_flag("--access-log", a->access_log,
                "Log one line per request on stderr (besides the error log, always on)");
  opt("--log-format", a->log_format, "The log lines' format: logfmt or json")->type_name("FORMAT");
  opt("--admin", a->admin,
      "Where the admin listener serves /livez, /readyz (checks the store) and /metrics "
      "(Prometheus); none by default")
      ->type_name("ADDR:PORT");
  app->add_flag("--no-purge", a->no_purge,
                "Do not purge expired records in the background (another proxy, or idem purge, "
                "does it)");
  opt("--purge-interval", a->purge_interval, "How often expired records are purged")
      ->type_name("DURATION");
  opt("--routes", a->routes,
      "A JSON file of per-route policies: which paths idem protects, with which methods, "
      "key rules, scope, TTL, released statuses and record limit (docs/proxy.md, \"Routes\")")
      ->type_name("FILE");
  opt("--key-header", a->key_header,
      "The request header that carries the key (X-Idempotency-Key, PayPal-Request-Id, ...)")
      ->type_name("NAME");
  opt("--key-format", a->key_format, "What a key must look like: any, or uuid")
      ->type_name("FORMAT");
  opt("--problem-type-base", a->problem_type_base,
      "Problem answers' type: this URL followed by the problem's code (your API's "
      "documentation of them), instead of about:blank")
      ->type_name("URL");
  // Every option also comes from the environment: --max-record from IDEM_PROXY_MAX_RECORD,
  // a flag from IDEM_PROXY_REQUIRE_KEY=true; a list from a comma-separated value. The store
  // keeps its own variable, IDEM_STORE.
  for (CLI::Option* option : app->get_options()) {
    const std::string name = option->get_single_name();
    if (name.empty() || name == "help" || name == "store") continue;
    std::string env = "IDEM_PROXY_";
    for (char c : name)
      env += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    option->envname(env);
    if (option->get_items_expected_max() > 1) option->delimiter(',');
  }
  app->footer(
      "Durations: 250ms, 30s, 5m. Sizes: 65536, 64KiB, 1MiB. Every option also comes from the "
      "environment: IDEM_PROXY_ and its name in capitals, dashes as underscores "
      "(IDEM_PROXY_MAX_RECORD=8MiB). See docs/proxy.md.");
  return Command{app, [a] { return run_proxy(*a); }};
}

}  // namespace idem::cli
