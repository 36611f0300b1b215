#pragma once

// A Store keeps one record per (scope, key) and moves it along the edges of SPEC §4. Each
// operation is one atomic step judged against the store's own clock (SPEC §6).
//
// Every method is safe to call from many threads at once. A method that cannot reach its
// store, or whose store fails, throws idem::StoreUnavailable naming the store and the cause;
// it then may or may not have taken effect (a lost reply). Expected outcomes (busy, replay,
// fenced) are returned as values, never thrown.
//
// A store that makes writes durable beyond the server that answers (Redis with
// wait_replicas) throws StoreUnavailable with unconfirmed() set when a write may have taken
// effect there but was not confirmed as durable as asked: a read of the record then shows
// the write and proves nothing about it surviving a failover, so callers must not take such
// a read as proof (the executor repeats the complete instead, see error.h).
//
// The public methods are non-virtual: they validate their inputs once (SPEC §10) and throw
// idem::InvalidArgument before anything reaches the store, then call the protected do_*
// method that a store implements. A store never repeats the validation.
//
// Scope and key are arbitrary byte strings (NUL included); a record is identified by the
// exact pair, so ("a:b", "c") and ("a", "b:c") are different records.

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/types.h"

namespace idem {

// SPEC §10.
inline constexpr std::size_t kMaxScopeBytes = 255;
inline constexpr std::size_t kMaxKeyBytes = 1024;
inline constexpr std::size_t kDefaultMaxPayloadBytes = std::size_t{1} << 20;  // 1 MiB
inline constexpr std::size_t kMaxPayloadBytes = std::size_t{64} << 20;        // 64 MiB
inline constexpr Duration kMaxDuration = std::chrono::hours(24 * 365);

// One lease of a batched extend (Store::extend_many).
class TransactionalStore;

struct ExtendRequest {
  std::string_view scope;
  std::string_view key;
  Token token = 0;
  Duration lease{0};
};

// A subscription to a record's changes (Store::watch). Destroying it ends the subscription:
// once the destructor returns, the callback is not running and is never called again.
class RecordWatch {
 public:
  virtual ~RecordWatch() = default;
  RecordWatch() = default;
  RecordWatch(const RecordWatch&) = delete;
  RecordWatch& operator=(const RecordWatch&) = delete;
};

class Store {
 public:
  virtual ~Store() = default;
  Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Takes the lease on (scope, key), or reports why not.
  //  - Absent, or COMPLETE with expires_at <= now: Acquired{stolen=false}, attempt 1.
  //  - IN_PROGRESS with lease_expires_at <= now: Acquired{stolen=true}, attempt + 1, new
  //    token, expires_at = now + ttl.
  //  - IN_PROGRESS with a live lease: Busy, record unchanged.
  //  - COMPLETE, not expired: Replay, record unchanged.
  // A new lease has lease_expires_at = now + lease and expires_at = now + ttl. The
  // fingerprint, when given, is stored with the record; Busy and Replay report the stored
  // one so the caller can detect key reuse.
  // REQUIRES: valid scope and key; 0 < lease, ttl <= 365 days.
  AcquireResult acquire(std::string_view scope, std::string_view key, Duration lease, Duration ttl,
                        std::optional<std::string_view> fingerprint = std::nullopt);

  // Moves the record from IN_PROGRESS with `token` to COMPLETE with the payload,
  // completed_at = now and expires_at = now + ttl. Repeating a complete with the token that
  // completed the record returns kDone and changes nothing. Otherwise kFenced.
  // REQUIRES: payload.size() <= kMaxPayloadBytes; 0 < ttl <= 365 days.
  [[nodiscard]] WriteResult complete(std::string_view scope, std::string_view key, Token token,
                                     std::string_view payload, Duration ttl);

  // Deletes the record while it is IN_PROGRESS with `token`; otherwise kFenced.
  [[nodiscard]] WriteResult release(std::string_view scope, std::string_view key, Token token);

