// Fuzzes how each store turns a (scope, key) pair into what it keeps or sends:
//   - the in-process record id (src/core/record_id.h: the memory store, the heartbeat, the
//     PostgreSQL batcher): decodes back to the pair, injective;
//   - the Redis key layout (src/stores/redis/redis_layout.h): round trip through
//     parse_record_key, injective, one hash tag holding the whole record id, size as
//     record_key_size says; parse_record_key accepts only keys record_key writes (one
//     spelling per pair); decode_record accepts any bytes without reading out of bounds;
//   - the PostgreSQL bytea[] parameters (src/stores/postgres/postgres_connection.h): decoded by
//     the server's binary array format (array_recv), they give back every element byte for
//     byte, NULLs as NULLs.
// SPEC §2 and §10: scopes and keys are any bytes, ("a:b","c") and ("a","b:c") differ, and
// nothing a caller sends reaches a store as anything but data.

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/record_id.h"
#include "idem/store.h"

#if IDEM_FUZZ_REDIS
#include "stores/redis/redis_layout.h"
#endif
#if IDEM_FUZZ_POSTGRES
#include "stores/postgres/postgres_connection.h"
#endif

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_record_keys: %s\n", what);
  std::abort();
}

struct Pair {
  std::string scope;
  std::string key;
  bool operator==(const Pair&) const = default;
};

Pair consume_pair(FuzzedDataProvider& in) {
  Pair p;
  p.scope = in.ConsumeRandomLengthString(idem::kMaxScopeBytes);
  p.key = in.ConsumeRandomLengthString(idem::kMaxKeyBytes);
  return p;
}

void check_record_id(const Pair& a, const Pair& b) {
  std::string id_a;
  std::string id_b;
  idem::detail::encode_record_id(id_a, a.scope, a.key);
  idem::detail::encode_record_id(id_b, b.scope, b.key);
  if (idem::detail::record_id_scope(id_a) != a.scope ||
      idem::detail::record_id_key(id_a) != a.key) {
    fail("record id does not decode to its pair");
  }
  if ((id_a == id_b) != (a == b)) fail("record id is not injective");
}

#if IDEM_FUZZ_REDIS
std::string without_braces(std::string text) {
  // The store refuses a prefix with '{' or '}' (it would add a hash tag).
  for (char& c : text) {
    if (c == '{' || c == '}') c = '_';
  }
  return text;
}

void check_redis(const std::string& prefix, const Pair& a, const Pair& b, std::string_view raw) {
  namespace r = idem::redis;
  const std::string ka = r::record_key(prefix, a.scope, a.key);
  const std::string kb = r::record_key(prefix, b.scope, b.key);
  if (ka.size() != r::record_key_size(prefix, a.scope, a.key)) fail("record_key_size is wrong");
  const std::optional<r::RecordId> back = r::parse_record_key(prefix, ka);
  if (!back || back->scope != a.scope || back->key != a.key) {
    fail("redis key does not round-trip");
  }
  if ((ka == kb) != (a == b)) fail("redis key layout is not injective");
  // The hash tag is the whole braced part: every record lands by its full (scope, key).
  const std::size_t open = ka.find('{');
  if (open != prefix.size() || ka.find('}', open) != ka.size() - 1) {
    fail("redis key has a hash tag other than its record id");
  }
  if (r::hash_slot(ka) >= r::kHashSlots) fail("hash slot out of range");
  // Any key that parses is the one spelling record_key writes for what it parses to.
  const std::string under_prefix = prefix + std::string(raw);
  if (const std::optional<r::RecordId> id = r::parse_record_key(prefix, under_prefix)) {
    if (r::record_key(prefix, id->scope, id->key) != under_prefix) {
      fail("parse_record_key accepts a key record_key never writes");
    }
  }
  (void)r::hash_slot(raw);
  if (const std::optional<r::StoredRecord> rec = r::decode_record(raw)) {
    const char* begin = raw.data();
    const char* end = raw.data() + raw.size();
    auto inside = [&](std::string_view v) {
      return v.empty() || (v.data() >= begin && v.data() + v.size() <= end);
    };
    if (!inside(rec->payload) || (rec->fingerprint && !inside(*rec->fingerprint))) {
      fail("decode_record returned a view outside the value");
    }
  }
}
#endif

