#pragma once

// Who a keyed request is and what it asks (SPEC §13): the Idempotency-Key header, the
// scope its record lives in, and the fingerprint that tells a retry from a different
// request sent with the same key. Pure functions over a parsed request, so they are unit
// tested without a network.

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "options.h"

namespace idem::proxy {

using Request = boost::beast::http::request<boost::beast::http::string_body>;
using RequestHeader = boost::beast::http::request_header<>;

// Calls f(value) for each header named `name`, in order.
template <typename Fields, typename Name, typename F>
void for_each_value(const Fields& fields, const Name& name, F&& f) {
  auto range = fields.equal_range(name);
  for (auto it = range.first; it != range.second; ++it) f(it->value());
}

// The header the draft names (the default of --key-header).
inline constexpr std::string_view kKeyHeader = "Idempotency-Key";

// The lowercase hex SHA-256 of `bytes` (64 characters).
std::string sha256_hex(std::string_view bytes);

// What the Idempotency-Key header of a request holds.
struct KeyHeader {
  enum class Kind { kAbsent, kValid, kMalformed } kind = Kind::kAbsent;
  // The key (kValid), or why the header is refused (kMalformed).
  std::string key;
  std::string why;
};

// Reads the key header (`header`, Idempotency-Key by default): a structured-field string (in
// double quotes, with backslash escapes for a quote and a backslash: RFC 8941 §3.3.3) as the
// draft says, or a bare token (visible ASCII). Malformed: more than one header, an empty
// key, a key longer than SPEC §10's 1024 bytes, a broken string, anything after the closing
// quote but whitespace, or a key that is not of `format`. The reasons are fixed texts (no
// byte of the request in them), fit to show the client.
KeyHeader read_key(const RequestHeader& request, std::string_view header = kKeyHeader,
                   KeyFormat format = KeyFormat::kAny);

// The scope a keyed request's record lives in (docs/proxy.md, "Identity"):
//
//   [t<len>:<scope header value> ][c:<sha256 of the credentials> ][h<len>:<host> ]<METHOD> <path>
//
// with the policy's fixed scope in place of "<METHOD> <path>" when one is set. The
// credentials are the Authorization header, else the cookies named in the options (in the
// order named), so one client never gets another's recorded answer; the host (lower case)
// keeps virtual hosts apart. The length prefixes and the fixed-size digest keep the parts
// apart whatever a header holds. A scope longer than SPEC §10's 255 bytes becomes "sha256:"
// and the digest of the long form.
std::string scope_of(const RequestHeader& request, const ProxyOptions& options,
                     const Policy& policy);
std::string scope_of(const RequestHeader& request, const ProxyOptions& options);

// Whether scope_of puts a digest of the request's credentials in its scope (SPEC §13: an
// answer that sets a cookie is replayed only to a request whose scope holds one).
bool has_credentials(const RequestHeader& request, const ProxyOptions& options);

// The request's fingerprint: SHA-256 over the method, target, body and the values of the
// headers named in the options, each length-prefixed (so no two requests share an
// encoding), as 64 hex characters.
std::string fingerprint_of(const RequestHeader& request, std::string_view body,
                           const ProxyOptions& options);
inline std::string fingerprint_of(const Request& request, const ProxyOptions& options) {
  return fingerprint_of(request, request.body(), options);
}

}  // namespace idem::proxy
