#include "idem/error.h"

#include <string>
#include <utility>

namespace idem {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kPayloadTooLarge:
      return "payload too large";
    case ErrorCode::kInProgress:
      return "in progress";
    case ErrorCode::kKeyReuse:
      return "key reuse";
    case ErrorCode::kLeaseLost:
      return "lease lost";
    case ErrorCode::kStoreUnavailable:
      return "store unavailable";
    case ErrorCode::kDecodeFailed:
      return "decode failed";
    case ErrorCode::kShutDown:
      return "shut down";
  }
  return "unknown error";
}

bool is_retryable(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInProgress:
    case ErrorCode::kLeaseLost:
    case ErrorCode::kStoreUnavailable:
    case ErrorCode::kShutDown:
      return true;
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kPayloadTooLarge:
    case ErrorCode::kKeyReuse:
    case ErrorCode::kDecodeFailed:
      return false;
  }
  return false;
}

std::string printable(std::string_view bytes, std::size_t max) {
  std::string out;
  for (const char ch : bytes) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out.push_back(ch);
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

namespace {

std::string with_record(const std::string& message, RecordRef record) {
  if (record.scope.empty() && record.key.empty()) return message;
  return message + " (scope \"" + printable(record.scope) + "\", key \"" + printable(record.key) +
         "\")";
}

}  // namespace

Error::Error(ErrorCode code, const std::string& message, RecordRef record)
    : std::runtime_error(with_record(message, record)), code_(code) {
  if (!record.scope.empty() || !record.key.empty()) {
    record_ =
        std::make_shared<const Record>(Record{std::string(record.scope), std::string(record.key)});
  }
}

const std::string& Error::scope() const noexcept {
  static const std::string kNone;
  return record_ ? record_->scope : kNone;
}

const std::string& Error::key() const noexcept {
  static const std::string kNone;
  return record_ ? record_->key : kNone;
}

InvalidArgument::InvalidArgument(std::string argument, const std::string& why)
    : InvalidArgument(ErrorCode::kInvalidArgument, std::move(argument), why, {}) {}

InvalidArgument::InvalidArgument(ErrorCode code, std::string argument, const std::string& why,
                                 RecordRef record)
    : Error(code, "invalid " + argument + ": " + why, record), argument_(std::move(argument)) {}

PayloadTooLarge::PayloadTooLarge(std::size_t size, std::size_t limit, RecordRef record)
    : InvalidArgument(ErrorCode::kPayloadTooLarge, "payload",
                      "the result is " + std::to_string(size) + " bytes, more than the limit of " +
                          std::to_string(limit) + " bytes; the record was released",
                      record),
      size_(size),
      limit_(limit) {}

namespace {
std::string in_progress_message(Timestamp deadline, Duration remaining) {
  return "another caller holds the lease until " + to_iso8601(deadline) +
         " by the store's clock (" + std::to_string(remaining.count()) + " ms from then)";
}
}  // namespace

InProgress::InProgress(Timestamp lease_expires_at, Duration lease_remaining, RecordRef record)
    : Error(ErrorCode::kInProgress, in_progress_message(lease_expires_at, lease_remaining), record),
      lease_expires_at_(lease_expires_at),
      lease_remaining_(lease_remaining) {}

KeyReuse::KeyReuse(std::string stored_fingerprint, std::string request_fingerprint,
                   RecordRef record)
    : Error(ErrorCode::kKeyReuse,
            "the key was already used for a different request (fingerprints differ)", record),
      stored_(std::move(stored_fingerprint)),
      request_(std::move(request_fingerprint)) {}

LeaseLost::LeaseLost(Token token, const std::string& why, RecordRef record)
    : Error(ErrorCode::kLeaseLost, "lease " + std::to_string(token) + " was lost: " + why, record),
      token_(token) {}

StoreUnavailable::StoreUnavailable(std::string store, std::string reason, RecordRef record,
                                   bool unconfirmed)
    : Error(ErrorCode::kStoreUnavailable, "store " + store + " unavailable: " + reason, record),
      store_(std::move(store)),
      reason_(std::move(reason)),
      unconfirmed_(unconfirmed) {}

StoreNotFound::StoreNotFound(std::string store, std::string reason)
    : StoreUnavailable(std::move(store), std::move(reason)) {}

DecodeFailed::DecodeFailed(std::string bytes, const std::string& reason, RecordRef record)
    : Error(ErrorCode::kDecodeFailed,
            "the stored result (" + std::to_string(bytes.size()) +
                " bytes) could not be decoded: " + reason,
            record),
      bytes_(std::move(bytes)),
      reason_(reason) {}

ShutDown::ShutDown(const std::string& why) : Error(ErrorCode::kShutDown, why) {}

}  // namespace idem
