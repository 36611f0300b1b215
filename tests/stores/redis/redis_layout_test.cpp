// The Redis store's key layout and record format (src/stores/redis/redis_layout.h), and its
// URL: no server needed.

#include "stores/redis/redis_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"
#include "idem/stores/redis_store.h"
#include "stores/redis/redis_test_util.h"

namespace idem::redis {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string bytes(const char* text, std::size_t n) { return std::string(text, n); }

// Scopes and keys made of the bytes the encoding treats specially, plus NUL and the
// longest inputs SPEC §10 allows.
std::vector<std::string> hostile() {
  return {"a",
          ":",
          "{",
          "}",
          "%",
          "%3A",
          "{}",
          "}{",
          "a:b",
          "b:c",
          bytes("\0", 1),
          bytes("a\0:b", 4),
          "{tag}",
          "x}y{z",
          "%25",
          std::string(255, ':'),
          std::string(1024, '}'),
          std::string(1024, '\xff')};
}

TEST(RedisLayout, RecordKeyRoundTripsEveryHostileScopeAndKey) {
  for (const std::string& scope : hostile()) {
    for (const std::string& key : hostile()) {
      const std::string k = record_key("idem:", scope, key);
      const auto id = parse_record_key("idem:", k);
      ASSERT_TRUE(id.has_value()) << k;
      EXPECT_TRUE(id->scope == scope && id->key == key) << k;
    }
  }
}

TEST(RedisLayout, RecordKeyIsInjectiveOverEveryShortPair) {
  // Every (scope, key) of 1 to 3 bytes from an alphabet of the special bytes: 258 strings
  // each, 66 564 pairs, all with distinct keys (SPEC §2, §10).
  const std::string alphabet = std::string("a:{}%\0", 6);
  std::vector<std::string> strings;
  for (char a : alphabet) {
    strings.emplace_back(1, a);
    for (char b : alphabet) {
      strings.push_back(std::string{a, b});
      for (char c : alphabet) strings.push_back(std::string{a, b, c});
    }
  }
  std::set<std::string> keys;
  for (const std::string& scope : strings) {
    for (const std::string& key : strings) keys.insert(record_key("p:", scope, key));
  }
  EXPECT_EQ(keys.size(), strings.size() * strings.size());
}

TEST(RedisLayout, PairsThatConcatenateAlikeGetDifferentKeys) {
  EXPECT_NE(record_key("idem:", "a:b", "c"), record_key("idem:", "a", "b:c"));
  EXPECT_NE(record_key("idem:", "a%", "3Ab"), record_key("idem:", "a:", "b"));
  EXPECT_NE(record_key("idem:", "a}", "b"), record_key("idem:", "a", "}b"));
  EXPECT_EQ(record_key("idem:", "payments", "req-1"), "idem:{payments:req-1}");
}

TEST(RedisLayout, EveryRecordKeyHasOneHashTagHoldingTheWholeRecordId) {
  for (const std::string& scope : hostile()) {
    for (const std::string& key : hostile()) {
      const std::string k = record_key("app:idem:", scope, key);
      // Redis Cluster hashes the bytes between the first '{' and the next '}': exactly the
      // escaped pair, whatever the pair holds, so the slot depends on the record alone.
      const std::size_t open = k.find('{');
      ASSERT_EQ(open, std::string("app:idem:").size());
      ASSERT_EQ(k.find('}', open + 1), k.size() - 1) << k;
      const std::string tag = k.substr(open + 1, k.size() - open - 2);
      EXPECT_EQ(hash_slot(k), hash_slot(tag)) << k;
      EXPECT_EQ(hash_slot(k), hash_slot(record_key("other:", scope, key))) << k;
    }
  }
}

TEST(RedisLayout, HashSlotFollowsTheRedisClusterSpecification) {
  // Test vectors from the Redis Cluster specification and CLUSTER KEYSLOT.
  EXPECT_EQ(hash_slot("123456789"), 0x31C3u);
  EXPECT_EQ(hash_slot("foo"), 12182u);
  EXPECT_EQ(hash_slot("bar"), 5061u);
  EXPECT_EQ(hash_slot("{user1000}.following"), hash_slot("{user1000}.followers"));
  EXPECT_EQ(hash_slot("foo{}{bar}"), hash_slot("foo{}{bar}"));
  EXPECT_NE(hash_slot("foo{}{bar}"), hash_slot("bar"));  // an empty tag: the whole key
  EXPECT_EQ(hash_slot("foo{{bar}}zap"), hash_slot("{bar"));
  EXPECT_EQ(hash_slot("foo{bar}{zap}"), hash_slot("bar"));
}

TEST(RedisLayout, RecordSlotIsTheSlotOfTheRecordKey) {
  // record_slot hashes the key without building it; prefixes with braces (which may hold
  // the hash tag themselves) take the slow path. Either way: the slot Redis computes.
  for (const std::string prefix : {"idem:", "", "a{b}:", "x{:", "}{"}) {
    for (const std::string& scope : hostile()) {
      for (const std::string& key : hostile()) {
        ASSERT_EQ(record_slot(prefix, scope, key), hash_slot(record_key(prefix, scope, key)))
            << prefix << " " << scope << " " << key;
      }
    }
  }
}

TEST(RedisLayout, ForeignKeysDoNotParseAsRecords) {
  EXPECT_FALSE(parse_record_key("idem:", "idem:{a}").has_value());       // no ':'
  EXPECT_FALSE(parse_record_key("idem:", "other:{a:b}").has_value());    // prefix
  EXPECT_FALSE(parse_record_key("idem:", "idem:{a:b:c}").has_value());   // raw ':'
  EXPECT_FALSE(parse_record_key("idem:", "idem:{a%3a:b}").has_value());  // lowercase
  EXPECT_FALSE(parse_record_key("idem:", "idem:{a%41:b}").has_value());  // 'A' escaped
  EXPECT_FALSE(parse_record_key("idem:", "idem:{a%3:b}").has_value());   // truncated
}

// A value built by hand from the layout in redis_layout.h.
std::string value(char kind, std::uint64_t token, std::uint64_t at, std::uint64_t lease,
                  std::uint64_t expires, std::uint32_t attempt, std::string tail) {
  std::string v(1, kind);
  for (std::uint64_t n : {token, at, lease, expires}) {
    for (int shift = 56; shift >= 0; shift -= 8) v.push_back(static_cast<char>(n >> shift));
  }
  for (int shift = 24; shift >= 0; shift -= 8) v.push_back(static_cast<char>(attempt >> shift));
  return v + tail;
}

TEST(RedisLayout, RecordValuesDecodeFieldByField) {
  std::string fp;
  append_fingerprint_section(fp, std::string_view("f\0p", 3));
  const std::string in_progress = value('P', 1'700'000'000'123'456, 1'700'000'000'123,
                                        1'700'000'030'123, 1'700'086'400'123, 7, fp);
  const auto p = decode_record(in_progress);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->kind, kKindInProgress);
  EXPECT_EQ(p->token, 1'700'000'000'123'456u);
  EXPECT_EQ(p->at, 1'700'000'000'123);
  EXPECT_EQ(p->lease_expires_at, 1'700'000'030'123);
  EXPECT_EQ(p->expires_at, 1'700'086'400'123);
  EXPECT_EQ(p->attempt, 7u);
  EXPECT_EQ(p->fingerprint, std::optional<std::string_view>(std::string_view("f\0p", 3)));

  std::string none;
  append_fingerprint_section(none, std::nullopt);
  const std::string complete = value('C', 5, 6, 0, 8, 0, none + bytes("pay\0load", 8));
  const auto c = decode_record(complete);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->kind, kKindComplete);
  EXPECT_EQ(c->fingerprint, std::nullopt);
  EXPECT_EQ(c->payload, bytes("pay\0load", 8));
}

