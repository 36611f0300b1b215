// The crash soak's checker (soak_log.h) on hand-written logs: it must find each kind of
// broken rule, and nothing in a log where every rule held.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "soak/soak_log.h"

namespace idem::soak {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const SoakRules kRules{.expiring_ttl_ms = 1500, .durable_ttl_ms = 3'600'000};

std::string pd(Token token, const std::string& key, const std::string& filler = "x") {
  return digest(make_payload(token, key, filler));
}

std::string ran(const std::string& key, Token token, std::int64_t wall, int attempt = 1,
                const std::string& filler = "x") {
  return "ran " + key + " " + std::to_string(token) + " " + std::to_string(attempt) + " " +
         (attempt > 1 ? "1" : "0") + " " + std::to_string(wall) + " " + pd(token, key, filler) +
         "\n";
}

std::string done(const std::string& key, Token token, const std::string& filler = "x") {
  return "done " + key + " " + std::to_string(token) + " " + pd(token, key, filler) + "\n";
}

std::string replay(const std::string& key, Token token, std::int64_t call, std::int64_t completed,
                   std::int64_t expires) {
  return "replay " + key + " " + std::to_string(token) + " " + pd(token, key) + " " +
         std::to_string(call) + " " + std::to_string(completed) + " " + std::to_string(expires) +
         "\n";
}

FinalRecord complete(const std::string& key, Token token, const std::string& filler = "x") {
  return FinalRecord{.complete = true, .token = token, .digest = pd(token, key, filler)};
}

TEST(SoakCheck, PayloadsCarryTheirToken) {
  EXPECT_EQ(payload_token(make_payload(42, "d1-0", "abc")), 42u);
  EXPECT_EQ(payload_token("|x"), std::nullopt);
  EXPECT_EQ(payload_token("12a|x"), std::nullopt);
  EXPECT_EQ(payload_token("no bar"), std::nullopt);
  EXPECT_NE(digest("a"), digest("b"));
  EXPECT_EQ(digest("").size(), 16u);
}

TEST(SoakCheck, LogsWhereEveryRuleHeldHaveNoViolations) {
  // A stale owner (token 5) ran and was fenced; the thief (6) completed; others replayed.
  const std::vector<std::string> logs = {
      ran("d1-0", 5, 1000) + "lost d1-0\n" + "busy d1-0\n" + "purge 3\n",
      ran("d1-0", 6, 1500, 2) + done("d1-0", 6) + replay("d1-0", 6, 1600, 1501, 3'601'501),
      "fail d1-1 -\nunavailable d1-1\n" + ran("e0", 7, 1000) + done("e0", 7) + ran("e0", 9, 2600) +
          done("e0", 9) + replay("e0", 9, 2700, 2601, 4101)};
  const SoakReport r = check_soak(logs, {{"d1-0", complete("d1-0", 6)}}, 4200, kRules);
  EXPECT_THAT(r.violations, IsEmpty());
  EXPECT_EQ(r.ran, 4);
  EXPECT_EQ(r.completed, 3);
  EXPECT_EQ(r.replays, 2);
  EXPECT_EQ(r.busy, 1);
  EXPECT_EQ(r.lost, 1);
  EXPECT_EQ(r.released, 1);
  EXPECT_EQ(r.unavailable, 1);
  EXPECT_EQ(r.purged, 3);
  EXPECT_EQ(r.calls, 9);
  EXPECT_EQ(r.keys, 3u);
  EXPECT_EQ(keys_in_logs(logs), (std::vector<std::string>{"d1-0", "d1-1", "e0"}));
}

TEST(SoakCheck, AKeyCompletedTwiceWithinItsTtlIsAViolation) {
  const SoakReport r =
      check_soak({ran("d1-0", 5, 1000) + done("d1-0", 5), ran("d1-0", 6, 1200) + done("d1-0", 6)},
                 {{"d1-0", complete("d1-0", 6)}}, 2000, kRules);
  EXPECT_THAT(r.violations,
              ElementsAre(HasSubstr("key d1-0: token 6 ran 200 ms after token 5 completed it")));
}

TEST(SoakCheck, AnExpiringKeyRunsAgainOnlyAfterItsTtl) {
  const std::string first = ran("e0", 5, 1000) + done("e0", 5);
  EXPECT_THAT(check_soak({first + ran("e0", 6, 2500)}, {}, 9000, kRules).violations, IsEmpty());
  EXPECT_THAT(check_soak({first + ran("e0", 6, 2000)}, {}, 9000, kRules).violations,
              ElementsAre(HasSubstr("within its TTL of 1500 ms")));
}

TEST(SoakCheck, ACompletionSeenOnlyAsAReplayCounts) {
  // The owner was killed after its complete took effect and before it logged "done".
  const SoakReport r = check_soak(
      {ran("d1-0", 5, 1000), replay("d1-0", 5, 1100, 1001, 3'601'001) + ran("d1-0", 8, 1200)},
      {{"d1-0", complete("d1-0", 5)}}, 2000, kRules);
  EXPECT_THAT(r.violations, ElementsAre(HasSubstr("token 8 ran 200 ms after token 5")));
}

TEST(SoakCheck, APayloadNoActionMadeIsAViolation) {
  SoakReport r = check_soak({ran("d1-0", 5, 1000) + "done d1-0 5 0123456789abcdef\n"},
                            {{"d1-0", complete("d1-0", 5)}}, 2000, kRules);
  EXPECT_THAT(r.violations, ElementsAre(HasSubstr("a completion of token 5 has payload "
                                                  "0123456789abcdef, but its action made")));
  r = check_soak({done("d1-0", 5)}, {}, 2000, kRules);
  EXPECT_THAT(r.violations,
              ElementsAre(HasSubstr("a completion carries token 5, but no action ran with it")));
  r = check_soak({ran("d1-0", 5, 1000)}, {{"d1-0", complete("d1-0", 5, "other bytes")}}, 2000,
                 kRules);
  EXPECT_THAT(r.violations, ElementsAre(HasSubstr("the final record of token 5 has payload")));
}

TEST(SoakCheck, AReplayThatDiffersFromTheStoredPayloadIsAViolation) {
  const SoakReport r = check_soak({ran("d1-0", 5, 1000) + done("d1-0", 5) +
                                   "replay d1-0 5 0123456789abcdef 1100 1001 3601001\n"},
                                  {{"d1-0", complete("d1-0", 5)}}, 2000, kRules);
  EXPECT_THAT(r.violations, ElementsAre(HasSubstr("a replay of token 5 has payload")));
}

TEST(SoakCheck, AReplayOfAnExpiredRecordIsAViolation) {
  const SoakReport r = check_soak(
      {ran("e0", 5, 1000) + done("e0", 5) + replay("e0", 5, 3000, 1001, 2501)}, {}, 9000, kRules);
  EXPECT_THAT(r.violations, ElementsAre(HasSubstr("had expired 499 ms before the call began")));
}

TEST(SoakCheck, AReplayWhoseExpiryIsNotItsTtlIsAViolation) {
  const SoakReport r = check_soak(
      {ran("e0", 5, 1000) + done("e0", 5) + replay("e0", 5, 1100, 1001, 9000)}, {}, 9000, kRules);
  EXPECT_THAT(r.violations, ElementsAre(HasSubstr("expires 7999 ms after it completed")));
}

TEST(SoakCheck, ARecordThatVanishedBeforeItsTtlIsAViolation) {
  const std::string log = ran("d1-0", 5, 1000) + done("d1-0", 5);
  EXPECT_THAT(check_soak({log}, {}, 2000, kRules).violations,
              ElementsAre(HasSubstr("the store's record after the soak is gone")));
  EXPECT_THAT(
      check_soak({log}, {{"d1-0", FinalRecord{.complete = false, .token = 9, .digest = {}}}}, 2000,
                 kRules)
          .violations,
      ElementsAre(HasSubstr("is in progress with token 9")));
  // An expiring key whose TTL has passed may be gone.
  EXPECT_THAT(check_soak({ran("e0", 5, 1000) + done("e0", 5)}, {}, 2600, kRules).violations,
              IsEmpty());
}

TEST(SoakCheck, OneTokenOnTwoKeysIsAViolationWhereTheStorePromisesUniqueTokens) {
  const std::vector<std::string> logs = {ran("d1-0", 5, 1000) + ran("d1-1", 5, 1000)};
  EXPECT_THAT(check_soak(logs, {}, 2000, kRules).violations,
              ElementsAre(HasSubstr("token 5 was issued for keys d1-0 and d1-1")));
  SoakRules per_key = kRules;
  per_key.unique_tokens_store_wide = false;
  EXPECT_THAT(check_soak(logs, {}, 2000, per_key).violations, IsEmpty());
  EXPECT_THAT(
      check_soak({ran("d1-0", 5, 1000) + ran("d1-0", 5, 1000)}, {}, 2000, per_key).violations,
      ElementsAre(HasSubstr("two actions ran with token 5")));
}

TEST(SoakCheck, AStolenFlagThatDisagreesWithTheAttemptIsAViolation) {
  EXPECT_THAT(
      check_soak({"ran d1-0 5 2 0 1000 " + pd(5, "d1-0") + "\n"}, {}, 2000, kRules).violations,
      ElementsAre(HasSubstr("ran as attempt 2 with stolen=0")));
}

TEST(SoakCheck, ATornLastLineIsCountedAndAnythingElseUnreadableIsAViolation) {
  SoakReport r = check_soak({ran("d1-0", 5, 1000) + "done d1-0 5 01234"}, {}, 2000, kRules);
  EXPECT_THAT(r.violations, IsEmpty());
  EXPECT_EQ(r.torn, 1);
  r = check_soak({"done d1-0\n" + ran("d1-0", 5, 1000)}, {}, 2000, kRules);
  EXPECT_THAT(r.violations, ElementsAre(HasSubstr("does not parse: done d1-0")));
  r = check_soak({"error d1-0 something broke\n"}, {}, 2000, kRules);
  EXPECT_THAT(r.violations, ElementsAre(HasSubstr("unexpected error: error d1-0 something")));
}

}  // namespace
}  // namespace idem::soak
