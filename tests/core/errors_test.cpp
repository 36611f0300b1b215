// Errors with context (SPEC §11): every error about a record names it, times are ISO-8601,
// each code says whether a retry can help, and a store's programming error is not
// disguised as an outage.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "idem/error.h"
#include "idem/executor.h"
#include "idem/store_wrapper.h"
#include "idem/testing/matchers.h"
#include "idem/testing/store_fixtures.h"

namespace {

using namespace std::chrono_literals;
using idem::Attempt;
using idem::CallOptions;
using idem::ErrorCode;
using idem::Executor;
using idem::ExecutorOptions;
using idem::testing::IsAcquired;
using idem::testing::Op;
using ::testing::HasSubstr;

class ErrorsTest : public idem::testing::ManualClockStoreTest {};

TEST(Iso8601, FormatsStoreTimestampsInUtcWithMilliseconds) {
  EXPECT_EQ(idem::to_iso8601(idem::Timestamp{}), "1970-01-01T00:00:00.000Z");
  // 2024-02-29T23:59:59.250Z: a leap day, just before midnight.
  EXPECT_EQ(idem::to_iso8601(idem::Timestamp{idem::Duration{1709251199250}}),
            "2024-02-29T23:59:59.250Z");
  EXPECT_EQ(idem::to_iso8601(idem::Timestamp{-1ms}), "1969-12-31T23:59:59.999Z");
}

TEST(Iso8601, TheExtremesFormatWithoutOverflow) {
  using Rep = idem::Duration::rep;
  const std::string min =
      idem::to_iso8601(idem::Timestamp{idem::Duration{std::numeric_limits<Rep>::min()}});
  const std::string max =
      idem::to_iso8601(idem::Timestamp{idem::Duration{std::numeric_limits<Rep>::max()}});
  // -9223372036854775808 ms and 9223372036854775807 ms, rounded down to the second.
  EXPECT_EQ(min, "-292275055-05-16T16:47:04.192Z");
  EXPECT_EQ(max, "292278994-08-17T07:12:55.807Z");
  EXPECT_EQ(idem::to_iso8601(idem::Timestamp{idem::Duration{-86'400'000}}),
            "1969-12-31T00:00:00.000Z");
  EXPECT_EQ(idem::to_iso8601(idem::Timestamp{idem::Duration{951'782'400'000}}),
            "2000-02-29T00:00:00.000Z");
}

TEST_F(ErrorsTest, InProgressNamesTheRecordAndItsDeadlineInIso8601) {
  clock_->set(idem::Timestamp{idem::Duration{1709251199250}});
  ASSERT_THAT(memory_->acquire("payments", "order-42", 60s, 1h), IsAcquired());
  Executor exec(store_);
  try {
    (void)exec.run("payments", "order-42", [](const Attempt&) { return std::string(); });
    FAIL() << "run did not throw";
  } catch (const idem::InProgress& e) {
    EXPECT_EQ(e.scope(), "payments");
    EXPECT_EQ(e.key(), "order-42");
    EXPECT_TRUE(e.retryable());
    const std::string what = e.what();
    EXPECT_THAT(what, HasSubstr("2024-03-01T00:00:59.250Z"));
    EXPECT_THAT(what, HasSubstr("scope \"payments\", key \"order-42\""));
  }
}

TEST_F(ErrorsTest, KeysInMessagesAreEscapedAndRawInAccessors) {
  const std::string key("k\0\n\xff", 4);
  ASSERT_THAT(memory_->acquire("s", key, 60s, 1h), IsAcquired());
  Executor exec(store_);
  try {
    (void)exec.run("s", key, [](const Attempt&) { return std::string(); });
    FAIL() << "run did not throw";
  } catch (const idem::InProgress& e) {
    EXPECT_EQ(e.key(), key);
    EXPECT_THAT(e.what(), HasSubstr("key \"k\\x00\\x0a\\xff\""));
  }
}

TEST_F(ErrorsTest, KeyReuseAndPayloadTooLargeNameTheRecord) {
  Executor exec(store_, ExecutorOptions{.max_payload = 4});
  (void)exec.run(
      "s", "k", [](const Attempt&) { return std::string("v"); }, CallOptions{.fingerprint = "A"});
  try {
    (void)exec.run(
        "s", "k", [](const Attempt&) { return std::string(); }, CallOptions{.fingerprint = "B"});
    FAIL() << "run did not throw";
  } catch (const idem::KeyReuse& e) {
    EXPECT_EQ(e.scope(), "s");
    EXPECT_EQ(e.key(), "k");
    EXPECT_FALSE(e.retryable());
  }
  try {
    (void)exec.run("s", "big", [](const Attempt&) { return std::string(5, 'x'); });
    FAIL() << "run did not throw";
  } catch (const idem::PayloadTooLarge& e) {
    // A code of its own, and still an InvalidArgument about the payload.
    EXPECT_EQ(e.code(), ErrorCode::kPayloadTooLarge);
    EXPECT_EQ(e.argument(), "payload");
    EXPECT_EQ(e.key(), "big");
    EXPECT_FALSE(e.retryable());
  }
}

TEST_F(ErrorsTest, StoreUnavailableNamesTheRecordItFailedOn) {
  Executor exec(store_);
  store_->fail_next(Op::kAcquire);
  try {
    (void)exec.run("s", "k", [](const Attempt&) { return std::string(); });
    FAIL() << "run did not throw";
  } catch (const idem::StoreUnavailable& e) {
    EXPECT_EQ(e.scope(), "s");
    EXPECT_EQ(e.key(), "k");
    EXPECT_TRUE(e.retryable());
  }
}

TEST_F(ErrorsTest, InvalidArgumentIsAboutAnInputNotARecord) {
  Executor exec(store_);
  try {
    (void)exec.run("s", "", [](const Attempt&) { return std::string(); });
    FAIL() << "run did not throw";
  } catch (const idem::InvalidArgument& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(e.scope().empty());
    EXPECT_TRUE(e.key().empty());
    EXPECT_FALSE(e.retryable());
  }
}

TEST(ErrorCodes, EachSaysWhetherARetryCanHelp) {
  EXPECT_FALSE(idem::is_retryable(ErrorCode::kInvalidArgument));
  EXPECT_FALSE(idem::is_retryable(ErrorCode::kPayloadTooLarge));
  EXPECT_TRUE(idem::is_retryable(ErrorCode::kInProgress));
  EXPECT_FALSE(idem::is_retryable(ErrorCode::kKeyReuse));
  EXPECT_TRUE(idem::is_retryable(ErrorCode::kLeaseLost));
  EXPECT_TRUE(idem::is_retryable(ErrorCode::kStoreUnavailable));
  EXPECT_FALSE(idem::is_retryable(ErrorCode::kDecodeFailed));
  EXPECT_TRUE(idem::is_retryable(ErrorCode::kShutDown));
  EXPECT_STREQ(idem::to_string(ErrorCode::kPayloadTooLarge), "payload too large");
}

// A store with a bug (or one that fails the way a C library's wrapper might).
class ThrowingStore : public idem::StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  std::function<void()> on_acquire;

 protected:
  idem::AcquireResult do_acquire(std::string_view scope, std::string_view key, idem::Duration lease,
                                 idem::Duration ttl,
                                 std::optional<std::string_view> fingerprint) override {
    on_acquire();
    return StoreWrapper::do_acquire(scope, key, lease, ttl, fingerprint);
  }
};

TEST_F(ErrorsTest, AStoresLogicErrorIsNotReportedAsTheStoreBeingUnavailable) {
  auto buggy = std::make_shared<ThrowingStore>(memory_);
  buggy->on_acquire = [] { throw std::out_of_range("index 7 out of range"); };
  Executor exec(buggy);
  // A programming error is not "retry later": it reaches the caller as it was thrown.
  EXPECT_THROW((void)exec.run("s", "k", [](const Attempt&) { return std::string(); }),
               std::out_of_range);
}

TEST_F(ErrorsTest, AStoresRuntimeErrorIsStoreUnavailable) {
  auto failing = std::make_shared<ThrowingStore>(memory_);
  failing->on_acquire = [] { throw std::runtime_error("connection reset"); };
  Executor exec(failing);
  try {
    (void)exec.run("s", "k", [](const Attempt&) { return std::string(); });
    FAIL() << "run did not throw";
  } catch (const idem::StoreUnavailable& e) {
    EXPECT_EQ(e.reason(), "connection reset");
    EXPECT_EQ(e.key(), "k");
  }
}

TEST(ErrorCopies, ShareTheirRecordAndKeepTheirType) {
  const idem::LeaseLost original(7, "why", idem::RecordRef{"s", "k"});
  const idem::LeaseLost copy = original;  // exceptions are copied when thrown
  EXPECT_EQ(copy.scope(), "s");
  EXPECT_EQ(copy.key(), "k");
  EXPECT_EQ(copy.token(), 7u);
  EXPECT_STREQ(copy.what(), original.what());
}

}  // namespace
