#pragma once

// Value types shared by the store interface and the executor. SPEC §2–§4.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>

namespace idem {

// Durations have millisecond resolution (SPEC §6).
using Duration = std::chrono::milliseconds;

// A point on a store's clock: milliseconds since the Unix epoch. Only ever compared with
// other timestamps from the same store; a caller never compares it with its own clock.
using Timestamp = std::chrono::time_point<std::chrono::system_clock, std::chrono::milliseconds>;

// A lease token: unique within a store and strictly greater than every earlier token issued
// for the same (scope, key) in that store, so it doubles as a fencing token.
using Token = std::uint64_t;

// The lease a successful acquire hands out.
struct Lease {
  Token token = 0;
  Timestamp acquired_at{};
  Timestamp lease_expires_at{};
  Timestamp expires_at{};
  // Time left on the lease by the store's own clock when it was granted (SPEC §6).
  Duration lease_remaining{0};
  // 1 on first acquisition, +1 on each steal.
  std::uint32_t attempt = 1;
};

// acquire found the key absent (or expired) or stole an abandoned lease.
struct Acquired {
  Lease lease;
  // True when an IN_PROGRESS record with an expired lease was taken over.
  bool stolen = false;
};

// acquire found a live lease held by somebody else.
struct Busy {
  Timestamp lease_expires_at{};
  // Time left on the owner's lease by the store's own clock.
  Duration lease_remaining{0};
  std::optional<std::string> fingerprint;
};

// acquire found a COMPLETE record that has not expired.
struct Replay {
  std::string payload;
  Timestamp completed_at{};
  Timestamp expires_at{};
  std::optional<std::string> fingerprint;
};

using AcquireResult = std::variant<Acquired, Busy, Replay>;

// The outcome of complete and release. Fenced is an ordinary result, not an error: the
// caller's token no longer owns the record and nothing was changed.
enum class WriteResult { kDone, kFenced };

// The outcome of extend (the heartbeat).
struct ExtendResult {
  WriteResult result = WriteResult::kFenced;
  // Valid when result == kDone: the new deadline and the time left by the store's clock.
  Timestamp lease_expires_at{};
  Duration lease_remaining{0};

  bool done() const { return result == WriteResult::kDone; }
};

enum class RecordState { kInProgress, kComplete };

// A read-only snapshot of one record, for tools and operators (Store::get).
struct Record {
  RecordState state = RecordState::kInProgress;
  Token token = 0;
  std::uint32_t attempt = 0;     // IN_PROGRESS only
  Timestamp acquired_at{};       // IN_PROGRESS only
  Timestamp lease_expires_at{};  // IN_PROGRESS only
  Timestamp completed_at{};      // COMPLETE only
  Timestamp expires_at{};
  std::string payload;  // COMPLETE only
  std::optional<std::string> fingerprint;
  // The store's clock when the snapshot was taken, so a reader can tell what has expired
  // without comparing the store's clock with its own.
  Timestamp now{};
};

const char* to_string(RecordState state);
const char* to_string(WriteResult result);

// A store timestamp as ISO-8601 UTC with milliseconds: "2024-05-01T12:00:00.250Z".
std::string to_iso8601(Timestamp t);

}  // namespace idem
