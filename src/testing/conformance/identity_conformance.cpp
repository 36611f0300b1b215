// SPEC §2 and §10: tokens, what identifies a record, and byte-exact payloads.

#include <gmock/gmock.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "conformance/test_data.h"
#include "idem/testing/matchers.h"
#include "idem/testing/store_conformance.h"

namespace idem::testing {
namespace {

using namespace std::string_literals;

TEST_P(StoreConformance, TokensStrictlyIncreasePerKeyThroughEveryEdge) {
  std::vector<Token> tokens;
  auto fresh = [&](Duration lease, Duration ttl) {
    tokens.push_back(acquire_fresh("s", "k", lease, ttl).token);
  };

  fresh(live(), live());
  // After a release.
  ASSERT_THAT(store().release("s", "k", tokens.back()), IsDone());
  fresh(ticks(2), live());
  // After a steal.
  pass(ticks(3));
  const AcquireResult stolen = store().acquire("s", "k", live(), live());
  ASSERT_THAT(stolen, IsStolen(2));
  tokens.push_back(std::get<Acquired>(stolen).lease.token);
  // After a forget.
  ASSERT_TRUE(store().forget("s", "k"));
  fresh(live(), live());
  // After an expired COMPLETE is replaced.
  ASSERT_THAT(store().complete("s", "k", tokens.back(), "p", ticks(2)), IsDone());
  pass(ticks(3));
  fresh(ticks(2), ticks(2));
  // After a purge.
  pass(ticks(3));
  store().purge(100);
  ASSERT_EQ(store().get("s", "k"), std::nullopt);
  fresh(live(), live());

  // SPEC §2: each token is strictly greater than every earlier one for the same key.
  for (std::size_t i = 1; i < tokens.size(); ++i) {
    EXPECT_GT(tokens[i], tokens[i - 1]) << "token " << i;
  }
}

TEST_P(StoreConformance, TokensAreUniqueWithinStore) {
  if (!store_wide_tokens()) {
    GTEST_SKIP() << "the store does not claim tokens unique across keys (SPEC §2)";
  }
  std::set<Token> seen;
  for (const char* scope : {"s", "t"}) {
    for (int i = 0; i < 20; ++i) {
      const Token token = acquire_fresh(scope, "k" + std::to_string(i), live(), live()).token;
      // SPEC §2: unique within a store, across keys and scopes.
      EXPECT_TRUE(seen.insert(token).second) << "token " << token << " issued twice";
    }
  }
}

TEST_P(StoreConformance, BinaryScopesAndKeysAreExact) {
  // SPEC §2: scope and key are arbitrary bytes; records are identified by the exact pair.
  const std::vector<std::string> scopes = {"s"s, "s\0"s, "\0s"s, "\xff\xfe"s, "S"s};
  const std::vector<std::string> keys = {"k"s,    "k\0"s,  "k\0x"s,         "\0"s,
                                         "\0\0"s, "\xff"s, "\x80\x00\x7f"s, "K"s};
  int n = 0;
  for (const std::string& scope : scopes) {
    for (const std::string& key : keys) {
      acquire_and_complete(scope, key, "payload-" + std::to_string(n++), live());
    }
  }
  n = 0;
  for (const std::string& scope : scopes) {
    for (const std::string& key : keys) {
      const std::string payload = "payload-" + std::to_string(n++);
      EXPECT_THAT(store().acquire(scope, key, live(), live()), IsReplay(payload));
      const Record rec = expect_record(scope, key);
      EXPECT_EQ(rec.payload, payload);
    }
  }
}

TEST_P(StoreConformance, ScopeKeyBoundaryIsPartOfIdentity) {
  // SPEC §2: ("a:b","c") and ("a","b:c") are different records in every store; so are
  // other splits of the same bytes, whatever separator a store might be tempted to use.
  const std::vector<std::pair<std::string, std::string>> pairs = {{"a:b", "c"},
                                                                  {"a", "b:c"},
                                                                  {"ab", "c"},
                                                                  {"a", "bc"},
                                                                  {"a\0"s, "b"},
                                                                  {"a", "\0b"s},
                                                                  {"a/b", "c"},
                                                                  {"a", "b/c"},
                                                                  {"a|b", "c"},
                                                                  {"a", "b|c"},
                                                                  {"\x01", "ab"},
                                                                  {"\x01"
                                                                   "a",
                                                                   "b"},
                                                                  {"a{b}", "c"},
                                                                  {"a", "{b}c"},
                                                                  {"a\x1f", "b"},
                                                                  {"a",
                                                                   "\x1f"
                                                                   "b"}};
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    acquire_and_complete(pairs[i].first, pairs[i].second, "r" + std::to_string(i), live());
  }
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    EXPECT_THAT(store().acquire(pairs[i].first, pairs[i].second, live(), live()),
                IsReplay("r" + std::to_string(i)))
        << "pair " << i;
  }
}

