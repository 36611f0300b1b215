// Codecs (SPEC §5): the ready ones, the opt-in JSON one, void actions, what a caller gets
// when a stored result cannot be decoded, and that a fresh run returns the action's own
// value rather than the codec's round trip.

#include "idem/codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "idem/codec_json.h"
#include "idem/executor.h"
#include "idem/testing/matchers.h"
#include "idem/testing/store_fixtures.h"

namespace {

using idem::Attempt;
using idem::Codec;
using idem::ErrorCode;
using idem::Executor;
using idem::testing::ThrowsIdem;

class CodecTest : public idem::testing::ManualClockStoreTest {};

template <typename T>
T round_trip(const T& value) {
  return Codec<T>::decode(Codec<T>::encode(value));
}

TEST(Codecs, IntegersAreDecimalText) {
  EXPECT_EQ(Codec<int>::encode(-42), "-42");
  EXPECT_EQ(round_trip(std::numeric_limits<std::int64_t>::min()),
            std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(round_trip(std::numeric_limits<std::uint64_t>::max()),
            std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(round_trip<short>(-7), -7);
  for (const char* bad : {"", "12a", " 12", "+12", "0x10", "99999999999"}) {
    EXPECT_THROW((void)Codec<int>::decode(bad), std::invalid_argument) << bad;
  }
  EXPECT_THROW((void)Codec<unsigned>::decode("-1"), std::invalid_argument);
}

TEST(Codecs, BoolIsTrueOrFalse) {
  EXPECT_EQ(Codec<bool>::encode(true), "true");
  EXPECT_FALSE(round_trip(false));
  EXPECT_THROW((void)Codec<bool>::decode("1"), std::invalid_argument);
}

enum class Outcome : std::uint8_t { kPaid = 1, kDeclined = 200 };

TEST(Codecs, EnumsAreTheirUnderlyingInteger) {
  EXPECT_EQ(Codec<Outcome>::encode(Outcome::kDeclined), "200");
  EXPECT_EQ(round_trip(Outcome::kPaid), Outcome::kPaid);
  EXPECT_THROW((void)Codec<Outcome>::decode("256"), std::invalid_argument);
}

TEST(Codecs, OptionalsTellNothingFromAnEmptyValue) {
  EXPECT_EQ(round_trip(std::optional<int>()), std::nullopt);
  EXPECT_EQ(round_trip(std::optional<int>(0)), 0);
  EXPECT_EQ(round_trip(std::optional<std::string>("")), std::optional<std::string>(""));
  EXPECT_THROW((void)Codec<std::optional<int>>::decode("5"), std::invalid_argument);
}

TEST(Codecs, CharVectorsAreBytes) {
  const std::vector<char> bytes{'a', '\0', '\xff'};
  EXPECT_EQ(Codec<std::vector<char>>::encode(bytes), std::string("a\0\xff", 3));
  EXPECT_EQ(round_trip(bytes), bytes);
}

struct Invoice {
  int id = 0;
  std::string memo;
};

void to_json(nlohmann::json& j, const Invoice& v) { j = {{"id", v.id}, {"memo", v.memo}}; }
void from_json(const nlohmann::json& j, Invoice& v) {
  j.at("id").get_to(v.id);
  j.at("memo").get_to(v.memo);
}

}  // namespace

template <>
struct idem::Codec<Invoice> : idem::JsonCodec<Invoice> {};

namespace {

TEST(Codecs, JsonOptIn) {
  const nlohmann::json j = {{"status", "paid"}, {"amounts", {1, 2}}};
  EXPECT_EQ(round_trip(j), j);
  EXPECT_EQ(Codec<Invoice>::encode(Invoice{7, "x"}), R"({"id":7,"memo":"x"})");
  EXPECT_EQ(round_trip(Invoice{7, "x"}).memo, "x");
  EXPECT_THROW((void)Codec<Invoice>::decode("{not json"), nlohmann::json::exception);
}

// --- through the executor ---------------------------------------------------------------

TEST_F(CodecTest, ReadyCodecsWorkThroughRunAndTheResultTypeIsDeducedFromTheAction) {
  Executor exec(store_);
  // Deduced: int, through Codec<int>.
  auto fresh = exec.run("s", "int", [](const Attempt&) { return 41 + 1; });
  static_assert(std::is_same_v<decltype(fresh), idem::Result<int>>);
  EXPECT_EQ(fresh.value, 42);
  EXPECT_EQ(memory_->get("s", "int")->payload, "42");
  EXPECT_EQ(exec.run<int>("s", "int", [](const Attempt&) { return 0; }).value, 42);
  // A string literal is bytes.
  auto text = exec.run("s", "text", [](const Attempt&) { return "hello"; });
  static_assert(std::is_same_v<decltype(text), idem::Result<std::string>>);
  auto optional = exec.run<std::optional<Outcome>>(
      "s", "opt", [](const Attempt&) { return std::optional<Outcome>(Outcome::kPaid); });
  EXPECT_EQ(optional.value, Outcome::kPaid);
  auto json = exec.run<Invoice>("s", "json", [](const Attempt&) { return Invoice{3, "paid"}; });
  auto replayed = exec.run<Invoice>("s", "json", [](const Attempt&) { return Invoice{}; });
  EXPECT_TRUE(replayed.replayed);
  EXPECT_EQ(replayed.value.memo, "paid");
}

TEST_F(CodecTest, VoidActionsRecordThatTheyRan) {
  Executor exec(store_);
  int runs = 0;
  auto first = exec.run("s", "k", [&](const Attempt&) { ++runs; });
  static_assert(std::is_same_v<decltype(first), idem::Result<void>>);
  auto second = exec.run<void>("s", "k", [&](const Attempt&) { ++runs; });
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(first.replayed);
  EXPECT_TRUE(second.replayed);
  EXPECT_EQ(memory_->get("s", "k")->state, idem::RecordState::kComplete);
  auto begun = exec.begin<void>("s", "other");
  ASSERT_NE(begun.handle(), nullptr);
  EXPECT_FALSE(begun.handle()->complete().replayed);
  EXPECT_TRUE(exec.begin<void>("s", "other").replay()->replayed);
}

// A codec that keeps whole units only: 12.99 is stored as 12.
struct Price {
  double amount = 0;
};

}  // namespace

template <>
struct idem::Codec<Price> {
  static std::string encode(const Price& p) { return std::to_string(static_cast<long>(p.amount)); }
  static Price decode(std::string_view bytes) { return Price{std::stod(std::string(bytes))}; }
};

namespace {

TEST_F(CodecTest, AFreshRunReturnsTheActionsOwnValueAndAReplayTheDecodedOne) {
  Executor exec(store_);
  EXPECT_EQ(exec.run<Price>("s", "k", [](const Attempt&) { return Price{12.99}; }).value.amount,
            12.99);
  EXPECT_EQ(exec.run<Price>("s", "k", [](const Attempt&) { return Price{}; }).value.amount, 12.0);
}

// A codec whose decode rejects what is stored (a record from another version, say).
struct Strict {
  std::string text;
};

}  // namespace

template <>
struct idem::Codec<Strict> {
  static std::string encode(const Strict& s) { return s.text; }
  static Strict decode(std::string_view bytes) {
    if (bytes.substr(0, 3) != "v2:") throw std::runtime_error("unknown format version");
    return Strict{std::string(bytes.substr(3))};
  }
};

namespace {

TEST_F(CodecTest, AResultTheCodecCannotDecodeIsDecodeFailedWithTheStoredBytes) {
  Executor exec(store_);
  (void)exec.run("s", "k", [](const Attempt&) { return std::string("v1:old"); });
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      (void)exec.run<Strict>("s", "k", [](const Attempt&) { return Strict{"v2:new"}; });
      FAIL() << "run did not throw";
    } catch (const idem::DecodeFailed& e) {
      EXPECT_EQ(e.code(), ErrorCode::kDecodeFailed);
      EXPECT_EQ(e.bytes(), "v1:old");
      EXPECT_EQ(e.reason(), "unknown format version");
      EXPECT_EQ(e.scope(), "s");
      EXPECT_EQ(e.key(), "k");
      EXPECT_FALSE(e.retryable());
    }
  }
  // The record itself is intact.
  EXPECT_EQ(memory_->get("s", "k")->payload, "v1:old");
  EXPECT_THAT([&] { (void)exec.begin<Strict>("s", "k"); }, ThrowsIdem(ErrorCode::kDecodeFailed));
}

}  // namespace
