#pragma once

// gMock matchers and printers for store outcomes (SPEC §4) and idem errors, so a test reads
// as the contract (after abseil's status_matchers.h):
//
//   EXPECT_THAT(store.acquire(...), IsAcquired());
//   EXPECT_THAT(store.acquire(...), IsReplay("payload"));
//   EXPECT_THAT(store.complete(...), IsFenced());
//   EXPECT_THAT(exec.run(...), IsReplayed());
//   EXPECT_THAT([&] { exec.run(...); }, ThrowsIdem(idem::ErrorCode::kInProgress));

#include <gmock/gmock.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <variant>

#include "idem/error.h"
#include "idem/types.h"

namespace idem::testing {

// Bytes for a failure message: their size and first 32 bytes, escaped as idem::printable
// does (payloads can be many MiB, and binary).
inline std::string preview(std::string_view bytes) {
  constexpr std::size_t kShown = 32;
  std::string out = std::to_string(bytes.size()) + " bytes \"";
  out += printable(bytes.substr(0, kShown), std::string::npos);
  if (bytes.size() > kShown) out += "...";
  return out + "\"";
}

namespace detail {

inline std::string show(const std::optional<std::string>& fingerprint) {
  return fingerprint ? preview(*fingerprint) : std::string("none");
}

inline long long ms(Timestamp t) { return static_cast<long long>(t.time_since_epoch().count()); }

}  // namespace detail
}  // namespace idem::testing

namespace idem {

// Printers found by argument-dependent lookup (so in namespace idem, beside the types), so
// googletest shows outcomes readably.
inline void PrintTo(const Lease& lease, std::ostream* os) {
  *os << "Lease{token=" << lease.token << ", attempt=" << lease.attempt
      << ", acquired_at=" << testing::detail::ms(lease.acquired_at)
      << ", lease_expires_at=" << testing::detail::ms(lease.lease_expires_at)
      << ", expires_at=" << testing::detail::ms(lease.expires_at)
      << ", lease_remaining=" << lease.lease_remaining.count() << "ms}";
}

inline void PrintTo(const Acquired& a, std::ostream* os) {
  *os << "Acquired{stolen=" << (a.stolen ? "true" : "false") << ", ";
  PrintTo(a.lease, os);
  *os << "}";
}

inline void PrintTo(const Busy& b, std::ostream* os) {
  *os << "Busy{lease_expires_at=" << testing::detail::ms(b.lease_expires_at)
      << ", lease_remaining=" << b.lease_remaining.count()
      << "ms, fingerprint=" << testing::detail::show(b.fingerprint) << "}";
}

inline void PrintTo(const Replay& r, std::ostream* os) {
  *os << "Replay{payload=" << testing::preview(r.payload)
      << ", completed_at=" << testing::detail::ms(r.completed_at)
      << ", expires_at=" << testing::detail::ms(r.expires_at)
      << ", fingerprint=" << testing::detail::show(r.fingerprint) << "}";
}

inline void PrintTo(const AcquireResult& r, std::ostream* os) {
  std::visit([os](const auto& v) { PrintTo(v, os); }, r);
}

inline void PrintTo(WriteResult r, std::ostream* os) { *os << to_string(r); }

inline void PrintTo(const ExtendResult& r, std::ostream* os) {
  *os << "ExtendResult{" << to_string(r.result);
  if (r.done()) {
    *os << ", lease_expires_at=" << testing::detail::ms(r.lease_expires_at)
        << ", lease_remaining=" << r.lease_remaining.count() << "ms";
  }
  *os << "}";
}

inline void PrintTo(const Record& r, std::ostream* os) {
  *os << "Record{" << to_string(r.state) << ", token=" << r.token;
  if (r.state == RecordState::kInProgress) {
    *os << ", attempt=" << r.attempt << ", acquired_at=" << testing::detail::ms(r.acquired_at)
        << ", lease_expires_at=" << testing::detail::ms(r.lease_expires_at);
  } else {
    *os << ", completed_at=" << testing::detail::ms(r.completed_at)
        << ", payload=" << testing::preview(r.payload);
  }
  *os << ", expires_at=" << testing::detail::ms(r.expires_at)
      << ", fingerprint=" << testing::detail::show(r.fingerprint)
      << ", now=" << testing::detail::ms(r.now) << "}";
}

}  // namespace idem

namespace idem::testing {

// acquire granted a lease (fresh or stolen).
MATCHER(IsAcquired, "is Acquired") { return std::holds_alternative<Acquired>(arg); }

// acquire granted a first attempt on a key that was absent (SPEC §4: stolen=false,
// attempt 1).
MATCHER(IsFreshlyAcquired, "is Acquired with stolen=false and attempt 1") {
  const auto* a = std::get_if<Acquired>(&arg);
  return a != nullptr && !a->stolen && a->lease.attempt == 1;
}

// acquire stole an abandoned lease; `attempt` is the attempt number it must report.
MATCHER_P(IsStolen, attempt,
          "is Acquired with stolen=true and attempt " + ::testing::PrintToString(attempt)) {
  const auto* a = std::get_if<Acquired>(&arg);
  return a != nullptr && a->stolen && a->lease.attempt == static_cast<std::uint32_t>(attempt);
}

MATCHER(IsBusy, "is Busy") { return std::holds_alternative<Busy>(arg); }

MATCHER(IsReplay, "is Replay") { return std::holds_alternative<Replay>(arg); }

// A Replay whose payload is byte-exact `payload` (a failure shows only a preview).
MATCHER_P(IsReplay, payload, "is Replay of " + preview(payload)) {
  const auto* r = std::get_if<Replay>(&arg);
  return r != nullptr && r->payload == std::string_view(payload);
}

// For WriteResult and ExtendResult alike.
MATCHER(IsDone, "is done") {
  if constexpr (std::is_same_v<std::decay_t<decltype(arg)>, ExtendResult>) {
    return arg.result == WriteResult::kDone;
  } else {
    return arg == WriteResult::kDone;
  }
}

MATCHER(IsFenced, "is fenced") {
  if constexpr (std::is_same_v<std::decay_t<decltype(arg)>, ExtendResult>) {
    return arg.result == WriteResult::kFenced;
  } else {
    return arg == WriteResult::kFenced;
  }
}

// get() found an IN_PROGRESS record held by `token`.
MATCHER_P(IsInProgressWith, token,
          "is an IN_PROGRESS record with token " + ::testing::PrintToString(token)) {
  return arg.has_value() && arg->state == RecordState::kInProgress && arg->token == token;
}

// get() found a COMPLETE record completed by `token`.
MATCHER_P(IsCompleteWith, token,
          "is a COMPLETE record with token " + ::testing::PrintToString(token)) {
  return arg.has_value() && arg->state == RecordState::kComplete && arg->token == token;
}

// For what Executor::run returns (Result<T>): the value is a stored result of an earlier
// run and the action did not run ...
MATCHER(IsReplayed, "is a replayed result") { return arg.replayed; }

// ... or the action ran here.
MATCHER(IsFresh, "is a fresh result (the action ran)") { return !arg.replayed; }

// A Result<T> whose value matches `m`: EXPECT_THAT(r, AllOf(IsReplayed(), HasValue("ok"))).
MATCHER_P(HasValue, m, "has a value that matches") {
  return ::testing::ExplainMatchResult(m, arg.value, result_listener);
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