TEST_P(StoreConformance, KeysThatLookLikeCodeAreStoredAsData) {
  // SPEC §10: nothing a caller sends can reach a store as code.
  const std::vector<std::string> keys = {"'; DROP TABLE idem; --",
                                         "\" OR 1=1 --",
                                         "%s%n%x",
                                         "*",
                                         "?",
                                         "\\",
                                         "${HOME}",
                                         "$1",
                                         "\r\n",
                                         "a:*",
                                         "{tag}",
                                         "KEYS *"};
  for (std::size_t i = 0; i < keys.size(); ++i) {
    acquire_and_complete("scope'\"", keys[i], keys[i] + "!", live());
  }
  for (const std::string& key : keys) {
    EXPECT_THAT(store().acquire("scope'\"", key, live(), live()), IsReplay(key + "!")) << key;
  }
  EXPECT_EQ(store().get("scope'\"", "a:b"), std::nullopt);
}

TEST_P(StoreConformance, MaxLengthScopeAndKeyWork) {
  const std::string scope = binary_payload(kMaxScopeBytes, 1);
  const std::string key = binary_payload(kMaxKeyBytes, 2);
  std::string other_key = key;
  other_key.back() = static_cast<char>(other_key.back() ^ 1);

  const Lease lease = acquire_fresh(scope, key, live(), live(), "fp");
  EXPECT_THAT(store().get(scope, key), IsInProgressWith(lease.token));
  EXPECT_EQ(store().get(scope, other_key), std::nullopt);
  ASSERT_THAT(store().extend(scope, key, lease.token, live()), IsDone());
  ASSERT_THAT(store().complete(scope, key, lease.token, "long", live()), IsDone());
  EXPECT_THAT(store().acquire(scope, key, live(), live()), IsReplay("long"));
  EXPECT_THAT(store().acquire(scope, other_key, live(), live()), IsFreshlyAcquired());
  EXPECT_TRUE(store().forget(scope, key));
  EXPECT_EQ(store().get(scope, key), std::nullopt);
}

TEST_P(StoreConformance, PayloadsRoundTripByteExact) {
  const std::vector<std::string> payloads = {"", "\0"s, all_bytes(),
                                             binary_payload(kDefaultMaxPayloadBytes, 3),
                                             binary_payload(4 * kDefaultMaxPayloadBytes + 7, 4)};
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    SCOPED_TRACE("payload " + std::to_string(i));
    const std::string key = "k" + std::to_string(i);
    acquire_and_complete("s", key, payloads[i], live());
    EXPECT_THAT(store().acquire("s", key, live(), live()), IsReplay(payloads[i]));
    const Record rec = expect_record("s", key);
    EXPECT_TRUE(rec.payload == payloads[i])
        << "get returned " << rec.payload.size() << " bytes for " << payloads[i].size();
  }
}

TEST_P(StoreConformance, LargestPayloadRoundTripsByteExact) {
  // SPEC §10: payloads are configurable up to 64 MiB, so a store must hold that much.
  const std::string payload = binary_payload(kMaxPayloadBytes, 5);
  acquire_and_complete("s", "k", payload, live());
  const AcquireResult r = store().acquire("s", "k", live(), live());
  ASSERT_THAT(r, IsReplay());
  EXPECT_TRUE(std::get<Replay>(r).payload == payload)
      << "replayed " << std::get<Replay>(r).payload.size() << " bytes";
}

}  // namespace
}  // namespace idem::testing
