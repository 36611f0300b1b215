#pragma once

// The HTTP messages the proxy builds and edits: what is forwarded upstream, what is
// recorded and replayed, and the problem answers (RFC 9457) it gives itself.

#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "identity.h"
#include "options.h"
#include "record.h"

namespace idem::proxy {

using Response = boost::beast::http::response<boost::beast::http::string_body>;
using RequestHeader = boost::beast::http::request_header<>;
using ResponseHeader = boost::beast::http::response_header<>;

// Headers the proxy sends upstream with a request that holds a lease (SPEC §13: the
// fencing token downstream). Whatever a client sends under these names is removed first.
inline constexpr std::string_view kTokenHeader = "Idempotency-Token";
inline constexpr std::string_view kAttemptHeader = "Idempotency-Attempt";
inline constexpr std::string_view kStolenHeader = "Idempotency-Stolen";
// On a replayed answer (the draft's name).
inline constexpr std::string_view kReplayedHeader = "Idempotent-Replayed";
// On an answer that was forwarded but could not be recorded (docs/proxy.md, "Answers").
inline constexpr std::string_view kNotRecordedHeader = "Idempotency-Not-Recorded";
// The request id: taken from the client when it sends a sane one, else made up; sent
// upstream, logged, and named in every problem answer.
inline constexpr std::string_view kRequestIdHeader = "X-Request-Id";

// Removes the hop-by-hop headers (RFC 9110 §7.6.1: Connection and every header it names,
// Keep-Alive, Proxy-Connection, Proxy-Authenticate, Proxy-Authorization, TE, Trailer,
// Transfer-Encoding, Upgrade).
void strip_hop_by_hop(boost::beast::http::fields& fields);

// Who the client is, for the headers that tell the upstream (RFC 7239, X-Forwarded-For).
struct ClientInfo {
  std::string address;  // "127.0.0.1" or "::1"
  std::uint16_t port = 0;
  std::string request_id;
};

// The header to send upstream for a client's request: hop-by-hop headers, Expect and any
// fencing headers removed, HTTP/1.1 with keep-alive; X-Forwarded-For and Forwarded extended
// with the client's address, Via with this proxy, X-Request-Id set. The body's framing
// (Content-Length or chunked) is left to the caller.
RequestHeader upstream_header(const RequestHeader& client, const ClientInfo& who);

// Adds the fencing headers of a held lease to an upstream request.
void add_fencing(RequestHeader& upstream, std::uint64_t token, std::uint32_t attempt, bool stolen);

// What is recorded of an upstream answer's header: status, reason, end-to-end headers
// (Content-Length aside, which a replay sets from the body). The body is added by the caller.
RecordedResponse to_record(const ResponseHeader& upstream);

// A recorded answer as sent to a client; `replayed` adds Idempotent-Replayed: true.
Response from_record(const RecordedResponse& record, bool replayed);

// Whether a recorded answer sets a cookie (SPEC §13: never replayed to a request without
// credentials in its scope).
bool sets_cookie(const RecordedResponse& record);

// Whether the client of `req` asked to keep the connection open (RFC 9112 §9.3).
bool keep_alive_of(const RequestHeader& req);

// Makes `res` fit to send to the client of `req`: hop-by-hop headers removed, the client's
// HTTP version, keep-alive as the client asked unless `close`, and a Content-Length from
// the body except where the status or a HEAD request forbid a body (the upstream's
// Content-Length then stays).
void prepare_for_client(Response& res, const RequestHeader& req, bool close);

using StreamedResponse = boost::beast::http::response<boost::beast::http::buffer_body>;

// Makes the header of an upstream answer that is passed on as it arrives fit to send to the
// client of `req`: hop-by-hop headers removed, the client's HTTP version, and a framing the
// client can read: the upstream's Content-Length when it gave one, else chunked for an
// HTTP/1.1 client, else the end of the connection (`close` then holds).
void prepare_streamed(StreamedResponse& res, const RequestHeader& req, bool close);

// Whether an upstream status releases the record instead of completing it.
bool releases(unsigned status, const Policy& policy);

// What a problem answer names besides its code and text.
struct ProblemContext {
  std::string_view request_id;
  // --problem-type-base: `type` is this URL followed by the code; empty: "about:blank".
  std::string_view type_base;
  // Numeric extension members (RFC 9457 §3.2), such as a marker's recorded status.
  std::vector<std::pair<std::string_view, std::uint64_t>> extra{};
};

// A problem answer (RFC 9457): application/problem+json with `type`, the status's reason as
// `title`, `detail`, `code` naming the case (docs/proxy.md lists them) and `request_id`.
// `detail` is a fixed text: what went wrong inside (a store's address, a path, a scope) goes
// to the log, never to the client (SPEC §13). Carries Date and X-Request-Id.
Response problem(unsigned status, std::string_view code, std::string_view detail,
                 const ProblemContext& context = {});

// Retry-After in whole seconds (at least 1) for a wait of `d`.
std::string retry_after(std::chrono::milliseconds d);

// The HTTP date (RFC 9110 §5.6.7, IMF-fixdate) of `t`: "Sun, 06 Nov 1994 08:49:37 GMT".
std::string http_date(std::chrono::system_clock::time_point t);

// A client's X-Request-Id when it is fit to pass on and log (1 to 128 visible ASCII
// characters), else nullopt.
std::optional<std::string> usable_request_id(std::string_view value);

// A new request id: 32 random hex digits.
std::string new_request_id();

}  // namespace idem::proxy
