#pragma once

// The errors of SPEC §11: one flat family under idem::Error. Outcomes the contract expects
// (busy, replay, fenced) are values, never exceptions; these are the failures.
//
// Every error says what to do about it: code() (documented below) and retryable(). An error
// about one record also names it: scope() and key() (raw bytes; the message shows them
// escaped). Times in messages are ISO-8601 UTC by the store's clock.

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "idem/types.h"

namespace idem {

enum class ErrorCode {
  // An input breaks SPEC §10. Fix the call; retrying the same call fails the same way.
  kInvalidArgument,
  // The action's encoded result is larger than max_payload; the record was released. Store
  // less (a reference instead of the blob) or raise the limit; a retry fails the same way.
  kPayloadTooLarge,
  // A duplicate found a live lease and its waiting bound ran out. Retry after the lease
  // deadline, or answer the client "409 Conflict / try later".
  kInProgress,
  // The same (scope, key) was sent with a different request fingerprint. The client reused
  // a key for a different request; do not retry.
  kKeyReuse,
  // complete (or the heartbeat) was fenced, or the action gave up on a lost lease: this
  // result was not recorded. Treat the work as not having happened idempotently; a retry
  // replays whoever completed the key, or runs the action again.
  kLeaseLost,
  // The store could not be reached, timed out or failed. Retry later.
  kStoreUnavailable,
  // A stored result could not be decoded by Codec<T>::decode (a codec bug, or a record
  // written by another version of the program). The record itself is intact; retrying
  // fails the same way until the codec accepts it or the record expires.
  kDecodeFailed,
  // The executor is shutting down (or was moved from) and refuses new calls. Retry on
  // another executor or process.
  kShutDown,
};

const char* to_string(ErrorCode code);

// Whether retrying the same call later can succeed (see each ErrorCode).
bool is_retryable(ErrorCode code) noexcept;

// The record an error is about, for the constructors below. Views: the error copies them.
struct RecordRef {
  std::string_view scope;
  std::string_view key;
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, RecordRef record = {});
  ErrorCode code() const noexcept { return code_; }
  bool retryable() const noexcept { return is_retryable(code_); }
  // The record the error is about; both empty when it is not about one.
  const std::string& scope() const noexcept;
  const std::string& key() const noexcept;

 private:
  struct Record {
    std::string scope;
    std::string key;
  };
  ErrorCode code_;
  // Shared, so that copying an exception never throws.
  std::shared_ptr<const Record> record_;
};

class InvalidArgument : public Error {
 public:
  // `argument` names the offending input ("key", "ttl", "payload", "store URL", ...).
  InvalidArgument(std::string argument, const std::string& why);
  const std::string& argument() const noexcept { return argument_; }

 protected:
  InvalidArgument(ErrorCode code, std::string argument, const std::string& why, RecordRef record);

 private:
  std::string argument_;
};

// The action's encoded result is larger than the payload limit. The record was released,
// so a later call starts clean. Still an InvalidArgument (argument() is "payload"), with a
// code of its own.
class PayloadTooLarge : public InvalidArgument {
 public:
  PayloadTooLarge(std::size_t size, std::size_t limit, RecordRef record = {});
  std::size_t size() const noexcept { return size_; }
  std::size_t limit() const noexcept { return limit_; }

 private:
  std::size_t size_;
  std::size_t limit_;
};

class InProgress : public Error {
 public:
  InProgress(Timestamp lease_expires_at, Duration lease_remaining, RecordRef record = {});
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
  KeyReuse(std::string stored_fingerprint, std::string request_fingerprint, RecordRef record = {});
  const std::string& stored_fingerprint() const noexcept { return stored_; }
  const std::string& request_fingerprint() const noexcept { return request_; }

 private:
  std::string stored_;
  std::string request_;
};

class LeaseLost : public Error {
 public:
  // `why` says what happened to the lease ("another caller took the key over", ...).
  LeaseLost(Token token, const std::string& why, RecordRef record = {});
  // The token of the lease that was lost.
  Token token() const noexcept { return token_; }

 private:
  Token token_;
};

class StoreUnavailable : public Error {
 public:
  // `store` names the store with its URL redacted ("sqlite:///var/lib/x.db").
  // `unconfirmed`: see unconfirmed().
  StoreUnavailable(std::string store, std::string reason, RecordRef record = {},
                   bool unconfirmed = false);
  const std::string& store() const noexcept { return store_; }
  const std::string& reason() const noexcept { return reason_; }
  // True when a write may have taken effect where the store can read it back, but the store
  // could not confirm it as durable as it was asked to (Redis with wait_replicas: fewer
  // replicas than asked acknowledged it, so a failover may lose it). Reading the record
  // back then shows the write and proves nothing: the executor never takes such a read as
  // proof that a result was recorded; only the same write repeated and confirmed is (SPEC
  // §4 makes a repeated complete safe). False for every other failure, whose outcome a
  // read of the record settles.
  bool unconfirmed() const noexcept { return unconfirmed_; }

 private:
  std::string store_;
  std::string reason_;
  bool unconfirmed_;
};

// The store does not exist, and the caller opened it without creating it
// (OpenOptions::create_if_missing false, or read_only): a missing SQLite file. A
// StoreUnavailable (same code, so existing handling stays right) that a tool can tell apart
// from an outage without knowing which store it opened: `idem show` reports "no records",
// `idem forget` a mistyped store.
class StoreNotFound : public StoreUnavailable {
 public:
  StoreNotFound(std::string store, std::string reason);
};

// Codec<T>::decode threw on a stored result. The executor wraps whatever it threw; the
// original message is in reason(), the bytes as stored in bytes().
class DecodeFailed : public Error {
 public:
  DecodeFailed(std::string bytes, const std::string& reason, RecordRef record = {});
  const std::string& bytes() const noexcept { return bytes_; }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string bytes_;
  std::string reason_;
};

// The executor refuses the call: it is shutting down, or was moved from.
class ShutDown : public Error {
 public:
  explicit ShutDown(const std::string& why);
};

// For messages: `bytes` with anything but printable ASCII escaped (\xNN), cut to about
// `max` characters. Scopes and keys are arbitrary bytes (SPEC §10).
std::string printable(std::string_view bytes, std::size_t max = 64);

}  // namespace idem
