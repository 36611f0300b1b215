#pragma once

// The crash soak's record of what happened (docs/RELIABILITY.md, "Crash soak"). Every soak
// worker appends one line per event to a log file of its own, with a single O_APPEND write,
// before the call that produced the event returns; so a process killed at any line leaves a
// log that is complete up to its last whole line. Afterwards check_soak() reads every log and
// the store's final records and lists each broken rule.
//
// Lines (fields separated by one space; keys never contain spaces; times are wall-clock
// milliseconds, which on one machine is the clock every store judges by):
//
//   ran KEY TOKEN ATTEMPT STOLEN WALL_MS DIGEST
//       Written by the action, after it made its payload and before it returns it, so a
//       stored payload always has one: the lease TOKEN, its attempt number, whether it stole
//       an abandoned lease, the time, and the payload's digest.
//   done KEY TOKEN DIGEST
//       run() returned a fresh result: the complete with TOKEN took effect.
//   replay KEY TOKEN DIGEST CALL_WALL_MS COMPLETED_AT_MS EXPIRES_AT_MS
//       run() returned a stored result. TOKEN is read from the payload (every payload starts
//       with the token of the action that made it); the times are the store's ("-" when a
//       duplicate was served in memory by an owner in the same process, which has none).
//   fail KEY TOKEN        the action threw on purpose; the record was released
//   busy KEY              run() threw InProgress
//   lost KEY              run() threw LeaseLost (fenced, or unextended past its deadline)
//   unavailable KEY       run() threw StoreUnavailable
//   purge N               Store::purge deleted N records
//   error KEY MESSAGE     anything else: a rule broken (the message says what)

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/types.h"

namespace idem::soak {

// FNV-1a, 64 bits, as 16 hex digits: the digest of a payload in the logs.
std::string digest(std::string_view bytes);

// A payload for a run of `key` with lease `token`: the token first (so a replay says which
// action made it), then `filler` bytes.
std::string make_payload(Token token, std::string_view key, std::string_view filler);

// The token a payload made by make_payload starts with; nullopt for anything else.
std::optional<Token> payload_token(std::string_view payload);

// Milliseconds since the epoch by the system clock.
std::int64_t wall_ms();

// What the soak runs with, for the check.
struct SoakRules {
  // The TTL of key `key`: the workload gives keys starting with 'e' a short TTL (they
  // expire and run again during the soak) and every other key one longer than the soak.
  std::int64_t expiring_ttl_ms = 0;
  std::int64_t durable_ttl_ms = 0;
  // Whether the store promises tokens unique across all keys (SPEC §2).
  bool unique_tokens_store_wide = true;
  // Slack for comparing times read by different processes, whole milliseconds each.
  std::int64_t slack_ms = 5;

  std::int64_t ttl_of(std::string_view key) const {
    return !key.empty() && key.front() == 'e' ? expiring_ttl_ms : durable_ttl_ms;
  }
};

// A key's record as the store holds it after the soak.
struct FinalRecord {
  bool complete = false;
  Token token = 0;
  std::string digest;  // of the payload, when complete
};

// What the logs and the final records add up to.
struct SoakReport {
  long long calls = 0;      // lines for finished run() calls
  long long ran = 0;        // actions that made a payload
  long long completed = 0;  // done lines
  long long replays = 0;    // replay lines (from the store or from an owner in memory)
  long long busy = 0;
  long long lost = 0;
  long long released = 0;  // fail lines
  long long unavailable = 0;
  long long purged = 0;  // records deleted by purge
  long long torn = 0;    // last lines cut short by a kill
  std::size_t keys = 0;  // keys any line names
  std::vector<std::string> violations;
};

// Checks the logs (each one file's whole text) against the rules:
//  - every completion, replay and final record names a token whose action ran on that key and
//    made exactly that payload (no payload from nowhere, no replay that differs from what
//    was stored);
//  - no token ran twice, and none ran on two keys where the store promises unique tokens;
//  - after a completion, no action ran on the key again before the completion's TTL could
//    have passed (a key completed twice, or its record vanished or was overwritten early);
//  - a replay's record expires exactly one TTL after it completed, and had not expired
//    when the call began;
//  - a completion whose TTL cannot have passed when the soak ended is still the key's
//    record (`final_records`, read after the soak at `checked_at_ms`; a key missing from
//    the map has no record).
// Lines that do not parse are violations, except a last line without its newline (a
// process killed while writing it never got past the write, so its call never returned).
SoakReport check_soak(const std::vector<std::string>& logs,
                      const std::map<std::string, FinalRecord>& final_records,
                      std::int64_t checked_at_ms, const SoakRules& rules);

// The keys the logs name (to read their final records).
std::vector<std::string> keys_in_logs(const std::vector<std::string>& logs);

}  // namespace idem::soak
