#pragma once

// What the Redis store keeps on the server, and how it names it (docs/stores/redis.md):
//
//   - one string key per record: PREFIX "{" esc(scope) ":" esc(key) "}"
//     where esc() writes '%', ':', '{' and '}' as %25, %3A, %7B and %7D and every other byte
//     as it is (NUL included). esc() is injective and never writes ':' or '}', so the pair
//     is recovered by splitting at the one ':' inside the braces, and the braces are the
//     key's only hash tag: Redis Cluster places a record by its full (scope, key).
//   - its value: a 37-byte header of fixed-width big-endian fields, then for an IN_PROGRESS
//     record the fingerprint section, for a COMPLETE one the fingerprint section and the
//     payload. The Lua scripts (redis_scripts.h) read and write the header with Redis's
//     `struct` library; they never parse the fingerprint section, which the client builds.
//
//     offset  size  IN_PROGRESS ('P')   COMPLETE ('C')   tombstone ('T')
//     0       1     kind                kind             kind
//     1       8     token               token            token
//     9       8     acquired_at         completed_at     0
//     17      8     lease_expires_at    0                0
//     25      8     expires_at          expires_at       0
//     33      4     attempt             0                0
//     37      1+4+n fingerprint: a flag byte (0 none, 1 present), its length, its bytes
//     42+n    ...   -                   payload          -
//
//   Times are milliseconds since the epoch by the server's clock (TIME); tokens are
//   microseconds (docs/stores/redis.md, "Tokens"). Tombstones were written by earlier
//   versions (a record deleted before the server clock had passed its token) and expire on
//   their own; this version reads them as absent and never writes one.
//   - one more string key per store: PREFIX "tokens", the token key, holding the largest
//     token the store has issued (8 bytes, big-endian). It has no braces, so it is never a
//     record's key. On Redis Cluster there is one per hash slot, in that slot:
//     PREFIX "tokens{" tag "}" with a tag of that slot (redis_store.cpp, slot_tags()).

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idem::redis {

inline constexpr std::size_t kHeaderBytes = 37;
inline constexpr char kKindInProgress = 'P';
inline constexpr char kKindComplete = 'C';
inline constexpr char kKindTombstone = 'T';
// Redis Cluster's number of hash slots.
inline constexpr unsigned kHashSlots = 16384;
// Tokens are exact in the scripts' Lua numbers (doubles) below this (until the year 2255).
inline constexpr std::uint64_t kMaxToken = std::uint64_t{1} << 53;

// The store's token key under `prefix` (see above).
std::string token_key(std::string_view prefix);

// The Redis key of record (scope, key) under `prefix`.
void append_record_key(std::string& out, std::string_view prefix, std::string_view scope,
                       std::string_view key);
std::string record_key(std::string_view prefix, std::string_view scope, std::string_view key);
// The size of that key, without building it.
std::size_t record_key_size(std::string_view prefix, std::string_view scope, std::string_view key);

// The inverse of record_key for a key under `prefix`; nullopt when `redis_key` is not one.
// (Used by tests to show the encoding is injective.)
struct RecordId {
  std::string scope;
  std::string key;
};
std::optional<RecordId> parse_record_key(std::string_view prefix, std::string_view redis_key);

// The Redis Cluster hash slot of a key: CRC16 (XMODEM) of its hash tag, or of the whole key
// when it has none, modulo 16384.
unsigned hash_slot(std::string_view redis_key);
// hash_slot(record_key(prefix, scope, key)), without building the key.
unsigned record_slot(std::string_view prefix, std::string_view scope, std::string_view key);

// The fingerprint section of a value, as the acquire script stores it after the header.
void append_fingerprint_section(std::string& out, std::optional<std::string_view> fingerprint);

// A record value decoded; views into the value it was decoded from.
struct StoredRecord {
  char kind = kKindInProgress;
  std::uint64_t token = 0;
  std::int64_t at = 0;  // acquired_at (IN_PROGRESS) or completed_at (COMPLETE), ms
  std::int64_t lease_expires_at = 0;
  std::int64_t expires_at = 0;
  std::uint32_t attempt = 0;
  std::optional<std::string_view> fingerprint;
  std::string_view payload;
};

// Decodes a value; nullopt when it is not a record this build can read (an unknown kind or
// a truncated value).
std::optional<StoredRecord> decode_record(std::string_view value);

// RESP (the Redis protocol) requests, written into one buffer so a batch of commands goes
// out with one write. Every argument is a length-prefixed bulk string: binary safe.
class CommandWriter {
 public:
  explicit CommandWriter(std::string& out) : out_(out) {}
  CommandWriter& begin(std::size_t argc) {
    out_.push_back('*');
    number(static_cast<std::int64_t>(argc));
    return *this;
  }
  CommandWriter& arg(std::string_view value) {
    out_.push_back('$');
    number(static_cast<std::int64_t>(value.size()));
    out_.append(value);
    out_.append("\r\n", 2);
    return *this;
  }
  // An argument of `size` bytes that write(out) appends, with no copy made first.
  template <typename Write>
  CommandWriter& arg_of(std::size_t size, Write&& write) {
    out_.push_back('$');
    number(static_cast<std::int64_t>(size));
    write(out_);
    out_.append("\r\n", 2);
    return *this;
  }
  CommandWriter& arg(std::int64_t value) {
    char digits[24];
    auto [end, ec] = std::to_chars(digits, digits + sizeof digits, value);
    (void)ec;
    return arg(std::string_view(digits, static_cast<std::size_t>(end - digits)));
  }

 private:
  void number(std::int64_t n) {
    char digits[24];
    auto [end, ec] = std::to_chars(digits, digits + sizeof digits, n);
    (void)ec;
    out_.append(digits, end);
    out_.append("\r\n", 2);
  }
  std::string& out_;
};

}  // namespace idem::redis
