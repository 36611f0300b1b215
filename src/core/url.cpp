#include <algorithm>
#include <cctype>
#include <charconv>
#include <string>

#include "idem/error.h"
#include "idem/store_url.h"

namespace idem {
namespace {

[[noreturn]] void bad_url(std::string_view text, const std::string& why) {
  // Never echo a password: show nothing past the start of an authority (it may hold
  // credentials) or of a query (it may hold a password parameter). Text with an '@' but no
  // "://" is a URL with credentials mistyped ("redis//:pw@host"): nothing past its first
  // ':' is shown.
  std::size_t cut = text.find("://");
  if (cut != std::string_view::npos) {
    cut += 3;
  } else if (text.find('@') != std::string_view::npos) {
    const std::size_t colon = text.find(':');
    cut = colon == std::string_view::npos ? 0 : colon + 1;
  }
  cut = std::min(cut, text.find('?'));
  std::string shown(text.substr(0, cut));
  if (shown.size() < text.size()) shown += "...";
  throw InvalidArgument("store URL", "'" + shown + "': " + why);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view text, std::string_view whole) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%') {
      if (i + 2 >= text.size()) bad_url(whole, "truncated %-escape");
      int hi = hex_value(text[i + 1]);
      int lo = hex_value(text[i + 2]);
      if (hi < 0 || lo < 0) bad_url(whole, "bad %-escape");
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

}  // namespace

std::string Url::param(std::string_view name, std::string_view fallback) const {
  for (const auto& [k, v] : query) {
    if (k == name) return v;
  }
  return std::string(fallback);
}

std::string Url::redacted() const {
  std::string out = scheme + ":";
  if (has_authority) {
    out += "//";
    if (!user.empty() || !password.empty()) {
      out += user;
      if (!password.empty()) out += ":***";
      out += "@";
    }
    // An IPv6 address keeps its brackets, or its colons would read as a port.
    out += host.find(':') == std::string::npos ? host : "[" + host + "]";
    if (port != 0) out += ":" + std::to_string(port);
  }
  out += path;
  if (!query.empty()) {
    char sep = '?';
    for (const auto& [k, v] : query) {
      out += sep;
      out += k;
      out += "=";
      out += (k == "password" ? std::string("***") : v);
      sep = '&';
    }
  }
  return out;
}

Url parse_url(std::string_view text) {
  Url url;
  std::size_t colon = text.find(':');
  if (colon == std::string_view::npos || colon == 0) {
    bad_url(text, "no scheme (expected scheme:...)");
  }
  for (std::size_t i = 0; i < colon; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    bool ok = std::isalpha(c) || (i > 0 && (std::isdigit(c) || c == '+' || c == '-' || c == '.'));
    if (!ok) bad_url(text, "bad character in scheme");
    url.scheme.push_back(static_cast<char>(std::tolower(c)));
  }
  std::string_view rest = text.substr(colon + 1);

  std::string_view query;
  if (std::size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }

  if (rest.substr(0, 2) == "//") {
    url.has_authority = true;
    rest.remove_prefix(2);
    std::size_t slash = rest.find('/');
    std::string_view authority = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash);
    if (std::size_t at = authority.rfind('@'); at != std::string_view::npos) {
      std::string_view userinfo = authority.substr(0, at);
      authority = authority.substr(at + 1);
      std::size_t c = userinfo.find(':');
      url.user = percent_decode(userinfo.substr(0, c), text);
      if (c != std::string_view::npos) url.password = percent_decode(userinfo.substr(c + 1), text);
    }
    std::string_view host = authority;
    std::string_view port;
    if (authority.find(',') != std::string_view::npos) {
      // A list of servers (host:port,host:port: Redis Sentinel and Cluster seeds): the
      // whole list is the host, for the store to split; no port.
    } else if (!authority.empty() && authority.front() == '[') {  // [IPv6]:port
      std::size_t close = authority.find(']');
      if (close == std::string_view::npos) bad_url(text, "unclosed '[' in host");
      host = authority.substr(1, close - 1);
      std::string_view after = authority.substr(close + 1);
      if (!after.empty()) {
        if (after.front() != ':') bad_url(text, "junk after ']' in host");
        port = after.substr(1);
      }
    } else if (std::size_t c = authority.rfind(':'); c != std::string_view::npos) {
      host = authority.substr(0, c);
      port = authority.substr(c + 1);
      // "::1" or "fe80::1:6379" cannot be split into a host and a port unambiguously.
      if (host.find(':') != std::string_view::npos) {
        bad_url(text, "an IPv6 host must be in brackets, e.g. [::1]:6379");
      }
    }
    url.host = percent_decode(host, text);
    if (!port.empty()) {
      int value = 0;
      auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
      if (ec != std::errc{} || end != port.data() + port.size() || value <= 0 || value > 65535) {
        bad_url(text, "bad port '" + std::string(port) + "'");
      }
      url.port = value;
    }
  }
  url.path = percent_decode(rest, text);

  while (!query.empty()) {
    std::size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (pair.empty()) continue;
    std::size_t eq = pair.find('=');
    std::string key = percent_decode(pair.substr(0, eq), text);
    std::string value =
        eq == std::string_view::npos ? std::string{} : percent_decode(pair.substr(eq + 1), text);
    if (key.empty()) bad_url(text, "empty query parameter name");
    url.query.emplace_back(std::move(key), std::move(value));
  }
  return url;
}

}  // namespace idem
