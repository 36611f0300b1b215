#include "messages.h"

#include <algorithm>
#include <array>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/status.hpp>
#include <nlohmann/json.hpp>
#include <vector>

namespace idem::proxy {
namespace http = boost::beast::http;
namespace beast = boost::beast;

namespace {

constexpr std::array<http::field, 8> kHopByHop = {
    http::field::connection,          http::field::keep_alive,
    http::field::proxy_connection,    http::field::proxy_authenticate,
    http::field::proxy_authorization, http::field::te,
    http::field::trailer,             http::field::transfer_encoding};

// Statuses whose answers carry no body (RFC 9110 §6.4.1).
bool bodiless(unsigned status) { return status < 200 || status == 204 || status == 304; }

}  // namespace

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

Request upstream_request(const Request& client) {
  Request out = client;
  strip_hop_by_hop(out);
  // The proxy has read the whole body already; the upstream must not wait for a 100.
  out.erase(http::field::expect);
  for (std::string_view name : {kTokenHeader, kAttemptHeader, kStolenHeader}) out.erase(name);
  out.version(11);
  out.keep_alive(true);
  out.prepare_payload();
  return out;
}

void add_fencing(Request& upstream, std::uint64_t token, std::uint32_t attempt, bool stolen) {
  upstream.set(kTokenHeader, std::to_string(token));
  upstream.set(kAttemptHeader, std::to_string(attempt));
  upstream.set(kStolenHeader, stolen ? "true" : "false");
}

RecordedResponse to_record(const Response& upstream) {
  Response copy_headers;
  copy_headers.base() = upstream.base();
  strip_hop_by_hop(copy_headers);
  copy_headers.erase(http::field::content_length);
  RecordedResponse r;
  r.status = upstream.result_int();
  r.reason = std::string(upstream.reason());
  for (const auto& field : copy_headers) {
    r.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  r.body = upstream.body();
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

void prepare_for_client(Response& res, const Request& req, bool close) {
  strip_hop_by_hop(res);
  res.version(req.version());
  res.keep_alive(!close && req.keep_alive());
  if (bodiless(res.result_int())) {
    res.erase(http::field::content_length);
    res.body().clear();
  } else if (req.method() == http::verb::head) {
    res.body().clear();
  } else {
    res.content_length(res.body().size());
  }
}

bool releases(unsigned status, const ProxyOptions& options) {
  return std::any_of(options.release_statuses.begin(), options.release_statuses.end(),
                     [status](const StatusRange& r) { return r.contains(status); });
}

Response problem(unsigned status, std::string_view code, std::string_view detail) {
  Response res;
  res.result(status);
  std::string title(http::obsolete_reason(static_cast<http::status>(status)));
  nlohmann::json body = {{"type", "about:blank"},
                         {"title", title},
                         {"status", status},
                         {"detail", detail},
                         {"code", code}};
  res.set(http::field::content_type, "application/problem+json");
  res.set(http::field::cache_control, "no-store");
  // Details may quote bytes a client sent; never fail on invalid UTF-8.
  res.body() = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return res;
}

std::string retry_after(std::chrono::milliseconds d) {
  auto seconds = (d.count() + 999) / 1000;
  return std::to_string(std::max<std::int64_t>(1, seconds));
}

}  // namespace idem::proxy
