#include "messages.h"

#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/status.hpp>
#include <cstdint>
#include <ctime>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

namespace idem::proxy {
namespace http = boost::beast::http;
namespace beast = boost::beast;

namespace {

constexpr std::array<http::field, 8> kHopByHop = {http::field::connection,
                                                  http::field::keep_alive,
                                                  http::field::proxy_connection,
                                                  http::field::proxy_authenticate,
                                                  http::field::proxy_authorization,
                                                  http::field::te,
                                                  http::field::trailer,
                                                  http::field::transfer_encoding};

// Statuses whose answers carry no body (RFC 9110 §6.4.1).
bool bodiless(unsigned status) { return status < 200 || status == 204 || status == 304; }

// Appends `value` to the list header `name` (RFC 9110 §5.3: one line, comma-separated).
void append_to_list(http::fields& fields, std::string_view name, std::string_view value) {
  std::string joined;
  for_each_value(fields, name, [&](std::string_view v) {
    if (!joined.empty()) joined += ", ";
    joined += v;
  });
  if (!joined.empty()) joined += ", ";
  joined += value;
  fields.set(name, joined);
}

}  // namespace

bool keep_alive_of(const RequestHeader& req) {
  bool close = false, keep = false;
  for_each_value(req, http::field::connection, [&](std::string_view value) {
    for (auto token : http::token_list(value)) {
      if (beast::iequals(token, "close")) close = true;
      if (beast::iequals(token, "keep-alive")) keep = true;
    }
  });
  // RFC 9112 §9.3: HTTP/1.1 persists unless told to close; HTTP/1.0 only when asked.
  return !close && (req.version() >= 11 || keep);
}

void strip_hop_by_hop(http::fields& fields) {
  // Headers named in Connection are hop-by-hop too.
  std::vector<std::string> named;
  for_each_value(fields, http::field::connection, [&](std::string_view value) {
    for (auto token : http::token_list(value)) named.emplace_back(token);
  });
  for (const std::string& name : named) fields.erase(name);
  for (http::field f : kHopByHop) fields.erase(f);
  fields.erase(http::field::upgrade);
}

RequestHeader upstream_header(const RequestHeader& client, const ClientInfo& who) {
  RequestHeader out = client;
  strip_hop_by_hop(out);
  // The proxy answers Expect itself; the upstream must not wait for a 100.
  out.erase(http::field::expect);
  out.erase(http::field::content_length);
  for (std::string_view name : {kTokenHeader, kAttemptHeader, kStolenHeader}) out.erase(name);
  // HTTP/1.1 without a Connection header: kept alive.
  out.version(11);
  if (!who.address.empty()) {
    append_to_list(out, "X-Forwarded-For", who.address);
    // RFC 7239 §6: an IPv6 address is quoted, in brackets.
    const bool v6 = who.address.find(':') != std::string::npos;
    append_to_list(out, "Forwarded", v6 ? "for=\"[" + who.address + "]\"" : "for=" + who.address);
  }
  append_to_list(out, "Via", "1.1 idem");
  if (!who.request_id.empty()) out.set(kRequestIdHeader, who.request_id);
  return out;
}

void add_fencing(RequestHeader& upstream, std::uint64_t token, std::uint32_t attempt, bool stolen) {
  upstream.set(kTokenHeader, std::to_string(token));
  upstream.set(kAttemptHeader, std::to_string(attempt));
  upstream.set(kStolenHeader, stolen ? "true" : "false");
}

RecordedResponse to_record(const ResponseHeader& upstream) {
  ResponseHeader copy = upstream;
  strip_hop_by_hop(copy);
  copy.erase(http::field::content_length);
  RecordedResponse r;
  r.status = upstream.result_int();
  r.reason = std::string(upstream.reason());
  for (const auto& field : copy) {
    r.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  return r;
}

Response from_record(const RecordedResponse& record, bool replayed) {
  Response res;
  res.result(record.status);
  if (!record.reason.empty()) res.reason(record.reason);
  for (const auto& [name, value] : record.headers) res.insert(name, value);
  if (replayed) res.set(kReplayedHeader, "true");
  res.body() = record.body;
  return res;
}

bool sets_cookie(const RecordedResponse& record) {
  return std::any_of(record.headers.begin(), record.headers.end(), [](const auto& header) {
    return beast::iequals(header.first, "Set-Cookie") ||
           beast::iequals(header.first, "Set-Cookie2");
  });
}

void prepare_for_client(Response& res, const RequestHeader& req, bool close) {
  strip_hop_by_hop(res);
  res.version(req.version());
  res.keep_alive(!close && keep_alive_of(req));
  if (bodiless(res.result_int())) {
    res.erase(http::field::content_length);
    res.body().clear();
  } else if (req.method() == http::verb::head) {
    res.body().clear();
  } else {
    res.content_length(res.body().size());
  }
}

void prepare_streamed(StreamedResponse& res, const RequestHeader& req, bool close) {
  const bool has_length = res.find(http::field::content_length) != res.end();
  strip_hop_by_hop(res);
  res.version(req.version());
  if (bodiless(res.result_int())) {
    res.erase(http::field::content_length);
  } else if (req.method() != http::verb::head && !has_length) {
    if (req.version() >= 11) {
      res.chunked(true);
    } else {
      close = true;  // the end of the connection ends the body
    }
  }
  res.keep_alive(!close && keep_alive_of(req));
}

bool releases(unsigned status, const Policy& policy) {
  return std::any_of(policy.release_statuses.begin(), policy.release_statuses.end(),
                     [status](const StatusRange& r) { return r.contains(status); });
}

Response problem(unsigned status, std::string_view code, std::string_view detail,
                 const ProblemContext& context) {
  Response res;
  res.result(status);
  std::string title(http::obsolete_reason(static_cast<http::status>(status)));
  std::string type = context.type_base.empty() ? std::string("about:blank")
                                               : std::string(context.type_base) + std::string(code);
  nlohmann::json body = {
      {"type", type}, {"title", title}, {"status", status}, {"detail", detail}, {"code", code}};
  for (const auto& [name, value] : context.extra) body[std::string(name)] = value;
  if (!context.request_id.empty()) body["request_id"] = context.request_id;
  res.set(http::field::content_type, "application/problem+json");
  res.set(http::field::cache_control, "no-store");
  res.set(http::field::date, http_date(std::chrono::system_clock::now()));
  if (!context.request_id.empty()) res.set(kRequestIdHeader, context.request_id);
  // Never fail on invalid UTF-8 (a request id is checked, but be safe).
  res.body() = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return res;
}

std::string retry_after(std::chrono::milliseconds d) {
  auto seconds = (d.count() + 999) / 1000;
  return std::to_string(std::max<std::int64_t>(1, seconds));
}

std::string http_date(std::chrono::system_clock::time_point t) {
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  const std::time_t seconds = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::gmtime_r(&seconds, &tm);
  char out[40];
  std::snprintf(out, sizeof out, "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[tm.tm_wday % 7],
                tm.tm_mday, kMonths[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min,
                tm.tm_sec);
  return out;
}

std::optional<std::string> usable_request_id(std::string_view value) {
  if (value.empty() || value.size() > 128) return std::nullopt;
  for (char c : value) {
    if (c <= 0x20 || c > 0x7e || c == '"' || c == '\\') return std::nullopt;
  }
  return std::string(value);
}

std::string new_request_id() {
  // Not a secret, only an id that must not repeat: 128 bits from a generator of each
  // thread's own, seeded once with 256 bits from OpenSSL's random source (or, without it,
  // the system's). RAND_bytes for every request cost the proxy 7 % of a replay's
  // instructions (docs/benchmarks.md "Where the time goes").
  thread_local std::mt19937_64 rng = [] {
    std::array<std::uint32_t, 8> seed{};
    if (RAND_bytes(reinterpret_cast<unsigned char*>(seed.data()), static_cast<int>(sizeof(seed))) !=
        1) {
      std::random_device device;
      for (auto& word : seed) word = device();
    }
    std::seed_seq sequence(seed.begin(), seed.end());
    return std::mt19937_64(sequence);
  }();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(32);
  for (int half = 0; half < 2; ++half) {
    std::uint64_t bits = rng();
    for (int i = 0; i < 16; ++i, bits >>= 4) out += kHex[bits & 0x0f];
  }
  return out;
}

}  // namespace idem::proxy
