#include "options.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cctype>
#include <charconv>
#include <stdexcept>

namespace idem::proxy {
namespace {

std::uint16_t parse_port(std::string_view text, std::string_view what) {
  unsigned value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || value > 65535) {
    throw std::invalid_argument("'" + std::string(text) +
                                "' is not a port number (0 to 65535) in " + std::string(what));
  }
  return static_cast<std::uint16_t>(value);
}

// Splits "HOST:PORT" or "[V6]:PORT" into the host (without brackets) and the port text.
std::pair<std::string, std::string_view> split_host_port(std::string_view text,
                                                         std::string_view example) {
  std::size_t colon = std::string_view::npos;
  std::string host;
  if (!text.empty() && text.front() == '[') {
    std::size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      throw std::invalid_argument("expected [IPV6]:PORT, e.g. " + std::string(example));
    }
    host = std::string(text.substr(1, close - 1));
    colon = close + 1;
  } else {
    colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      throw std::invalid_argument("expected HOST:PORT, e.g. " + std::string(example));
    }
    host = std::string(text.substr(0, colon));
  }
  if (host.empty())
    throw std::invalid_argument("the host is missing, e.g. " + std::string(example));
  return {host, text.substr(colon + 1)};
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

template <typename F>
void for_each_item(std::string_view text, F&& f) {
  while (true) {
    std::size_t comma = text.find(',');
    f(trim(text.substr(0, comma)));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
}

}  // namespace

void parse_address(std::string_view text, std::string& address, std::uint16_t& port) {
  auto [host, port_text] = split_host_port(text, "127.0.0.1:8080");
  unsigned char bytes[sizeof(in6_addr)];
  if (::inet_pton(AF_INET, host.c_str(), bytes) != 1 &&
      ::inet_pton(AF_INET6, host.c_str(), bytes) != 1) {
    throw std::invalid_argument("'" + host + "' is not an IPv4 or IPv6 address");
  }
  address = host;
  port = parse_port(port_text, "the address");
}

void parse_listen(std::string_view text, ProxyOptions& options) {
  parse_address(text, options.listen_address, options.listen_port);
}

void parse_upstream(std::string_view text, ProxyOptions& options) {
  constexpr std::string_view kScheme = "http://";
  if (text.substr(0, 8) == "https://") {
    throw std::invalid_argument(
        "https upstreams are not supported; the upstream is a local "
        "service reached over plain HTTP (http://HOST:PORT)");
  }
  if (text.substr(0, kScheme.size()) != kScheme) {
    throw std::invalid_argument("expected http://HOST:PORT, e.g. http://127.0.0.1:3000");
  }
  std::string_view rest = text.substr(kScheme.size());
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos || rest.find('?') != std::string_view::npos) {
    throw std::invalid_argument("the upstream URL must not have a path; requests keep theirs");
  }
  auto [host, port] = split_host_port(rest, "http://127.0.0.1:3000");
  options.upstream_host = host;
  options.upstream_port = parse_port(port, "--upstream");
  if (options.upstream_port == 0) throw std::invalid_argument("the upstream port must not be 0");
}

std::vector<std::string> parse_methods(std::string_view text) {
  std::vector<std::string> out;
  for_each_item(text, [&](std::string_view item) {
    if (item.empty()) throw std::invalid_argument("an empty method in '" + std::string(text) + "'");
    std::string method;
    for (char c : item) {
      if (!std::isalpha(static_cast<unsigned char>(c)) && c != '-' && c != '_') {
        throw std::invalid_argument("'" + std::string(item) + "' is not a method name");
      }
      method += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    out.push_back(std::move(method));
  });
  return out;
}

std::vector<StatusRange> parse_statuses(std::string_view text) {
  std::vector<StatusRange> out;
  if (trim(text) == "none") return out;
  auto number = [&](std::string_view s) {
    unsigned value = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || value < 100 ||
        value > 999) {
      throw std::invalid_argument("'" + std::string(s) + "' is not an HTTP status (100 to 999)");
    }
    return value;
  };
  for_each_item(text, [&](std::string_view item) {
    if (item.size() == 3 && (item.substr(1) == "xx" || item.substr(1) == "XX") && item[0] >= '1' &&
        item[0] <= '9') {
      unsigned first = static_cast<unsigned>(item[0] - '0') * 100;
      out.push_back({first, first + 99});
    } else if (std::size_t dash = item.find('-'); dash != std::string_view::npos) {
      StatusRange r{number(item.substr(0, dash)), number(item.substr(dash + 1))};
      if (r.first > r.last)
        throw std::invalid_argument("'" + std::string(item) + "' is an empty range");
      out.push_back(r);
    } else {
      unsigned status = number(item);
      out.push_back({status, status});
    }
  });
  return out;
}

KeyFormat parse_key_format(std::string_view text) {
  text = trim(text);
  if (text == "any") return KeyFormat::kAny;
  if (text == "uuid") return KeyFormat::kUuid;
  throw std::invalid_argument("'" + std::string(text) + "' is not a key format (any, uuid)");
}

LogFormat parse_log_format(std::string_view text) {
  text = trim(text);
  if (text == "logfmt") return LogFormat::kLogfmt;
  if (text == "json") return LogFormat::kJson;
  throw std::invalid_argument("'" + std::string(text) + "' is not a log format (logfmt, json)");
}

std::string parse_header_name(std::string_view text) {
  // RFC 9110 §5.6.2: a token.
  static constexpr std::string_view kTokenPunctuation = "!#$%&'*+-.^_`|~";
  if (text.empty()) throw std::invalid_argument("a header name must not be empty");
  for (char c : text) {
    if (!std::isalnum(static_cast<unsigned char>(c)) &&
        kTokenPunctuation.find(c) == std::string_view::npos) {
      throw std::invalid_argument("'" + std::string(text) + "' is not a header name");
    }
  }
  return std::string(text);
}

namespace {

// The greedy wildcard match with one backtracking point (linear in practice, never
// exponential): `is_star(p)` says whether a pattern element matches any run of text
// elements, `matches(p, t)` whether it matches one.
template <typename Pattern, typename Text, typename IsStar, typename Matches>
bool wildcard_match(const Pattern& pattern, const Text& text, IsStar is_star, Matches matches) {
  std::size_t p = 0, t = 0, star = std::string_view::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && is_star(pattern[p])) {
      star = p++;
      resume = t;
    } else if (p < pattern.size() && matches(pattern[p], text[t])) {
      ++p;
      ++t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && is_star(pattern[p])) ++p;
  return p == pattern.size();
}

// One path segment against one pattern segment: `*` matches any run of characters.
bool segment_matches(std::string_view pattern, std::string_view text) {
  return wildcard_match(
      pattern, text, [](char c) { return c == '*'; }, [](char a, char b) { return a == b; });
}

std::vector<std::string_view> segments(std::string_view path) {
  std::vector<std::string_view> out;
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  while (true) {
    std::size_t slash = path.find('/');
    out.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return out;
}

}  // namespace

bool path_matches(std::string_view pattern, std::string_view path) {
  if (pattern.find('*') == std::string_view::npos) return pattern == path;
  // The same match one level up: a `**` segment matches any run of segments.
  return wildcard_match(
      segments(pattern), segments(path), [](std::string_view s) { return s == "**"; },
      segment_matches);
}

const Policy& policy_for(const ProxyOptions& options, std::string_view path) {
  for (const Route& route : options.routes) {
    if (path_matches(route.path, path)) return route.policy;
  }
  return options.policy;
}

}  // namespace idem::proxy