TEST(RedisLayout, MalformedValuesAreRejected) {
  std::string fp;
  append_fingerprint_section(fp, "fp");
  EXPECT_FALSE(decode_record("").has_value());
  EXPECT_FALSE(decode_record(value('X', 1, 2, 3, 4, 5, fp)).has_value());        // unknown kind
  EXPECT_FALSE(decode_record(value('P', 1, 2, 3, 4, 5, "")).has_value());        // no fp section
  EXPECT_FALSE(decode_record(value('P', 1, 2, 3, 4, 5, fp + "x")).has_value());  // payload
  EXPECT_FALSE(decode_record(value('C', 1, 2, 3, 4, 5, fp.substr(0, 6))).has_value());
  EXPECT_TRUE(decode_record(value('T', 1, 0, 0, 0, 0, "")).has_value());
}

// --- the URL -------------------------------------------------------------------------------

void expect_bad_url(const std::string& url, const std::string& why) {
  try {
    (void)open_store(url);
    ADD_FAILURE() << url << " was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr(why)) << url;
    EXPECT_THAT(e.what(), Not(HasSubstr("hunter2"))) << url;
  }
}

TEST(RedisUrl, MalformedUrlsAreRefusedBeforeConnecting) {
  expect_bad_url("redis:host", "needs '//'");
  expect_bad_url("redis://h/x", "'database (the URL's path)' must be a whole number");
  expect_bad_url("redis://h/-1", "must be a whole number");
  expect_bad_url("redis://h/0?db=2", "unknown parameter 'db'");
  expect_bad_url("redis://h/0?nope=1", "unknown parameter 'nope'");
  expect_bad_url("redis://h/0?connections=0", "'connections' must be a whole number from 1");
  expect_bad_url("redis://h/0?connections=65", "from 1 to 64");
  expect_bad_url("redis://h/0?timeout=0", "'timeout'");
  expect_bad_url("redis://h/0?timeout=1s", "'timeout'");
  expect_bad_url("redis://h/0?wait_replicas=-1", "'wait_replicas'");
  expect_bad_url("redis://h/0?replay=maybe", "'replay' must be 'script' or 'get'");
  expect_bad_url("redis://u:hunter2@h/0?prefix=a%7Bb", "must not contain '{' or '}'");
  expect_bad_url("unix://host/tmp/redis.sock", "takes a socket path, not a host");
  expect_bad_url("unix://", "needs an absolute socket path");
  expect_bad_url("unix:relative.sock", "needs '//'");
  expect_bad_url("unix:///tmp/r.sock?db=x", "'db' must be a whole number");
}

