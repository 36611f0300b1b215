#pragma once

// The HTTP messages the proxy builds and edits: what is forwarded upstream, what is
// recorded and replayed, and the problem answers (RFC 9457) it gives itself.

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <string>
#include <string_view>

#include "identity.h"
#include "options.h"
#include "record.h"

namespace idem::proxy {

using Response = boost::beast::http::response<boost::beast::http::string_body>;

// Headers the proxy sends upstream with a request that holds a lease (SPEC §13: the
// fencing token downstream). Whatever a client sends under these names is removed first.
inline constexpr std::string_view kTokenHeader = "Idempotency-Token";
inline constexpr std::string_view kAttemptHeader = "Idempotency-Attempt";
inline constexpr std::string_view kStolenHeader = "Idempotency-Stolen";
// On a replayed answer (the draft's name).
inline constexpr std::string_view kReplayedHeader = "Idempotent-Replayed";
// On an answer that was forwarded but could not be recorded (docs/proxy.md, "Answers").
inline constexpr std::string_view kNotRecordedHeader = "Idempotency-Not-Recorded";

// Removes the hop-by-hop headers (RFC 9110 §7.6.1: Connection and every header it names,
// Keep-Alive, Proxy-Connection, Proxy-Authenticate, Proxy-Authorization, TE, Trailer,
// Transfer-Encoding, Upgrade).
void strip_hop_by_hop(boost::beast::http::fields& fields);

// The request to send upstream for a client's request: hop-by-hop headers, Expect and any
// fencing headers removed, HTTP/1.1 with keep-alive, Content-Length from the body.
Request upstream_request(const Request& client);

// Adds the fencing headers of a held lease to an upstream request.
void add_fencing(Request& upstream, std::uint64_t token, std::uint32_t attempt, bool stolen);

// What is recorded of an upstream answer: status, reason, end-to-end headers, body.
RecordedResponse to_record(const Response& upstream);

// A recorded answer as sent to a client; `replayed` adds Idempotent-Replayed: true.
Response from_record(const RecordedResponse& record, bool replayed);

// Makes `res` fit to send to the client of `req`: hop-by-hop headers removed, the client's
// HTTP version, keep-alive as the client asked unless `close`, and a Content-Length from
// the body except where the status or a HEAD request forbid a body (the upstream's
// Content-Length then stays).
void prepare_for_client(Response& res, const Request& req, bool close);

// Whether an upstream status releases the record instead of completing it.
bool releases(unsigned status, const ProxyOptions& options);

// A problem answer (RFC 9457): application/problem+json with type "about:blank", the
// status's reason as title, `detail`, and `code` naming the case (docs/proxy.md lists them).
Response problem(unsigned status, std::string_view code, std::string_view detail);

// Retry-After in whole seconds (at least 1) for a wait of `d`.
std::string retry_after(std::chrono::milliseconds d);

}  // namespace idem::proxy
