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

#include <atomic>
#include <chrono>
#include <concepts>
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

// What a duplicate does when it finds the key held by a live lease.
struct WaitPolicy {
  // How long to wait in total for the owner to finish. 0: fail at once with InProgress.
  Duration max_wait{0};
  // First pause between polls of the store; doubles up to max_backoff, with jitter.
  // Never sleeps past the owner's lease deadline.
  Duration initial_backoff{10};
  Duration max_backoff{1000};
};

// What happened, for ExecutorOptions::on_event (metrics, logs, traces).
enum class EventKind {
  kRan,             // a fresh result was recorded (elapsed: from begin to complete)
  kReplayed,        // a stored result was returned from the store; the action did not run
  kFollowed,        // a duplicate got an in-process owner's result in memory, no store call
  kInProgress,      // the key was busy when the waiting bound ran out (run threw InProgress)
  kReleased,        // a lease was given up: the action threw, release(), a dropped handle,
                    // an oversize result, or a shutdown that could not wait any longer
  kStolen,          // a lease was acquired by taking over an abandoned one
  kLeaseLost,       // a lease was lost: fenced by the store, or unextended past its deadline
  kHeartbeatError,  // an extend failed with an error (error is set); the lease is kept
  kAbandoned,       // a lease was left to run out unreleased: AttemptHandle::abandon()
};

const char* to_string(EventKind kind);

struct Event {
  EventKind kind = EventKind::kRan;
  std::string_view scope;
  std::string_view key;
  // The lease concerned, and its attempt number; 0 when no lease of this process is
  // involved (a replay from the store, a busy key held by another process).
  Token token = 0;
  std::uint32_t attempt = 0;
  // Since the call began; for kLeaseLost and kHeartbeatError, since the lease was acquired.
  std::chrono::microseconds elapsed{0};
  // kHeartbeatError: the store's error. Null otherwise.
  const std::exception* error = nullptr;
};

using EventHook = std::function<void(const Event&)>;

struct ExecutorOptions {
  // How long a lease lasts without a heartbeat.
  Duration lease = std::chrono::seconds(30);
  // How often the heartbeat extends a lease. 0: lease / 3.
  Duration heartbeat = Duration{0};
  // How long a completed result is replayed (retention).
  Duration ttl = std::chrono::hours(24);
  // What a duplicate does when the key is busy. Default: fail at once.
  WaitPolicy wait{};
  // The largest encoded result the executor stores; larger results are refused with
  // PayloadTooLarge and the record is released. At most kMaxPayloadBytes.
  std::size_t max_payload = kDefaultMaxPayloadBytes;
  // Called from the heartbeat thread when an extend fails with an error (the lease is
  // kept until the local view of its deadline passes). Must not throw. Null: ignored.
  std::function<void(const std::exception&)> on_heartbeat_error{};
  // Called for every event (EventKind) on the thread where it happened: the caller's, or
  // the heartbeat thread for kLeaseLost found by an extend and for kHeartbeatError. Called
  // from many threads at once; keep it quick. Exceptions it throws are swallowed. The
  // Event's views are valid during the call only. Null: no event is built at all.
  EventHook on_event{};
  // How long shutdown() (and the destructor) waits for calls in flight and open handles to
  // end before it releases their leases itself.
  Duration shutdown_timeout = std::chrono::seconds(10);
};

// Per-call overrides of ExecutorOptions; unset fields take the executor's values.
struct CallOptions {
  std::optional<Duration> lease{};
  // Unset: the executor's heartbeat interval, or lease / 3 when that is not shorter than
  // this call's lease.
  std::optional<Duration> heartbeat{};
  std::optional<Duration> ttl{};
  std::optional<WaitPolicy> wait{};
  // A digest of the request. When both the stored record and the call carry one and they
  // differ, run throws KeyReuse instead of replaying or waiting.
  std::optional<std::string> fingerprint{};
  // Cancels the call: a wait for a busy key ends at once (run throws InProgress, begin
  // answers busy), and Attempt::stop_token() is requested while the action runs. A call
  // whose token is already requested still acquires a free key (the action then sees its
  // stop token requested) and still replays.
  std::stop_token stop_token{};
};

namespace detail {
class ExecutorImpl;
struct InFlight;
}  // namespace detail

// What the action sees of its lease.
class Attempt {
 public:
  // An attempt outside any executor, to test an action: `stop` stands for a lost lease.
  Attempt(Token token, std::uint32_t number, bool stolen, std::stop_token stop)
      : token_(token), number_(number), stolen_(stolen), stop_(std::move(stop)) {}