TEST(RedisUrl, AnUnreachableServerIsNamedWithoutItsPassword) {
  const std::string port = std::to_string(testing::unused_port());
  try {
    (void)open_store("redis://app:hunter2@127.0.0.1:" + port + "/3?connect_timeout=2000");
    ADD_FAILURE() << "opened a store on a closed port";
  } catch (const StoreUnavailable& e) {
    EXPECT_EQ(e.store(), "redis://app:***@127.0.0.1:" + port + "/3");
    EXPECT_THAT(e.what(), AllOf(HasSubstr("cannot connect"), HasSubstr("refused"),
                                Not(HasSubstr("hunter2"))));
  }
  try {
    (void)open_store("unix://:hunter2@/nonexistent/idem/redis.sock?db=2");
    ADD_FAILURE() << "opened a store on a missing socket";
  } catch (const StoreUnavailable& e) {
    EXPECT_EQ(e.store(), "unix://:***@/nonexistent/idem/redis.sock?db=2");
    EXPECT_THAT(e.what(), AllOf(HasSubstr("cannot connect"), HasSubstr("No such file"),
                                Not(HasSubstr("hunter2"))));
  }
}

TEST(RedisUrl, BothSchemesAreAvailable) {
  const std::vector<std::string> schemes = available_schemes();
  EXPECT_THAT(schemes, ::testing::IsSupersetOf({"redis", "unix"}));
}

}  // namespace
}  // namespace idem::redis
