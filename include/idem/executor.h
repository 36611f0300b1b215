#pragma once

// The executor runs an action at most once per (scope, key) on a store (SPEC §5, §7).
//
//   idem::Executor exec(idem::open_store("sqlite:///var/lib/app/idem.db"));
//   auto r = exec.run<std::string>("payments", request_id, [&](const idem::Attempt& a) {
//     return charge(card, amount, /*fencing token*/ a.token());
//   });
//   if (r.replayed) { ... }  // a duplicate: the first run's result, the action did not run
//
// Callers whose action does not fit in one blocking call use begin() and an AttemptHandle
// instead (docs/api.md). It knows nothing of any particular store.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "idem/codec.h"
#include "idem/error.h"
#include "idem/store.h"
#include "idem/types.h"

namespace idem {

using namespace std::chrono_literals;

// What a duplicate does when it finds the key held by a live lease.
struct WaitPolicy {
  // How long to wait in total for the owner to finish. 0: fail at once with InProgress.
  Duration max_wait{0};
  // First pause between polls of the store; doubles up to max_backoff, with jitter.
  // Never sleeps past the owner's lease deadline.
  Duration initial_backoff{10};
  Duration max_backoff{1000};
};

struct ExecutorOptions {
  // How long a lease lasts without a heartbeat.
  Duration lease = 30s;
  // How often the heartbeat extends a lease. 0: lease / 3.
  Duration heartbeat = Duration{0};
  // How long a completed result is replayed (retention).
  Duration ttl = 24h;
  // What a duplicate does when the key is busy. Default: fail at once.
  WaitPolicy wait{};
  // The largest encoded result the executor stores; larger results are refused with
  // PayloadTooLarge and the record is released. At most kMaxPayloadBytes.
  std::size_t max_payload = kDefaultMaxPayloadBytes;
  // Called from the heartbeat thread when an extend fails with an error (the lease is
  // kept until the local view of its deadline passes). Must not throw. Null: ignored.
  std::function<void(const std::exception&)> on_heartbeat_error{};
};

// Per-call overrides of ExecutorOptions; unset fields take the executor's values.
struct CallOptions {
  std::optional<Duration> lease{};
  std::optional<Duration> heartbeat{};
  std::optional<Duration> ttl{};
  std::optional<WaitPolicy> wait{};
  // A digest of the request. When both the stored record and the call carry one and they
  // differ, run throws KeyReuse instead of replaying or waiting.
  std::optional<std::string> fingerprint{};
};

// What the action sees of its lease.
class Attempt {
 public:
  Attempt(Token token, std::uint32_t number, bool stolen, std::stop_token stop)
      : token_(token), number_(number), stolen_(stolen), stop_(std::move(stop)) {}

  // The lease token: hand it to downstream systems as a fencing token.
  Token token() const noexcept { return token_; }
  // 1 on the first acquisition of the key, +1 each time an abandoned lease was stolen.
  std::uint32_t number() const noexcept { return number_; }
  // Whether this attempt took over the abandoned lease of an earlier one.
  bool stolen() const noexcept { return stolen_; }
  // Requested when the lease is lost (fenced by the store, or the heartbeat could not
  // reach the store before the lease deadline). Stop work as soon as it is convenient.
  std::stop_token stop_token() const noexcept { return stop_; }
  bool lease_lost() const noexcept { return stop_.stop_requested(); }

 private:
  Token token_;
  std::uint32_t number_;
  bool stolen_;
  std::stop_token stop_;
};

template <typename T>
struct Result {
  T value;
  // True when the value is a stored result of an earlier run and the action did not run.
  bool replayed = false;
};

namespace detail {
class ExecutorImpl;
struct InFlight;

// Lets only the executor build a handle (std::variant builds it in place, so the
// constructor is public but needs this key).
class HandleKey {
  friend class ExecutorImpl;
  HandleKey() = default;
};

// The untyped part of AttemptHandle<T>: everything but the typed complete().
class AttemptCore {
 public:
  AttemptCore() noexcept = default;
  AttemptCore(AttemptCore&& other) noexcept
      : keep_alive_(std::move(other.keep_alive_)),
        state_(std::move(other.state_)),
        ended_(other.ended_) {}
  // Releases the lease this handle holds, if any, then takes over `other`'s.
  AttemptCore& operator=(AttemptCore&& other) noexcept;
  AttemptCore(const AttemptCore&) = delete;
  AttemptCore& operator=(const AttemptCore&) = delete;
  // Releases the lease when neither complete() nor release() ended it.
  ~AttemptCore() {
    if (state_ != nullptr && !ended_) release();
  }

  // Whether the handle still holds its lease: it was neither completed, released nor
  // moved from. A lost lease is still held until the handle ends (see lease_lost()).
  bool active() const noexcept;
  explicit operator bool() const noexcept { return active(); }