  // The lease token: hand it to downstream systems as a fencing token.
  Token token() const noexcept { return token_; }
  // 1 on the first acquisition of the key, +1 each time an abandoned lease was stolen.
  std::uint32_t number() const noexcept { return number_; }
  // Whether this attempt took over the abandoned lease of an earlier one.
  bool stolen() const noexcept { return stolen_; }
  // Requested when the action should stop as soon as convenient: its lease was lost, the
  // call's CallOptions::stop_token was requested, or the executor is shutting down and
  // has given up waiting for it.
  std::stop_token stop_token() const noexcept { return stop_; }
  // Whether the lease itself was lost: fenced by the store (stolen or deleted), or not
  // extended before its deadline. A cancellation requests stop_token() but is not a loss.
  bool lease_lost() const noexcept {
    return lost_ != nullptr ? lost_->load(std::memory_order_acquire) : stop_.stop_requested();
  }
  // Throws LeaseLost (naming this token, scope and key) when lease_lost(). Call it between
  // the steps of a long action: the caller then gets LeaseLost instead of whatever error
  // the action would have ended with.
  void throw_if_lost() const;

 private:
  friend struct detail::InFlight;
  Attempt(Token token, std::uint32_t number, bool stolen, std::stop_token stop,
          const std::atomic<bool>* lost, RecordRef record)
      : token_(token),
        number_(number),
        stolen_(stolen),
        stop_(std::move(stop)),
        lost_(lost),
        record_(record) {}

  Token token_;
  std::uint32_t number_;
  bool stolen_;
  std::stop_token stop_;
  // The heartbeat's own flag when the attempt comes from an executor.
  const std::atomic<bool>* lost_ = nullptr;
  RecordRef record_{};
};

// Where a result came from. What neither the store nor this process knows stays unset.
struct ResultInfo {
  // True when the value is a stored result of an earlier run and the action did not run.
  bool replayed = false;
  // When the result was recorded and when it stops being replayed, by the store's clock:
  // set for a replay from the store (the store does not report them for a fresh result,
  // nor for a duplicate served in memory by an in-process owner, which just completed).
  std::optional<Timestamp> completed_at{};
  std::optional<Timestamp> expires_at{};
  // The lease that produced the result, its attempt number and whether it stole an
  // abandoned lease: set for a fresh result and for a duplicate served in memory (a
  // store's replay does not carry them).
  std::optional<Token> token{};
  std::uint32_t attempt = 0;
  bool stolen = false;
};

template <typename T>
struct Result : ResultInfo {
  T value;
};

template <>
struct Result<void> : ResultInfo {};

namespace detail {

// Lets only the executor build a handle (std::variant builds it in place, so the
// constructor is public but needs this key).
class HandleKey {
  friend class ExecutorImpl;
  HandleKey() = default;
};

// Wraps the exception in flight (thrown by Codec<T>::decode) into DecodeFailed.
[[noreturn]] void throw_decode_failed(std::string bytes, RecordRef record);

template <typename T>
concept CodecFor = requires(const T& v, std::string_view b) {
  { Codec<T>::encode(v) } -> std::convertible_to<std::string>;
  { Codec<T>::decode(b) } -> std::convertible_to<T>;
};

// Whether run<T> and begin<T> can store T: it has a codec, or it is void.
template <typename T>
struct HasCodec : std::bool_constant<CodecFor<T>> {};
template <>
struct HasCodec<void> : std::true_type {};
template <typename T>
inline constexpr bool kHasCodec = HasCodec<T>::value;

// The stored bytes of a replay as a Result<T>, through Codec<T>.
template <typename T>
Result<T> decode_result(Result<std::string>&& bytes, RecordRef record) {
  if constexpr (std::is_void_v<T>) {
    return Result<void>{static_cast<ResultInfo&&>(bytes)};
  } else {
    try {
      return Result<T>{static_cast<const ResultInfo&>(bytes), Codec<T>::decode(bytes.value)};
    } catch (...) {
      throw_decode_failed(std::move(bytes.value), record);
    }
  }
}

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
  bool active() const noexcept { return state_ != nullptr && !ended_; }
  explicit operator bool() const noexcept { return active(); }

  // What an action given to run() sees, for code written for both forms. Valid as long as
  // the handle is not moved from (ended handles keep it). A moved-from or default handle
  // throws std::logic_error.
  const Attempt& attempt() const;
  Token token() const { return attempt().token(); }
  std::uint32_t number() const { return attempt().number(); }
  bool stolen() const { return attempt().stolen(); }
  std::stop_token stop_token() const { return attempt().stop_token(); }
  bool lease_lost() const { return attempt().lease_lost(); }
  void throw_if_lost() const { attempt().throw_if_lost(); }
  std::string_view scope() const;
  std::string_view key() const;

  // Gives the key up: stops the heartbeat for this lease and releases the record, so the
  // next caller runs as attempt 1 (SPEC §4). Best effort, as when run()'s action throws: if
  // the store cannot be reached the lease simply expires and the next caller steals it.
  // Does nothing on a handle that has already ended.
  void release() noexcept;

