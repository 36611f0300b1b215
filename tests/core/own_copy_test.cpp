// The store kit's own_copy (src/stores/kit/own_copy.h): the error a failed batch hands each
// of its callers is equal to the batch's, and shares no object or message with it.

#include "stores/kit/own_copy.h"

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeinfo>

#include "idem/error.h"

namespace idem::kit {
namespace {

// The exception object `p` holds, as an E (alive as long as `p` is).
template <typename E>
const E* object_of(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const E& e) {
    return &e;
  } catch (...) {
  }
  return nullptr;
}

// own_copy(original) is a different object of the same most derived class, with the same
// message in a string of its own; `check` then looks at the class's own fields.
template <typename E, typename Check>
void expect_own_copy(const std::exception_ptr& original, Check check) {
  const std::exception_ptr copy = own_copy(original);
  const E* before = object_of<E>(original);
  const E* after = object_of<E>(copy);
  ASSERT_NE(before, nullptr);
  ASSERT_NE(after, nullptr) << "not copied as its own class";
  EXPECT_NE(after, before) << "the same object, shared";
  EXPECT_EQ(typeid(*after), typeid(*before));
  EXPECT_STREQ(after->what(), before->what());
  EXPECT_NE(static_cast<const void*>(after->what()), static_cast<const void*>(before->what()))
      << "the message is shared";
  EXPECT_EQ(after->code(), before->code());
  EXPECT_EQ(after->scope(), before->scope());
  EXPECT_EQ(after->key(), before->key());
  check(*after);
}

constexpr RecordRef kRecord{"orders", std::string_view("k\0ey", 4)};

TEST(OwnCopy, AStoreFailureIsCopiedWithEveryField) {
  expect_own_copy<StoreUnavailable>(
      std::make_exception_ptr(StoreUnavailable("postgresql://db/x", "connection lost", kRecord,
                                               /*unconfirmed=*/true)),
      [](const StoreUnavailable& e) {
        EXPECT_EQ(e.store(), "postgresql://db/x");
        EXPECT_EQ(e.reason(), "connection lost");
        EXPECT_TRUE(e.unconfirmed());
        EXPECT_EQ(e.scope(), "orders");
        EXPECT_EQ(e.key(), std::string_view("k\0ey", 4));
      });
  expect_own_copy<StoreUnavailable>(
      std::make_exception_ptr(StoreUnavailable("s", "r")),
      [](const StoreUnavailable& e) { EXPECT_FALSE(e.unconfirmed()); });
}

TEST(OwnCopy, AMissingStoreStaysAMissingStore) {
  expect_own_copy<StoreNotFound>(
      std::make_exception_ptr(StoreNotFound("sqlite:///x.db", "no such file")),
      [](const StoreNotFound& e) {
        EXPECT_EQ(e.store(), "sqlite:///x.db");
        EXPECT_EQ(e.reason(), "no such file");
      });
}

TEST(OwnCopy, EveryErrorWhoseFieldsMakeItsMessageIsCopied) {
  const Timestamp deadline(std::chrono::milliseconds(1'700'000'000'123));
  expect_own_copy<InProgress>(
      std::make_exception_ptr(InProgress(deadline, std::chrono::milliseconds(2500), kRecord)),
      [&](const InProgress& e) {
        EXPECT_EQ(e.lease_expires_at(), deadline);
        EXPECT_EQ(e.lease_remaining(), std::chrono::milliseconds(2500));
      });
  expect_own_copy<KeyReuse>(std::make_exception_ptr(KeyReuse("stored-fp", "request-fp", kRecord)),
                            [](const KeyReuse& e) {
                              EXPECT_EQ(e.stored_fingerprint(), "stored-fp");
                              EXPECT_EQ(e.request_fingerprint(), "request-fp");
                            });
  expect_own_copy<PayloadTooLarge>(std::make_exception_ptr(PayloadTooLarge(2000, 1024, kRecord)),
                                   [](const PayloadTooLarge& e) {
                                     EXPECT_EQ(e.size(), 2000U);
                                     EXPECT_EQ(e.limit(), 1024U);
                                     EXPECT_EQ(e.argument(), "payload");
                                   });
  expect_own_copy<DecodeFailed>(
      std::make_exception_ptr(DecodeFailed(std::string("\x01\x02", 2), "bad tag", kRecord)),
      [](const DecodeFailed& e) {
        EXPECT_EQ(e.bytes(), std::string("\x01\x02", 2));
        EXPECT_EQ(e.reason(), "bad tag");
      });
}

TEST(OwnCopy, OutOfMemoryIsANewBadAlloc) {
  const std::exception_ptr original = std::make_exception_ptr(std::bad_alloc());
  const std::exception_ptr copy = own_copy(original);
  ASSERT_NE(object_of<std::bad_alloc>(copy), nullptr);
  EXPECT_NE(object_of<std::bad_alloc>(copy), object_of<std::bad_alloc>(original));
}

TEST(OwnCopy, AnythingElseIsHandedOnAsItIs) {
  for (const std::exception_ptr& other :
       {std::make_exception_ptr(InvalidArgument("key", "must not be empty")),
        std::make_exception_ptr(LeaseLost(7, "another caller took the key over")),
        std::make_exception_ptr(std::runtime_error("not ours")), std::make_exception_ptr(42)}) {
    EXPECT_EQ(own_copy(other), other);
  }
  EXPECT_EQ(own_copy(nullptr), nullptr);
}

}  // namespace
}  // namespace idem::kit