  // What an action given to run() sees, for code written for both forms. Valid as long as
  // the handle is not moved from (ended handles keep it).
  const Attempt& attempt() const;
  Token token() const { return attempt().token(); }
  std::uint32_t number() const { return attempt().number(); }
  bool stolen() const { return attempt().stolen(); }
  std::stop_token stop_token() const { return attempt().stop_token(); }
  bool lease_lost() const { return attempt().lease_lost(); }
  std::string_view scope() const;
  std::string_view key() const;

  // Gives the key up: stops the heartbeat for this lease and releases the record, so the
  // next caller runs as attempt 1 (SPEC §4). Best effort, as when run()'s action throws: if
  // the store cannot be reached the lease simply expires and the next caller steals it.
  // Does nothing on a handle that has already ended.
  void release() noexcept;

 protected:
  AttemptCore(std::shared_ptr<InFlight> state, std::shared_ptr<ExecutorImpl> keep_alive) noexcept;
  // Stores `bytes` as the result. See AttemptHandle::complete.
  Result<std::string> complete_bytes(std::string bytes);

 private:
  friend class ExecutorImpl;
  InFlight& state() const;

  // Set when the handle came from Executor::begin: the executor's state lives as long as
  // its open handles. A handle made by run() lives inside the call and needs none.
  std::shared_ptr<ExecutorImpl> keep_alive_;
  std::shared_ptr<InFlight> state_;
  // Set when this handle ended the lease, so that its destructor has nothing to do.
  bool ended_ = false;
};
}  // namespace detail

// The lease on a key that Executor::begin acquired: the caller runs the action its own way
// (a callback, another thread, a later event) and ends the handle with complete() or
// release(). Until then the executor's heartbeat keeps the lease alive, and duplicates in
// this process wait on the handle in memory exactly as they wait on run().
//
// Movable, not copyable. A handle may be moved to, and ended on, any thread; one handle
// must not be used by two threads at once. Dropping a handle that was neither completed nor
// released releases the record, so an exception or a forgotten handle leaves no stuck key.
template <typename T = std::string>
class AttemptHandle : public detail::AttemptCore {
 public:
  // An empty handle (active() is false), to be assigned from a BeginResult.
  AttemptHandle() noexcept = default;

  // Stops the heartbeat for this lease and records `value` (through Codec<T>) as the
  // result; duplicates waiting in this process get it at once. Returns the value, not
  // replayed. Throws, after which the handle has ended either way:
  //  - PayloadTooLarge: the encoded result is larger than max_payload; the record was
  //    released so a later call starts clean.
  //  - LeaseLost: the store fenced the write (somebody took the key over); not recorded.
  //  - StoreUnavailable: the store kept failing for as long as the lease was ours.
  //  - std::logic_error: the handle had already ended (or was moved from).
  Result<T> complete(T value) {
    if constexpr (std::is_same_v<T, std::string>) {
      return complete_bytes(std::move(value));
    } else {
      (void)complete_bytes(Codec<T>::encode(value));
      return Result<T>{std::move(value), false};
    }
  }

 private:
  friend class Executor;
  friend class detail::ExecutorImpl;
  explicit AttemptHandle(detail::AttemptCore&& core) noexcept
      : detail::AttemptCore(std::move(core)) {}

 public:
  // For the executor only (see detail::HandleKey).
  AttemptHandle(detail::HandleKey, std::shared_ptr<detail::InFlight> state,
                std::shared_ptr<detail::ExecutorImpl> keep_alive) noexcept
      : detail::AttemptCore(std::move(state), std::move(keep_alive)) {}
};

// What Executor::begin found, one of:
//  - kReplay: the key completed earlier; replay() holds the stored result (replayed = true).
//  - kBusy: a live lease holds the key and the waiting policy ran out (at once by default);
//    busy() says when that lease ends. run() throws InProgress here instead.
//  - kAcquired: this call holds the lease; handle() is the AttemptHandle that owns it.
enum class BeginKind { kReplay, kBusy, kAcquired };

template <typename T = std::string>
class BeginResult {
 public:
  BeginKind kind() const noexcept { return static_cast<BeginKind>(v_.index()); }
  // Each is null unless kind() says so.
  Result<T>* replay() noexcept { return std::get_if<0>(&v_); }
  const Result<T>* replay() const noexcept { return std::get_if<0>(&v_); }
  const Busy* busy() const noexcept { return std::get_if<1>(&v_); }
  AttemptHandle<T>* handle() noexcept { return std::get_if<2>(&v_); }
  const AttemptHandle<T>* handle() const noexcept { return std::get_if<2>(&v_); }

