// The store kit's URL-parameter reader (src/stores/kit/url_params.h): the values it takes
// and the one set of messages every store refuses a parameter with.

#include "stores/kit/url_params.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "idem/error.h"

namespace idem::kit {
namespace {

std::string refusal(const std::function<void()>& read) {
  try {
    read();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "store URL");
    return e.what();
  }
  ADD_FAILURE() << "not refused";
  return "";
}

using ::testing::EndsWith;

TEST(UrlParams, WholeNumbers) {
  EXPECT_EQ(whole_number("n", "0", 0, 10), 0);
  EXPECT_EQ(whole_number("n", "10", 0, 10), 10);
  EXPECT_EQ(whole_number("n", "9223372036854775807", 1), kUnbounded);
  for (const char* bad : {"", "-1", "+1", "11", " 1", "1 ", "1x", "0x1", "99999999999999999999"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(refusal([&] { whole_number("n", bad, 0, 10); }),
                EndsWith("parameter 'n' must be a whole number from 0 to 10, got '" +
                         std::string(bad) + "'"));
  }
  EXPECT_THAT(refusal([] { whole_number("pool_size", "0", 1); }),
              EndsWith("parameter 'pool_size' must be a whole number, at least 1, got '0'"));
}

TEST(UrlParams, Milliseconds) {
  EXPECT_EQ(milliseconds("t", "250", 1, 1000), Duration{250});
  EXPECT_THAT(refusal([] { milliseconds("t", "0", 1, 1000); }),
              EndsWith("parameter 't' must be a whole number of milliseconds from 1 to 1000, "
                       "got '0'"));
  EXPECT_THAT(refusal([] { milliseconds("t", "soon", 1); }),
              EndsWith("parameter 't' must be a whole number of milliseconds, at least 1, got "
                       "'soon'"));
}

TEST(UrlParams, Choices) {
  EXPECT_EQ(choice<int>("c", "b", {{"a", 1}, {"b", 2}}), 2);
  EXPECT_EQ(choice<int>("c", "B", {{"a", 1}, {"b", 2}}, true), 2);
  EXPECT_THAT(refusal([] {
                choice<int>("c", "B", {{"a", 1}, {"b", 2}});
              }),
              EndsWith("parameter 'c' must be 'a' or 'b', got 'B'"));
  EXPECT_THAT(refusal([] {
                choice<int>("c", "d", {{"a", 1}, {"b", 2}, {"c", 3}});
              }),
              EndsWith("parameter 'c' must be 'a', 'b' or 'c', got 'd'"));
}

TEST(UrlParams, UnknownParameters) {
  EXPECT_THAT(refusal([] { refuse_unknown("nope", "sqlite", "busy_timeout, shared"); }),
              EndsWith("unknown parameter 'nope' for sqlite: (known: busy_timeout, shared)"));
}

}  // namespace
}  // namespace idem::kit
