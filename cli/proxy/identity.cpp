#include "identity.h"

#include <openssl/evp.h>

#include <array>
#include <boost/beast/core/string.hpp>
#include <cctype>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "idem/store.h"

namespace idem::proxy {
namespace http = boost::beast::http;

namespace {

// OpenSSL 3's SHA-256, fetched once: EVP_sha256() makes every EVP_DigestInit_ex look the
// algorithm up again in the provider's table, under its lock (a quarter of the digest's
// instructions on a proxy's replay, docs/benchmarks.md "Where the time goes"). Never freed:
// it lives as long as the process.
const EVP_MD* sha256_algorithm() {
  static const EVP_MD* const md = [] {
    const EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return fetched != nullptr ? fetched : EVP_sha256();
  }();
  return md;
}

// SHA-256 fed piece by piece (OpenSSL's EVP interface; RAII over the context).
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), &EVP_MD_CTX_free) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), sha256_algorithm(), nullptr) != 1) {
      throw std::runtime_error("SHA-256: OpenSSL could not start a digest");
    }
  }
  void add(std::string_view bytes) {
    if (EVP_DigestUpdate(ctx_.get(), bytes.data(), bytes.size()) != 1) {
      throw std::runtime_error("SHA-256: OpenSSL could not update a digest");
    }
  }
  // Adds `bytes` after its length as 8 big-endian bytes, so fields cannot run together.
  void add_field(std::string_view bytes) {
    std::array<char, 8> length{};
    auto n = static_cast<std::uint64_t>(bytes.size());
    for (int i = 7; i >= 0; --i, n >>= 8)
      length[static_cast<std::size_t>(i)] = static_cast<char>(n & 0xff);
    add(std::string_view(length.data(), length.size()));
    add(bytes);
  }
  std::string hex() {
    std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
    unsigned int size = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), md.data(), &size) != 1) {
      throw std::runtime_error("SHA-256: OpenSSL could not finish a digest");
    }
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(size * 2);
    for (unsigned int i = 0; i < size; ++i) {
      out += kHex[md[i] >> 4];
      out += kHex[md[i] & 0x0f];
    }
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
};

bool is_ows(char c) { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ows(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ows(s.back())) s.remove_suffix(1);
  return s;
}

KeyHeader malformed(std::string why) {
  return KeyHeader{KeyHeader::Kind::kMalformed, {}, std::move(why)};
}

// The value of the named cookie in the request's Cookie headers, if any.
std::optional<std::string_view> cookie(const RequestHeader& request, std::string_view name) {
  std::optional<std::string_view> found;
  for_each_value(request, http::field::cookie, [&](std::string_view rest) {
    while (!rest.empty() && !found) {
      std::size_t end = rest.find(';');
      std::string_view pair = trim(rest.substr(0, end));
      rest = end == std::string_view::npos ? std::string_view{} : rest.substr(end + 1);
      std::size_t eq = pair.find('=');
      if (eq != std::string_view::npos && trim(pair.substr(0, eq)) == name) {
        found = trim(pair.substr(eq + 1));
      }
    }
  });
  return found;
}

std::string_view path_of(std::string_view target) { return target.substr(0, target.find('?')); }

// The credentials that identify the caller (docs/proxy.md, "Identity"), or "" for none.
std::string credentials_of(const RequestHeader& request, const ProxyOptions& options) {
  std::string credentials;
  if (!options.credential_scope) return credentials;
  for_each_value(request, http::field::authorization, [&](std::string_view value) {
    credentials += "authorization\n";
    credentials += value;
    credentials += '\n';
  });
  if (credentials.empty()) {
    for (const std::string& name : options.credential_cookies) {
      if (auto value = cookie(request, name)) {
        credentials += "cookie\n" + name + "=";
        credentials += *value;
        credentials += '\n';
      }
    }
  }
  return credentials;
}

bool is_uuid(std::string_view key) {
  if (key.size() != 36) return false;
  for (std::size_t i = 0; i < key.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? key[i] != '-' : !std::isxdigit(static_cast<unsigned char>(key[i]))) return false;
  }
  return true;
}

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  Sha256 digest;
  digest.add(bytes);
  return digest.hex();
}