  // Gives the handle up without releasing the record: stops the heartbeat for this lease
  // and makes no store call, so the record stays IN_PROGRESS until its lease runs out
  // (SPEC §7); meanwhile callers get busy, and afterwards the next caller takes the key over
  // (attempt + 1, stolen: SPEC §4). For an outcome the caller cannot know: the action may
  // have run, or may still be running elsewhere (a request sent to a service that never
  // answered), so releasing would let a retry run it a second time while the first may
  // still be at work. Duplicates waiting in memory on this handle go back to the store.
  // Never throws; does nothing on a handle that has already ended.
  void abandon() noexcept;

 protected:
  AttemptCore(std::shared_ptr<InFlight> state, std::shared_ptr<ExecutorImpl> keep_alive) noexcept;
  // Stores `bytes` as the result. See AttemptHandle::complete.
  Result<std::string> complete_bytes(std::string bytes);

 private:
  friend class ExecutorImpl;

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
  // result; duplicates waiting in this process get it at once. Returns `value` itself (not
  // a decoded copy of what was stored), not replayed. Throws, after which the handle has
  // ended either way:
  //  - PayloadTooLarge: the encoded result is larger than max_payload; the record was
  //    released so a later call starts clean.
  //  - LeaseLost: the store fenced the write (somebody took the key over, or the record
  //    was deleted), or the executor shut down and released the lease: not recorded.
  //  - StoreUnavailable: the store kept failing for as long as the lease was ours.
  //  - std::logic_error: the handle had already ended (or was moved from).
  Result<T> complete(T value) {
    if constexpr (std::is_same_v<T, std::string>) {
      return complete_bytes(std::move(value));
    } else {
      Result<std::string> stored = complete_bytes(Codec<T>::encode(value));
      return Result<T>{static_cast<ResultInfo&&>(stored), std::move(value)};
    }
  }

  // For the executor only (see detail::HandleKey).
  AttemptHandle(detail::HandleKey, std::shared_ptr<detail::InFlight> state,
                std::shared_ptr<detail::ExecutorImpl> keep_alive) noexcept
      : detail::AttemptCore(std::move(state), std::move(keep_alive)) {}

 private:
  friend class Executor;
  explicit AttemptHandle(detail::AttemptCore&& core) noexcept
      : detail::AttemptCore(std::move(core)) {}
};

// The handle of an action that returns nothing: complete() records an empty result.
template <>
class AttemptHandle<void> : public detail::AttemptCore {
 public:
  AttemptHandle() noexcept = default;
  // As AttemptHandle<T>::complete, with nothing to store but the fact of completion.
  Result<void> complete() {
    return Result<void>{static_cast<ResultInfo&&>(complete_bytes(std::string()))};
  }
  AttemptHandle(detail::HandleKey, std::shared_ptr<detail::InFlight> state,
                std::shared_ptr<detail::ExecutorImpl> keep_alive) noexcept
      : detail::AttemptCore(std::move(state), std::move(keep_alive)) {}

 private:
  friend class Executor;
  explicit AttemptHandle(detail::AttemptCore&& core) noexcept
      : detail::AttemptCore(std::move(core)) {}
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

  // For the executor only (see detail::HandleKey).
  BeginResult(detail::HandleKey key, std::shared_ptr<detail::InFlight> state,
              std::shared_ptr<detail::ExecutorImpl> keep_alive)
      : v_(std::in_place_index<2>, key, std::move(state), std::move(keep_alive)) {}

 private:
  friend class Executor;
  friend class detail::ExecutorImpl;
  explicit BeginResult(Result<T> replay) : v_(std::in_place_index<0>, std::move(replay)) {}
  // An empty replay, filled in place.
  explicit BeginResult(std::in_place_index_t<0> replay) : v_(replay) {}
  explicit BeginResult(Busy busy) : v_(std::in_place_index<1>, std::move(busy)) {}
  explicit BeginResult(AttemptHandle<T> handle) : v_(std::in_place_index<2>, std::move(handle)) {}

  std::variant<Result<T>, Busy, AttemptHandle<T>> v_;
};

// Thread safety: run, run_bytes, begin, store, options, active_leases and
// waiting_duplicates may be called from any number of threads at once. shutdown may be
// called from any thread, also concurrently with calls (which it then refuses or ends). The
// destructor and move assignment shut the executor down; they must not race with another
// use of the same Executor object, nor run on the heartbeat thread (from on_event).
class Executor {
 public:
  // Throws InvalidArgument for a null store or invalid options.
  explicit Executor(std::shared_ptr<Store> store, ExecutorOptions options = {});
  // shutdown(options().shutdown_timeout): never leaves a call or a handle using freed state.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  // A moved-from executor refuses calls with ShutDown.
  Executor(Executor&& other) noexcept = default;
  // Shuts this executor down first (as the destructor does), then takes over `other`.
  Executor& operator=(Executor&& other) noexcept;