 private:
  friend class Executor;
  friend class detail::ExecutorImpl;
  explicit BeginResult(Result<T> replay) : v_(std::in_place_index<0>, std::move(replay)) {}
  explicit BeginResult(Busy busy) : v_(std::in_place_index<1>, std::move(busy)) {}
  explicit BeginResult(AttemptHandle<T> handle) : v_(std::in_place_index<2>, std::move(handle)) {}
  // Builds the handle in place.
  BeginResult(detail::HandleKey key, std::shared_ptr<detail::InFlight> state,
              std::shared_ptr<detail::ExecutorImpl> keep_alive)
      : v_(std::in_place_index<2>, key, std::move(state), std::move(keep_alive)) {}

  std::variant<Result<T>, Busy, AttemptHandle<T>> v_;
};

class Executor {
 public:
  explicit Executor(std::shared_ptr<Store> store, ExecutorOptions options = {});
  // Stops the heartbeat thread. REQUIRES: no run() or begin() in flight. Handles still open
  // keep the executor's state (and its heartbeat) alive until they end.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs `action(const Attempt&)` at most once per (scope, key) and returns its result, or
  // the stored result of the run that completed first. Throws InvalidArgument, InProgress,
  // KeyReuse, LeaseLost, StoreUnavailable (SPEC §11), or the action's own exception
  // unchanged after releasing the record.
  //
  // Exactly begin(), then the action, then the handle's complete() (or, when the action
  // throws, the handle's release()).
  template <typename T, typename F>
  Result<T> run(std::string_view scope, std::string_view key, F&& action,
                const CallOptions& call = {}) {
    static_assert(std::is_invocable_r_v<T, F&, const Attempt&>,
                  "the action must be callable as T(const idem::Attempt&)");
    BeginResult<T> begun = begin_as<T>(scope, key, call, /*keep_alive=*/false);
    if (Result<T>* replay = begun.replay()) return std::move(*replay);
    if (const Busy* busy = begun.busy()) {
      throw InProgress(busy->lease_expires_at, busy->lease_remaining);
    }
    // If the action throws, the handle's destructor releases the record on the way out
    // and the action's exception reaches the caller unchanged (SPEC §5).
    AttemptHandle<T>& handle = *begun.handle();
    return handle.complete(action(handle.attempt()));
  }

  // run for an action returning std::string (bytes).
  template <typename F>
  Result<std::string> run(std::string_view scope, std::string_view key, F&& action,
                          const CallOptions& call = {}) {
    return run<std::string>(scope, key, std::forward<F>(action), call);
  }

  using BytesResult = Result<std::string>;
  using BytesAction = std::function<std::string(const Attempt&)>;

  // run for a std::function returning bytes (the `idem` tool uses it).
  BytesResult run_bytes(std::string_view scope, std::string_view key, const BytesAction& action,
                        const CallOptions& call = {});

  // The first half of run(), for a caller whose action does not fit in one blocking call
  // (an asynchronous upstream call, a message acknowledged on another thread, a binding to
  // another language). Checks the inputs, then acquires, waits (under a waiting policy)
  // and replays exactly as run() does, but returns instead of running anything:
  // a replay, a busy answer, or an AttemptHandle that holds the lease (see BeginResult).
  // Throws InvalidArgument, KeyReuse and StoreUnavailable as run() does; never InProgress.
  // For T other than std::string a replay is decoded with Codec<T>.
  template <typename T = std::string>
  BeginResult<T> begin(std::string_view scope, std::string_view key,
                       const CallOptions& call = {}) {
    return begin_as<T>(scope, key, call, /*keep_alive=*/true);
  }

  Store& store() const noexcept;
  const ExecutorOptions& options() const noexcept;

  // How many leases the heartbeat currently keeps alive (for tests and metrics).
  std::size_t active_leases() const;
  // How many duplicates are waiting in memory on a call of this executor that holds their
  // key (for tests and metrics).
  std::size_t waiting_duplicates() const;

 private:
  BeginResult<std::string> begin_bytes(std::string_view scope, std::string_view key,
                                       const CallOptions& call, bool keep_alive);

  template <typename T>
  BeginResult<T> begin_as(std::string_view scope, std::string_view key, const CallOptions& call,
                          bool keep_alive) {
    if constexpr (std::is_same_v<T, std::string>) {
      return begin_bytes(scope, key, call, keep_alive);
    } else {
      BeginResult<std::string> bytes = begin_bytes(scope, key, call, keep_alive);
      if (auto* replay = bytes.replay()) {
        return BeginResult<T>(Result<T>{Codec<T>::decode(replay->value), true});
      }
      if (auto* busy = bytes.busy()) return BeginResult<T>(Busy(*busy));
      return BeginResult<T>(AttemptHandle<T>(std::move(*bytes.handle())));
    }
  }

  std::shared_ptr<detail::ExecutorImpl> impl_;
};

}  // namespace idem