#if IDEM_FUZZ_POSTGRES
std::uint32_t read_u32(std::string_view v, std::size_t at) {
  if (at + 4 > v.size()) fail("bytea[] parameter truncated");
  std::uint32_t n = 0;
  for (std::size_t i = 0; i < 4; ++i) n = (n << 8) | static_cast<unsigned char>(v[at + i]);
  return n;
}

// array_recv for a one-dimensional bytea[]: what the server makes of the parameter.
std::vector<std::optional<std::string>> decode_bytea_array(std::string_view v) {
  if (read_u32(v, 0) != 1) fail("bytea[] is not one-dimensional");
  const bool has_null = read_u32(v, 4) != 0;
  if (read_u32(v, 8) != idem::postgres::kByteaOid) fail("bytea[] element type is not bytea");
  const std::uint32_t n = read_u32(v, 12);
  if (read_u32(v, 16) != 1) fail("bytea[] lower bound is not 1");
  std::size_t at = 20;
  std::vector<std::optional<std::string>> out;
  bool saw_null = false;
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::uint32_t len = read_u32(v, at);
    at += 4;
    if (len == 0xffffffffu) {
      out.emplace_back(std::nullopt);
      saw_null = true;
      continue;
    }
    if (at + len > v.size()) fail("bytea[] element runs past the parameter");
    out.emplace_back(std::string(v.substr(at, len)));
    at += len;
  }
  if (at != v.size()) fail("bytea[] parameter has trailing bytes");
  if (saw_null != has_null) fail("bytea[] null flag is wrong");
  return out;
}

void check_postgres(const std::vector<Pair>& pairs) {
  using idem::postgres::Params;
  std::vector<std::string_view> scopes;
  std::vector<std::optional<std::string_view>> keys_or_null;
  for (const Pair& p : pairs) {
    scopes.push_back(p.scope);
    keys_or_null.push_back(p.key.empty() ? std::nullopt : std::optional<std::string_view>(p.key));
  }
  Params params;
  params.bytea_array(scopes).bytea_array(keys_or_null).bytes(pairs.front().key);
  if (params.size() != 3) fail("wrong parameter count");
  const char* const* values = params.values();
  auto value = [&](int i) {
    return std::string_view(values[i], static_cast<std::size_t>(params.lengths()[i]));
  };
  const auto got_scopes = decode_bytea_array(value(0));
  const auto got_keys = decode_bytea_array(value(1));
  if (got_scopes.size() != pairs.size() || got_keys.size() != pairs.size()) {
    fail("bytea[] element count is wrong");
  }
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    if (got_scopes[i] != pairs[i].scope) fail("bytea[] scope does not round-trip");
    const std::optional<std::string> want_key =
        pairs[i].key.empty() ? std::nullopt : std::optional<std::string>(pairs[i].key);
    if (got_keys[i] != want_key) fail("bytea[] key does not round-trip");
  }
  if (value(2) != pairs.front().key || params.formats()[2] != 1) {
    fail("bytea parameter is not the key's bytes in binary format");
  }
}
#endif

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const std::string raw = in.ConsumeRandomLengthString(4 * idem::kMaxKeyBytes);
  const std::string prefix = in.ConsumeRandomLengthString(32);
  std::vector<Pair> pairs;
  pairs.push_back(consume_pair(in));
  // The second pair is often a near miss of the first: the same bytes split elsewhere.
  if (in.ConsumeBool()) {
    const std::string joined = pairs[0].scope + pairs[0].key;
    const std::size_t cut = in.ConsumeIntegralInRange<std::size_t>(0, joined.size());
    pairs.push_back(Pair{joined.substr(0, cut), joined.substr(cut)});
    if (pairs[1].scope.size() > idem::kMaxScopeBytes) pairs.pop_back();
  }
  while (pairs.size() < 2 || (in.remaining_bytes() > 0 && pairs.size() < 8)) {
    pairs.push_back(consume_pair(in));
  }

  for (std::size_t i = 0; i + 1 < pairs.size(); ++i) check_record_id(pairs[i], pairs[i + 1]);
#if IDEM_FUZZ_REDIS
  const std::string redis_prefix = without_braces(prefix);
  for (std::size_t i = 0; i + 1 < pairs.size(); ++i) {
    check_redis(redis_prefix, pairs[i], pairs[i + 1], raw);
  }
#endif
#if IDEM_FUZZ_POSTGRES
  check_postgres(pairs);
#endif
  (void)prefix;
  (void)raw;
  return 0;
}
