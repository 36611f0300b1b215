#include "stores/redis/redis_layout.h"

#include <array>

namespace idem::redis {
namespace {

constexpr char kHex[] = "0123456789ABCDEF";

// SPEC §10: nothing a caller sends can reach Redis as anything but bytes of one key. Only
// the four bytes that structure the key are escaped; the rest (NUL included) stay as they
// are, so an ordinary key reads plainly in redis-cli.
bool escaped(char c);

std::size_t escaped_size(std::string_view text) {
  std::size_t n = text.size();
  for (const char c : text) {
    if (escaped(c)) n += 2;
  }
  return n;
}

bool escaped(char c) { return c == '%' || c == ':' || c == '{' || c == '}'; }

// Calls plain(run) for each run of bytes that stay as they are and plain(three bytes) for
// each escaped one, in order.
template <typename Plain>
void for_each_escaped(std::string_view text, const Plain& plain) {
  std::size_t from = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (!escaped(text[i])) continue;
    if (i > from) plain(text.substr(from, i - from));
    const auto u = static_cast<unsigned char>(text[i]);
    const char three[3] = {'%', kHex[u >> 4], kHex[u & 15]};
    plain(std::string_view(three, 3));
    from = i + 1;
  }
  if (from < text.size()) plain(text.substr(from));
}

void append_escaped(std::string& out, std::string_view text) {
  for_each_escaped(text, [&](std::string_view run) { out.append(run); });
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The inverse of append_escaped; nullopt for text it cannot have written.
std::optional<std::string> unescape(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ':' || c == '{' || c == '}') return std::nullopt;
    if (c != '%') {
      out.push_back(c);
      continue;
    }
    if (i + 2 >= text.size()) return std::nullopt;
    const int hi = hex_value(text[i + 1]);
    const int lo = hex_value(text[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    const char decoded = static_cast<char>(hi * 16 + lo);
    // Only the four escaped bytes are ever written as %XX; anything else would give one
    // pair two spellings.
    if (decoded != '%' && decoded != ':' && decoded != '{' && decoded != '}') return std::nullopt;
    out.push_back(decoded);
    i += 2;
  }
  return out;
}

std::uint64_t read_u64(std::string_view v, std::size_t at) {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < 8; ++i) n = (n << 8) | static_cast<unsigned char>(v[at + i]);
  return n;
}

std::uint32_t read_u32(std::string_view v, std::size_t at) {
  std::uint32_t n = 0;
  for (std::size_t i = 0; i < 4; ++i) n = (n << 8) | static_cast<unsigned char>(v[at + i]);
  return n;
}

void append_u32(std::string& out, std::uint32_t n) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((n >> shift) & 0xff));
  }
}

// CRC16-CCITT (XModem: polynomial 0x1021, initial value 0), the checksum Redis Cluster
// hashes keys with, one table lookup per byte. The table is computed at compile time from
// the polynomial.
constexpr std::array<std::uint16_t, 256> kCrc16Table = [] {
  std::array<std::uint16_t, 256> table{};
  for (unsigned byte = 0; byte < 256; ++byte) {
    auto crc = static_cast<std::uint16_t>(byte << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<std::uint16_t>(crc << 1);
    }
    table[byte] = crc;
  }
  return table;
}();

std::uint16_t crc16(std::string_view data, std::uint16_t crc = 0) {
  for (const char c : data) {
    crc = static_cast<std::uint16_t>(
        (crc << 8) ^ kCrc16Table[((crc >> 8) ^ static_cast<unsigned char>(c)) & 0xff]);
  }
  return crc;
}

}  // namespace

void append_record_key(std::string& out, std::string_view prefix, std::string_view scope,
                       std::string_view key) {
  out.append(prefix);
  out.push_back('{');
  append_escaped(out, scope);
  out.push_back(':');
  append_escaped(out, key);
  out.push_back('}');
}

std::string token_key(std::string_view prefix) { return std::string(prefix) + "tokens"; }

std::size_t record_key_size(std::string_view prefix, std::string_view scope, std::string_view key) {
  return prefix.size() + escaped_size(scope) + escaped_size(key) + 3;
}

std::string record_key(std::string_view prefix, std::string_view scope, std::string_view key) {
  std::string out;
  append_record_key(out, prefix, scope, key);
  return out;
}

std::optional<RecordId> parse_record_key(std::string_view prefix, std::string_view redis_key) {
  if (redis_key.substr(0, prefix.size()) != prefix) return std::nullopt;
  std::string_view rest = redis_key.substr(prefix.size());
  if (rest.size() < 3 || rest.front() != '{' || rest.back() != '}') return std::nullopt;
  rest = rest.substr(1, rest.size() - 2);
  const std::size_t colon = rest.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::optional<std::string> scope = unescape(rest.substr(0, colon));
  std::optional<std::string> key = unescape(rest.substr(colon + 1));
  if (!scope || !key) return std::nullopt;
  return RecordId{std::move(*scope), std::move(*key)};
}

unsigned record_slot(std::string_view prefix, std::string_view scope, std::string_view key) {
  // A prefix with a '{' may hold the hash tag itself: hash the whole key as Redis reads it.
  if (prefix.find('{') != std::string_view::npos) {
    return hash_slot(record_key(prefix, scope, key));
  }
  // Otherwise the tag is what append_record_key writes between its braces (escaped text has
  // no brace, and the ':' keeps the tag from being empty): hash it as it is written.
  std::uint16_t crc = 0;
  const auto hash = [&](std::string_view run) { crc = crc16(run, crc); };
  for_each_escaped(scope, hash);
  hash(":");
  for_each_escaped(key, hash);
  return crc % kHashSlots;
}

unsigned hash_slot(std::string_view redis_key) {
  // Redis Cluster: the bytes between the first '{' and the first '}' after it, when there
  // are any; otherwise the whole key.
  if (const std::size_t open = redis_key.find('{'); open != std::string_view::npos) {
    const std::size_t close = redis_key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      redis_key = redis_key.substr(open + 1, close - open - 1);
    }
  }
  return crc16(redis_key) % kHashSlots;
}

void append_fingerprint_section(std::string& out, std::optional<std::string_view> fingerprint) {
  out.push_back(fingerprint ? '\1' : '\0');
  append_u32(out, fingerprint ? static_cast<std::uint32_t>(fingerprint->size()) : 0);
  if (fingerprint) out.append(*fingerprint);
}

std::optional<StoredRecord> decode_record(std::string_view value) {
  if (value.size() < kHeaderBytes) return std::nullopt;
  StoredRecord r;
  r.kind = value[0];
  if (r.kind != kKindInProgress && r.kind != kKindComplete && r.kind != kKindTombstone)
    return std::nullopt;
  r.token = read_u64(value, 1);
  r.at = static_cast<std::int64_t>(read_u64(value, 9));
  r.lease_expires_at = static_cast<std::int64_t>(read_u64(value, 17));
  r.expires_at = static_cast<std::int64_t>(read_u64(value, 25));
  r.attempt = read_u32(value, 33);
  if (r.kind == kKindTombstone) return r;
  if (value.size() < kHeaderBytes + 5) return std::nullopt;
  const bool has_fingerprint = value[kHeaderBytes] != '\0';
  const std::size_t length = read_u32(value, kHeaderBytes + 1);
  const std::size_t start = kHeaderBytes + 5;
  if (value.size() - start < length) return std::nullopt;
  if (has_fingerprint) r.fingerprint = value.substr(start, length);
  r.payload = value.substr(start + length);
  if (r.kind == kKindInProgress && !r.payload.empty()) return std::nullopt;
  return r;
}

}  // namespace idem::redis
