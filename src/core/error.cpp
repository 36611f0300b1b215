#include "idem/error.h"

#include <string>
#include <utility>

namespace idem {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kInProgress:
      return "in progress";
    case ErrorCode::kKeyReuse:
      return "key reuse";
    case ErrorCode::kLeaseLost:
      return "lease lost";
    case ErrorCode::kStoreUnavailable:
      return "store unavailable";
  }
  return "unknown error";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

InvalidArgument::InvalidArgument(std::string argument, const std::string& why)
    : Error(ErrorCode::kInvalidArgument, "invalid " + argument + ": " + why),
      argument_(std::move(argument)) {}

PayloadTooLarge::PayloadTooLarge(std::size_t size, std::size_t limit)
    : InvalidArgument("payload", "the result is " + std::to_string(size) +
                                     " bytes, more than the limit of " +
                                     std::to_string(limit) + " bytes"),
      size_(size),
      limit_(limit) {}

namespace {
std::string in_progress_message(Timestamp deadline, Duration remaining) {
  return "another caller holds the lease; it ends in " + std::to_string(remaining.count()) +
         " ms (at " + std::to_string(deadline.time_since_epoch().count()) +
         " ms since the epoch by the store's clock)";
}
}  // namespace

InProgress::InProgress(Timestamp lease_expires_at, Duration lease_remaining)
    : Error(ErrorCode::kInProgress, in_progress_message(lease_expires_at, lease_remaining)),
      lease_expires_at_(lease_expires_at),
      lease_remaining_(lease_remaining) {}

KeyReuse::KeyReuse(std::string stored_fingerprint, std::string request_fingerprint)
    : Error(ErrorCode::kKeyReuse,
            "the key was already used for a different request (fingerprints differ)"),
      stored_(std::move(stored_fingerprint)),
      request_(std::move(request_fingerprint)) {}

LeaseLost::LeaseLost(Token token, const std::string& why)
    : Error(ErrorCode::kLeaseLost,
            "lease " + std::to_string(token) + " was lost: " + why), token_(token) {}

StoreUnavailable::StoreUnavailable(std::string store, std::string reason)
    : Error(ErrorCode::kStoreUnavailable, "store " + store + " unavailable: " + reason),
      store_(std::move(store)),
      reason_(std::move(reason)) {}

}  // namespace idem
