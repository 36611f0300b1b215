#pragma once

// The errors of SPEC §11: one flat family under idem::Error. Outcomes the contract expects
// (busy, replay, fenced) are values, never exceptions; these are the failures.

#include <cstddef>
#include <stdexcept>
#include <string>

#include "idem/types.h"

namespace idem {

enum class ErrorCode {
  // An input breaks SPEC §10. Fix the call; retrying the same call fails the same way.
  kInvalidArgument,
  // A duplicate found a live lease and its waiting bound ran out. Retry after the lease
  // deadline, or answer the client "409 Conflict / try later".
  kInProgress,
  // The same (scope, key) was sent with a different request fingerprint. The client reused
  // a key for a different request; do not retry.
  kKeyReuse,
  // complete (or the heartbeat) was fenced: another caller now owns the key and this
  // result was not recorded. Treat the work as not having happened idempotently.
  kLeaseLost,
  // The store could not be reached, timed out or failed. Retry later.
  kStoreUnavailable,
};

const char* to_string(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

class InvalidArgument : public Error {
 public:
  // `argument` names the offending input ("key", "ttl", "payload", "store URL", ...).
  InvalidArgument(std::string argument, const std::string& why);
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

// The action's encoded result is larger than the payload limit. The record was released,
// so a later call starts clean.
class PayloadTooLarge : public InvalidArgument {
 public:
  PayloadTooLarge(std::size_t size, std::size_t limit);
  std::size_t size() const noexcept { return size_; }
  std::size_t limit() const noexcept { return limit_; }

 private:
  std::size_t size_;
  std::size_t limit_;
};

class InProgress : public Error {
 public:
  InProgress(Timestamp lease_expires_at, Duration lease_remaining);
  // The owner's lease deadline, by the store's clock.
  Timestamp lease_expires_at() const noexcept { return lease_expires_at_; }
  // Time left on the owner's lease when it was last seen, by the store's clock.
  Duration lease_remaining() const noexcept { return lease_remaining_; }

 private:
  Timestamp lease_expires_at_;
  Duration lease_remaining_;
};

class KeyReuse : public Error {
 public:
  KeyReuse(std::string stored_fingerprint, std::string request_fingerprint);
  const std::string& stored_fingerprint() const noexcept { return stored_; }
  const std::string& request_fingerprint() const noexcept { return request_; }

 private:
  std::string stored_;
  std::string request_;
};

class LeaseLost : public Error {
 public:
  LeaseLost(Token token, const std::string& why);
  Token token() const noexcept { return token_; }

 private:
  Token token_;
};

class StoreUnavailable : public Error {
 public:
  // `store` names the store with its URL redacted ("sqlite:///var/lib/x.db").
  StoreUnavailable(std::string store, std::string reason);
  const std::string& store() const noexcept { return store_; }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string store_;
  std::string reason_;
};

}  // namespace idem