  // The heartbeat: while IN_PROGRESS with `token`, sets lease_expires_at = now + lease and
  // reports the new deadline. Does not touch expires_at. Otherwise kFenced.
  [[nodiscard]] ExtendResult extend(std::string_view scope, std::string_view key, Token token,
                                    Duration lease);

  // The heartbeat's batched extend: applies extend() to each request, as if one at a time
  // in order, and returns one result per request in the same order. A store that can sends
  // the whole batch in one round trip (the default calls do_extend once per request).
  // Throws StoreUnavailable when the batch failed or its outcome is unknown; any subset of
  // the extends may then have taken effect, which is harmless: an extend only pushes a
  // live lease's deadline forward.
  // REQUIRES: every request has a valid scope and key and 0 < lease <= 365 days.
  [[nodiscard]] std::vector<ExtendResult> extend_many(std::span<const ExtendRequest> requests);

  // Deletes at most `limit` records that are COMPLETE with expires_at <= now, or
  // IN_PROGRESS with expires_at <= now and lease_expires_at <= now. Returns how many.
  // Stores with native expiry may return 0 and let the server drop records.
  // REQUIRES: limit > 0.
  std::size_t purge(std::size_t limit);

  // A read-only snapshot; changes nothing. Expired records that were not purged yet are
  // returned as they are (compare their times with Record::now).
  std::optional<Record> get(std::string_view scope, std::string_view key);

  // An operator's delete, regardless of state. Returns whether a record was deleted.
  bool forget(std::string_view scope, std::string_view key);

  // SPEC §7: asks to be told when (scope, key) may have been completed or released, by any
  // process using the same store (a waiting duplicate then asks the store again instead of
  // sleeping out its backoff). `changed` runs on a thread of the store's; it must return
  // quickly and must not call the store or destroy the watch. It may run when nothing
  // changed (records share signals), and a change may go untold (a lost notification, an
  // expiring lease, a completion inside a caller's transaction): a waiter keeps polling,
  // the notification only shortens its sleep. Null when the store cannot notify (the
  // default). Thousands of watches share the store's one listener.
  // REQUIRES: valid scope and key.
  std::unique_ptr<RecordWatch> watch(std::string_view scope, std::string_view key,
                                     std::function<void()> changed);

  // Names the store for messages, with any password redacted: "sqlite:///var/x.db".
  virtual std::string describe() const = 0;

  // The steps this store can take on a caller's own database transaction (SPEC §14,
  // idem/transaction.h), or null when its records cannot join one (Redis, memory).
  virtual TransactionalStore* transactions() noexcept { return nullptr; }

 protected:
  virtual AcquireResult do_acquire(std::string_view scope, std::string_view key, Duration lease,
                                   Duration ttl, std::optional<std::string_view> fingerprint) = 0;
  virtual WriteResult do_complete(std::string_view scope, std::string_view key, Token token,
                                  std::string_view payload, Duration ttl) = 0;
  virtual WriteResult do_release(std::string_view scope, std::string_view key, Token token) = 0;
  virtual ExtendResult do_extend(std::string_view scope, std::string_view key, Token token,
                                 Duration lease) = 0;
  // Not pure: the default extends one request at a time through do_extend. A store with a
  // cheaper batched form overrides it; the result must have one entry per request.
  virtual std::vector<ExtendResult> do_extend_many(std::span<const ExtendRequest> requests);
  virtual std::size_t do_purge(std::size_t limit) = 0;
  virtual std::optional<Record> do_get(std::string_view scope, std::string_view key) = 0;
  virtual bool do_forget(std::string_view scope, std::string_view key) = 0;
  // Not pure: the default cannot notify and returns null.
  virtual std::unique_ptr<RecordWatch> do_watch(std::string_view scope, std::string_view key,
                                                std::function<void()> changed);

  friend class StoreWrapper;
};

// Validation shared by the store front door, the executor and the tools. Each throws
// idem::InvalidArgument naming the input and the rule it breaks.
void validate_scope(std::string_view scope);
void validate_key(std::string_view key);
void validate_duration(std::string_view name, Duration d);
void validate_payload_size(std::size_t size, std::size_t limit);

}  // namespace idem
