#pragma once

// Percent-encoding (RFC 3986 §2.1), written once for every URL and URI idem builds: the
// default store's URL, SQLite's file: URIs, and the messages that name a byte of a URL.

#include <string>
#include <string_view>

namespace idem::detail {

// "%XX" for the byte `c`, upper-case hex as RFC 3986 §2.1 recommends.
inline void append_percent_escape(std::string& out, unsigned char c) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  out += '%';
  out += kHex[c >> 4];
  out += kHex[c & 0xf];
}

// `text` with every byte for which `keep` is false percent-encoded.
template <typename Keep>
void append_percent_encoded(std::string& out, std::string_view text, Keep keep) {
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (keep(u)) {
      out += c;
    } else {
      append_percent_escape(out, u);
    }
  }
}

}  // namespace idem::detail