  // Runs `action(const Attempt&)` at most once per (scope, key) and returns its result, or
  // the stored result of the run that completed first. Throws InvalidArgument, InProgress,
  // KeyReuse, LeaseLost, StoreUnavailable (SPEC §11), DecodeFailed (a stored result the
  // codec cannot read), ShutDown, or the action's own exception unchanged after releasing
  // the record. T = void for an action that returns nothing.
  //
  // Exactly begin(), then the action, then the handle's complete() (or, when the action
  // throws, the handle's release()). A fresh result is the action's own value (not the
  // decoded copy of what was stored); a replay is Codec<T>::decode of the stored bytes.
  template <typename T, typename F>
  Result<T> run(std::string_view scope, std::string_view key, F&& action,
                const CallOptions& call = {}) {
    if constexpr (std::is_void_v<T>) {
      static_assert(std::is_invocable_v<F&, const Attempt&>,
                    "the action must be callable as void(const idem::Attempt&)");
    } else {
      static_assert(std::is_invocable_r_v<T, F&, const Attempt&>,
                    "the action must be callable as T(const idem::Attempt&)");
    }
    static_assert(detail::kHasCodec<T>,
                  "idem: no codec for this result type. Specialise idem::Codec<T> with "
                  "static std::string encode(const T&) and static T decode(std::string_view) "
                  "(see idem/codec.h), or return std::string.");
    if constexpr (detail::kHasCodec<T>) {
      BeginResult<T> begun = begin_as<T>(scope, key, call, /*keep_alive=*/false);
      if (Result<T>* replay = begun.replay()) return std::move(*replay);
      if (const Busy* busy = begun.busy()) {
        throw InProgress(busy->lease_expires_at, busy->lease_remaining, RecordRef{scope, key});
      }
      // If the action throws, the handle's destructor releases the record on the way out
      // and the action's exception reaches the caller unchanged (SPEC §5).
      AttemptHandle<T>& handle = *begun.handle();
      if constexpr (std::is_void_v<T>) {
        action(handle.attempt());
        return handle.complete();
      } else {
        return handle.complete(action(handle.attempt()));
      }
    } else {
      std::terminate();  // unreachable: the static_assert above has failed
    }
  }

  // run with the result type taken from the action: void, std::string for anything that
  // converts to it (bytes), else the action's own type through Codec<T>.
  template <typename F>
  auto run(std::string_view scope, std::string_view key, F&& action,
           const CallOptions& call = {}) {
    static_assert(std::is_invocable_v<F&, const Attempt&>,
                  "the action must be callable with a const idem::Attempt&");
    using R = std::invoke_result_t<F&, const Attempt&>;
    using T = std::conditional_t<
        std::is_void_v<R>, void,
        std::conditional_t<std::is_convertible_v<R, std::string>, std::string, std::decay_t<R>>>;
    return run<T>(scope, key, std::forward<F>(action), call);
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
  // Throws InvalidArgument, KeyReuse, StoreUnavailable, DecodeFailed and ShutDown as run()
  // does; never InProgress. For T other than std::string a replay is decoded with Codec<T>.
  template <typename T = std::string>
  BeginResult<T> begin(std::string_view scope, std::string_view key,
                       const CallOptions& call = {}) {
    static_assert(detail::kHasCodec<T>,
                  "idem: no codec for this result type. Specialise idem::Codec<T> with "
                  "static std::string encode(const T&) and static T decode(std::string_view) "
                  "(see idem/codec.h), or use std::string.");
    return begin_as<T>(scope, key, call, /*keep_alive=*/true);
  }

  // An orderly stop: from now on calls are refused with ShutDown and waiting duplicates
  // stop waiting (ShutDown). Calls in flight and open handles get `timeout` (default
  // options().shutdown_timeout) to end on their own; the leases of those still running
  // then are released (their stop tokens requested, their complete() refused with
  // LeaseLost), so no key stays stuck. Returns once no call is inside the executor's code;
  // an action still running may finish later without harm. Idempotent; safe from any
  // thread except the heartbeat's.
  void shutdown(std::optional<Duration> timeout = std::nullopt);
  bool is_shut_down() const noexcept;

  // REQUIRES: not moved from (throws std::logic_error otherwise).
  Store& store() const;
  const ExecutorOptions& options() const;

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
        return BeginResult<T>(detail::decode_result<T>(std::move(*replay), RecordRef{scope, key}));
      }
      if (auto* busy = bytes.busy()) return BeginResult<T>(Busy(*busy));
      return BeginResult<T>(AttemptHandle<T>(std::move(*bytes.handle())));
    }
  }

  std::shared_ptr<detail::ExecutorImpl> impl_;
};

}  // namespace idem