KeyHeader read_key(const RequestHeader& request, std::string_view header, KeyFormat format) {
  auto range = request.equal_range(header);
  if (range.first == range.second) return {};
  if (std::next(range.first) != range.second) {
    return malformed("the request has more than one key header");
  }
  std::string_view value = trim(range.first->value());
  std::string key;
  if (!value.empty() && value.front() == '"') {
    // RFC 8941 §4.2.5: printable ASCII, with only \" and \\ as escapes.
    std::size_t i = 1;
    bool closed = false;
    for (; i < value.size(); ++i) {
      char c = value[i];
      if (c == '\\') {
        if (i + 1 >= value.size() || (value[i + 1] != '"' && value[i + 1] != '\\')) {
          return malformed("the key string has an escape other than \\\" or \\\\");
        }
        key += value[++i];
      } else if (c == '"') {
        closed = true;
        ++i;
        break;
      } else if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
        return malformed("the key string holds a byte that is not printable ASCII");
      } else {
        key += c;
      }
    }
    if (!closed) return malformed("the key string has no closing quote");
    if (i != value.size()) {
      return malformed("the key header has something after the closing quote");
    }
  } else {
    for (char c : value) {
      if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) > 0x7e) {
        return malformed("the key is neither a quoted string nor a token of visible ASCII");
      }
    }
    key = std::string(value);
  }
  if (key.empty()) return malformed("the key is empty");
  if (key.size() > kMaxKeyBytes) {
    return malformed("the key is " + std::to_string(key.size()) +
                     " bytes, more than the limit of " + std::to_string(kMaxKeyBytes));
  }
  if (format == KeyFormat::kUuid && !is_uuid(key)) {
    return malformed(
        "this endpoint takes only UUIDs as keys (36 characters, such as "
        "\"8e03978e-40d5-43e8-bc93-6894a57f9324\")");
  }
  return KeyHeader{KeyHeader::Kind::kValid, std::move(key), {}};
}

std::string scope_of(const RequestHeader& request, const ProxyOptions& options) {
  return scope_of(request, options, options.policy);
}

bool has_credentials(const RequestHeader& request, const ProxyOptions& options) {
  return !credentials_of(request, options).empty();
}

std::string scope_of(const RequestHeader& request, const ProxyOptions& options,
                     const Policy& policy) {
  std::string scope;
  if (!options.scope_header.empty()) {
    auto it = request.find(options.scope_header);
    if (it != request.end()) {
      std::string_view value = it->value();
      scope += "t" + std::to_string(value.size()) + ":";
      scope += value;
      scope += ' ';
    }
  }
  if (std::string credentials = credentials_of(request, options); !credentials.empty()) {
    scope += "c:" + sha256_hex(credentials) + " ";
  }
  if (options.host_scope) {
    // SPEC §13: virtual hosts behind one proxy never share records. A host name is
    // case-insensitive (RFC 9110 §4.2.3).
    if (auto it = request.find(http::field::host); it != request.end()) {
      std::string host(it->value());
      for (char& c : host) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      scope += "h" + std::to_string(host.size()) + ":" + host + " ";
    }
  }
  if (!policy.fixed_scope.empty()) {
    scope += policy.fixed_scope;
  } else {
    scope += request.method_string();
    scope += ' ';
    scope += path_of(request.target());
  }
  if (scope.size() > kMaxScopeBytes) return "sha256:" + sha256_hex(scope);
  return scope;
}

std::string fingerprint_of(const RequestHeader& request, std::string_view body,
                           const ProxyOptions& options) {
  Sha256 digest;
  digest.add_field(request.method_string());
  digest.add_field(request.target());
  digest.add_field(body);
  for (const std::string& name : options.fingerprint_headers) {
    std::string values;
    for_each_value(request, name, [&](std::string_view value) {
      values += value;
      values += '\n';
    });
    digest.add_field(name);
    digest.add_field(values);
  }
  return digest.hex();
}

}  // namespace idem::proxy
