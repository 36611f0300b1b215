#pragma once

// gMock matchers for store outcomes and idem errors (after abseil's status_matchers.h):
//
//   EXPECT_THAT(store.acquire(...), IsBusy());
//   EXPECT_THAT([&] { exec.run(...); }, ThrowsIdem(idem::ErrorCode::kInProgress));

#include <gmock/gmock.h>

#include <exception>
#include <functional>
#include <variant>

#include "idem/error.h"
#include "idem/types.h"

namespace idem::testing {

MATCHER(IsAcquired, "is Acquired") { return std::holds_alternative<Acquired>(arg); }
MATCHER(IsBusy, "is Busy") { return std::holds_alternative<Busy>(arg); }
MATCHER(IsReplay, "is Replay") { return std::holds_alternative<Replay>(arg); }
MATCHER_P(IsReplayOf, payload, "is a Replay of " + ::testing::PrintToString(payload)) {
  const auto* r = std::get_if<Replay>(&arg);
  return r != nullptr && r->payload == payload;
}

// Matches a callable that throws an idem::Error with the given code.
MATCHER_P(ThrowsIdem, code, std::string("throws idem::Error with code ") + to_string(code)) {
  try {
    arg();
  } catch (const Error& e) {
    *result_listener << "threw \"" << e.what() << "\"";
    return e.code() == code;
  } catch (const std::exception& e) {
    *result_listener << "threw a non-idem exception \"" << e.what() << "\"";
    return false;
  }
  *result_listener << "did not throw";
  return false;
}

}  // namespace idem::testing
