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
#include "idem/transaction.h"
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
  // Once the store's notification watches the key (SPEC §7: PostgreSQL with notify=on,
  // Redis, SQLite), a poll is only the fallback for a notification lost on the way (a
  // store that loses its listening connection wakes every waiter when it is back): the
  // pause is then this long (with jitter; max_backoff if that is longer), still never past
  // the owner's lease deadline, whose expiry sends no notification. A waiter that is woken
  // asks at once, whatever its pause.
  Duration watched_backoff{5000};
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

// The options of Executor::run_in_open_transaction are a call's options: one waiting policy
// (CallOptions::wait) for every form. This name stays for code written before; its `nowait`
// is gone (an unset wait, with the executor's default policy, answers InProgress at once).
using OpenTransactionOptions = CallOptions;

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
  // A loss is marked before its stop is requested, so a stop callback sees lease_lost().
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

// The result type run() takes from an action: void, std::string for anything that converts
// to it (bytes), else the action's own type through Codec<T>.
template <typename F>
struct ResultOfAction {
  static_assert(std::is_invocable_v<F&, const Attempt&>,
                "the action must be callable with a const idem::Attempt&");
  using R = std::invoke_result_t<F&, const Attempt&>;
  using type = std::conditional_t<
      std::is_void_v<R>, void,
      std::conditional_t<std::is_convertible_v<R, std::string>, std::string, std::decay_t<R>>>;
};
template <typename F>
using ResultOf = typename ResultOfAction<F>::type;

// The untyped part of AttemptHandle<T>: everything but the typed complete().
class AttemptCore {
 public:
  AttemptCore() noexcept = default;
  AttemptCore(AttemptCore&& other) noexcept
      : keep_alive_(std::move(other.keep_alive_)),
        state_(std::move(other.state_)),
        ended_(other.ended_),
        completing_(other.completing_),
        pending_(std::move(other.pending_)) {}
  // Releases the lease this handle holds, if any, then takes over `other`'s.
  AttemptCore& operator=(AttemptCore&& other) noexcept;
  AttemptCore(const AttemptCore&) = delete;
  AttemptCore& operator=(const AttemptCore&) = delete;
  // Releases the lease when neither complete() nor release() ended it (abandons it while a
  // complete_in() waits for the caller's commit, see release()).
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
  // While a complete_in() waits for the caller's commit, the outcome is the caller's
  // transaction's: release() then abandons the handle instead (no store call; the record is
  // COMPLETE if the caller commits, else IN_PROGRESS until the lease runs out).
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

  // SPEC §14, the handshake of AttemptHandle::complete_in. Whether a result was written on
  // the caller's transaction and its commit has not been reported yet.
  bool completing() const noexcept { return active() && completing_; }

  // The caller's transaction that holds the complete_in() write rolled back (or failed
  // before its COMMIT): the record is still IN_PROGRESS under this lease, the heartbeat
  // extends it again (at once), and the handle can complete (either way) or release. If the
  // executor shut down meanwhile, the lease is released and the handle ends (active() is
  // false). Throws std::logic_error unless completing().
  void rolled_back();

 protected:
  AttemptCore(std::shared_ptr<InFlight> state, std::shared_ptr<ExecutorImpl> keep_alive) noexcept;
  // Stores `bytes` as the result. See AttemptHandle::complete.
  Result<std::string> complete_bytes(std::string bytes);
  // See AttemptHandle::complete_in, committed and resolve.
  void complete_in_bytes(const SqlConnection& conn, std::string bytes);
  Result<std::string> committed_bytes();
  std::optional<Result<std::string>> resolve_bytes();

 private:
  friend class ExecutorImpl;

  // Set when the handle came from Executor::begin: the executor's state lives as long as
  // its open handles. A handle made by run() lives inside the call and needs none.
  std::shared_ptr<ExecutorImpl> keep_alive_;
  std::shared_ptr<InFlight> state_;
  // Set when this handle ended the lease, so that its destructor has nothing to do.
  bool ended_ = false;
  // Set between complete_in() and the report of the caller's commit; pending_ is the
  // result written on the caller's transaction.
  bool completing_ = false;
  std::string pending_;
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

  // SPEC §14: records `value` (through Codec<T>) as COMPLETE on the caller's open
  // transaction on `conn`, which must be on the database that holds the store's records
  // (the same PostgreSQL database, the same SQLite file). Nothing is visible to anybody
  // until the caller commits. The heartbeat stops extending the lease meanwhile (the
  // caller's transaction holds the record's row lock; SQLite: the file's write lock), so
  // keep the transaction shorter than the lease: docs/api.md. Then report the outcome:
  // committed() after a successful COMMIT, rolled_back() after a ROLLBACK (or any failure
  // before COMMIT), resolve() when the COMMIT's answer was lost.
  // Throws, and the caller must roll back:
  //  - LeaseLost: the write was fenced (the key was taken over or deleted); nothing was
  //    written and the handle has ended.
  //  - PayloadTooLarge: as complete(); the record was released and the handle has ended.
  //  - InvalidArgument: the store cannot join a caller's transaction (Redis, memory), or
  //    `conn` is of the wrong kind or not in a transaction; the handle is unchanged.
  //  - StoreUnavailable: the write failed on the caller's connection; the handle holds its
  //    lease again (the heartbeat resumes) and can complete or release.
  //  - std::logic_error: the handle had already ended, or a complete_in is pending.
  void complete_in(const SqlConnection& conn, T value) {
    if constexpr (std::is_same_v<T, std::string>) {
      complete_in_bytes(conn, std::move(value));
    } else {
      std::string bytes = Codec<T>::encode(value);
      complete_in_bytes(conn, std::move(bytes));
      value_.emplace(std::move(value));
    }
  }

  // The caller's COMMIT succeeded: the handle ends as completed (duplicates waiting in this
  // process get the value at once) and returns `value` as complete() would. No store call.
  // Throws std::logic_error unless completing().
  Result<T> committed() {
    if constexpr (std::is_same_v<T, std::string>) {
      return committed_bytes();
    } else {
      Result<std::string> stored = committed_bytes();
      Result<T> out{static_cast<ResultInfo&&>(stored), std::move(*value_)};
      value_.reset();
      return out;
    }
  }

  // The COMMIT's answer was lost (the connection broke while it was sent): settles what
  // happened from the record itself. First a fenced extend on the store's own connection,
  // which waits for the caller's transaction to end if it still holds the row, then a read:
  //  - COMPLETE with this token: the commit happened; as committed().
  //  - IN_PROGRESS with this token: it did not; as rolled_back(), and returns nullopt.
  //  - anything else: throws LeaseLost (the key was taken over; the handle has ended).
  // Throws StoreUnavailable when the store cannot tell yet (the handle stays completing()
  // and resolve() can be called again). Throws std::logic_error unless completing().
  std::optional<Result<T>> resolve() {
    std::optional<Result<std::string>> stored = resolve_bytes();
    if constexpr (std::is_same_v<T, std::string>) {
      return stored;
    } else {
      if (!stored) return std::nullopt;
      Result<T> out{static_cast<ResultInfo&&>(*stored), std::move(*value_)};
      value_.reset();
      return out;
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

  // The value of a complete_in() that waits for its commit (T other than std::string).
  struct NoValue {};
  std::conditional_t<std::is_same_v<T, std::string>, NoValue, std::optional<T>> value_{};
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
  // As AttemptHandle<T>::complete_in, committed and resolve.
  void complete_in(const SqlConnection& conn) { complete_in_bytes(conn, std::string()); }
  Result<void> committed() { return Result<void>{static_cast<ResultInfo&&>(committed_bytes())}; }
  std::optional<Result<void>> resolve() {
    std::optional<Result<std::string>> stored = resolve_bytes();
    if (!stored) return std::nullopt;
    return Result<void>{static_cast<ResultInfo&&>(*stored)};
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

// What Executor::begin_async hands its callback when a wait ends: begin()'s answer, or
// the exception begin() would have thrown.
class BeginAnswer {
 public:
  explicit BeginAnswer(BeginResult<std::string> answer) : v_(std::move(answer)) {}
  explicit BeginAnswer(std::exception_ptr error) : v_(std::move(error)) {}
  // Whether begin() would have thrown.
  bool failed() const noexcept { return v_.index() == 1; }
  // begin()'s answer (once); rethrows the exception begin() would have thrown.
  BeginResult<std::string> get() && {
    if (failed()) std::rethrow_exception(std::get<1>(v_));
    return std::move(std::get<0>(v_));
  }

 private:
  std::variant<BeginResult<std::string>, std::exception_ptr> v_;
};

// Thread safety: run, run_bytes, begin, begin_async, watch, store, options, active_leases and
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
  auto run(std::string_view scope, std::string_view key, F&& action, const CallOptions& call = {}) {
    return run<detail::ResultOf<F>>(scope, key, std::forward<F>(action), call);
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
  BeginResult<T> begin(std::string_view scope, std::string_view key, const CallOptions& call = {}) {
    static_assert(detail::kHasCodec<T>,
                  "idem: no codec for this result type. Specialise idem::Codec<T> with "
                  "static std::string encode(const T&) and static T decode(std::string_view) "
                  "(see idem/codec.h), or use std::string.");
    return begin_as<T>(scope, key, call, /*keep_alive=*/true);
  }

  // SPEC §14: run() whose result commits together with the action's own writes, for an
  // action whose effects are writes to the database that holds the store's records (the
  // same PostgreSQL database, the same SQLite file) through the caller's connection `conn`.
  // Checks `conn` first (TransactionalStore::check_connection: the store's own database and
  // table by identity, writable, not inside a transaction), then takes the lease as run()
  // does (replays and busy keys too), then on `conn`: BEGIN (SQLite: BEGIN IMMEDIATE), the
  // action, the COMPLETE record, COMMIT. A crash anywhere leaves the action's writes and the
  // record committed together or neither; a lease lost before the commit throws LeaseLost
  // and the transaction is rolled back. A COMMIT whose answer is lost is settled from the
  // record (AttemptHandle::resolve).
  // Throws as run() does, and InvalidArgument, before anything is acquired, for a store
  // that cannot join a caller's transaction or a connection it refuses. When the action
  // throws, the transaction is rolled back, the record released and the exception rethrown.
  // The action must not end the transaction itself: after a COMMIT or ROLLBACK of its own,
  // whether its writes committed cannot be known, so the key is kept (the record stays
  // IN_PROGRESS until its lease runs out, unreleased, and the next caller then takes it
  // over as attempt 2, stolen) and the call throws InvalidArgument (or, if the action
  // threw, the action's exception).
  template <typename T, typename F>
  Result<T> run_in_transaction(const SqlConnection& conn, std::string_view scope,
                               std::string_view key, F&& action, const CallOptions& call = {}) {
    static_assert(detail::kHasCodec<T>, "idem: no codec for this result type (see run())");
    TransactionalStore& tx = transactional_store();
    tx.check_connection(conn, TransactionalStore::ConnectionUse::kBegin);
    BeginResult<T> begun = begin_as<T>(scope, key, call, /*keep_alive=*/false);
    if (Result<T>* replay = begun.replay()) return std::move(*replay);
    if (const Busy* busy = begun.busy()) {
      throw InProgress(busy->lease_expires_at, busy->lease_remaining, RecordRef{scope, key});
    }
    AttemptHandle<T>& handle = *begun.handle();
    tx.begin(conn);
    {
      // The action or the write threw: the transaction goes, then the lease (the handle's
      // destructor releases it as the exception leaves), unless the action ended the
      // transaction itself (its writes may have committed: the key is kept).
      struct RollBack {
        TransactionalStore& tx;
        const SqlConnection& conn;
        AttemptHandle<T>& handle;
        bool armed = true;
        ~RollBack() {
          if (!armed) return;
          if (tx.outside_transaction(conn)) {
            tx.rollback(conn);  // nothing to roll back: ends what begin() holds (SQLite's turn)
            handle.abandon();
            return;
          }
          tx.rollback(conn);
          if (handle.completing()) handle.rolled_back();
        }
      } roll_back{tx, conn, handle};
      if constexpr (std::is_void_v<T>) {
        action(handle.attempt());
        if (tx.outside_transaction(conn)) throw_action_ended_transaction(handle);
        handle.complete_in(conn);
      } else {
        T value = action(handle.attempt());
        if (tx.outside_transaction(conn)) throw_action_ended_transaction(handle);
        handle.complete_in(conn, std::move(value));
      }
      roll_back.armed = false;
    }
    try {
      tx.commit(conn);
    } catch (const StoreUnavailable&) {
      // Committed or not, the record says which (the commit failed, or its answer was lost).
      if (auto recorded = handle.resolve()) return std::move(*recorded);
      throw;  // rolled back: the handle releases the record as it goes
    }
    return handle.committed();
  }

  template <typename F>
  auto run_in_transaction(const SqlConnection& conn, std::string_view scope, std::string_view key,
                          F&& action, const CallOptions& call = {}) {
    return run_in_transaction<detail::ResultOf<F>>(conn, scope, key, std::forward<F>(action), call);
  }

  // SPEC §14's one-transaction form, for an action whose only effects are writes through
  // `conn` to the database that holds the store's records. Everything runs in the caller's
  // open transaction on `conn`, which the caller began and commits (or rolls back) itself:
  // the acquire (a record written IN_PROGRESS in the caller's transaction), the action,
  // and the COMPLETE record. No lease is kept alive and no heartbeat runs: the caller's
  // transaction is the lock. A crash or a rollback leaves nothing behind.
  // A key that another open transaction is writing, or that another caller's live lease
  // holds, is busy: it is waited for under the call's waiting policy exactly as run() waits
  // (CallOptions::wait, else ExecutorOptions::wait; the default answers InProgress at once),
  // asking again within the bound and woken by the store's notification. PostgreSQL waits
  // so; SQLite answers InProgress at once whatever the policy (the caller's BEGIN IMMEDIATE
  // holds the file's one write lock, which the key's owner needs to finish: a duplicate
  // waits for that lock at its BEGIN IMMEDIATE instead, under its busy timeout).
  // Returns the action's result, or the stored result of an earlier run (replayed; the
  // action did not run). The caller must commit for the result to be recorded, and must
  // roll back when this throws: InvalidArgument (a store that cannot join, or `conn` refused
  // by TransactionalStore::check_connection: another database, not in a transaction,
  // read-only; checked before anything is written), InProgress, KeyReuse, PayloadTooLarge,
  // StoreUnavailable, DecodeFailed, ShutDown, or the action's own exception unchanged.
  template <typename T, typename F>
  Result<T> run_in_open_transaction(const SqlConnection& conn, std::string_view scope,
                                    std::string_view key, F&& action,
                                    const CallOptions& options = {}) {
    static_assert(detail::kHasCodec<T>, "idem: no codec for this result type (see run())");
    std::optional<Attempt> attempt;
    Result<std::string> replay = begin_in_open_transaction(conn, scope, key, options, attempt);
    if (!attempt) {
      if constexpr (std::is_same_v<T, std::string> || std::is_void_v<T>) {
        if constexpr (std::is_void_v<T>) {
          return Result<void>{static_cast<ResultInfo&&>(replay)};
        } else {
          return replay;
        }
      } else {
        return detail::decode_result<T>(std::move(replay), RecordRef{scope, key});
      }
    }
    if constexpr (std::is_void_v<T>) {
      action(*attempt);
      return Result<void>{static_cast<ResultInfo&&>(
          complete_in_open_transaction(conn, scope, key, *attempt, std::string(), options))};
    } else if constexpr (std::is_same_v<T, std::string>) {
      return complete_in_open_transaction(conn, scope, key, *attempt, action(*attempt), options);
    } else {
      T value = action(*attempt);
      Result<std::string> stored = complete_in_open_transaction(conn, scope, key, *attempt,
                                                                Codec<T>::encode(value), options);
      return Result<T>{static_cast<ResultInfo&&>(stored), std::move(value)};
    }
  }

  template <typename F>
  auto run_in_open_transaction(const SqlConnection& conn, std::string_view scope,
                               std::string_view key, F&& action, const CallOptions& options = {}) {
    return run_in_open_transaction<detail::ResultOf<F>>(conn, scope, key, std::forward<F>(action),
                                                        options);
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

  using BeginCallback = std::function<void(BeginAnswer)>;

  // begin() for a caller that must not block while a duplicate waits (an event loop, a
  // binding to another language). The first ask is begin()'s, on the calling thread, with
  // no wait: when it settles the call (a replay, an AttemptHandle, a busy key with no
  // waiting policy or a cancelled call, or an exception, thrown), that is returned and
  // `done` is never called. Otherwise, under the call's waiting policy (CallOptions::wait,
  // else ExecutorOptions::wait), it returns nullopt at once and the wait goes on without a
  // thread of the caller's, exactly as a blocking begin() waits (SPEC §7; both are the
  // same mechanism, taken in turns): a duplicate of a call of this executor waits on it in
  // memory and gets its result from there; otherwise one waiter per key in this process
  // polls the store for all of them, watched by the store's notification, and asks again
  // when it may have changed and, as the fallback, at the policy's backoff (never past the
  // owner's lease deadline). `done` is then called exactly once, on the executor's waiting
  // thread, with begin()'s answer: a replay, a handle, or busy when the bound ran out or
  // CallOptions::stop_token was requested (at once); or with ShutDown when the executor
  // shuts down first. `done` must be quick (it delays the other waiters) and must not
  // shut down or destroy the executor. Throws as begin() does, and InvalidArgument for an
  // empty callback.
  std::optional<BeginResult<std::string>> begin_async(std::string_view scope, std::string_view key,
                                                      const CallOptions& call, BeginCallback done);

  // For a caller that waits for a busy key without blocking (an event loop; begin() with no
  // waiting policy): calls `changed` when the key's record may have completed or been
  // released, whether by a call of this executor that holds the key (SPEC §7: in memory, at
  // once) or, through Store::watch, by anybody the store can tell about. Ask again (begin)
  // when it runs. It runs on another thread, must be quick, must not call the executor or
  // destroy the watch, and may run when nothing changed, or at once when the call holding
  // the key ended before the watch began; destroying the watch ends it. Null when nothing
  // can tell. Notifications can be lost and an expiring lease sends none: keep polling
  // (with the time Busy::lease_remaining gives as a bound), and after the watch is made,
  // ask once more, since the key may have been freed before it was. Throws InvalidArgument
  // for an invalid scope or key or an empty callback.
  std::unique_ptr<RecordWatch> watch(std::string_view scope, std::string_view key,
                                     std::function<void()> changed) const;

  // REQUIRES: not moved from (throws std::logic_error otherwise).
  Store& store() const;
  const ExecutorOptions& options() const;

  // How many leases the heartbeat currently keeps alive (for tests and metrics).
  std::size_t active_leases() const;
  // How many duplicates (blocking or begin_async) are waiting in memory on a call of this
  // executor that holds their key, or polls the store for it (for tests and metrics).
  std::size_t waiting_duplicates() const;
  // How many begin_async calls are waiting (for tests and metrics).
  std::size_t waiting_async() const;

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

  // The store's steps on a caller's transaction; throws InvalidArgument when it has none.
  TransactionalStore& transactional_store() const;
  // run_in_transaction's action ended the transaction itself: keeps the key (abandons the
  // handle: no release, the lease runs out) and throws InvalidArgument saying so.
  [[noreturn]] static void throw_action_ended_transaction(detail::AttemptCore& handle);
  // run_in_open_transaction's two halves: the acquire (a replay is returned and `attempt`
  // left empty; a busy key throws InProgress), and the complete.
  Result<std::string> begin_in_open_transaction(const SqlConnection& conn, std::string_view scope,
                                                std::string_view key, const CallOptions& options,
                                                std::optional<Attempt>& attempt);
  Result<std::string> complete_in_open_transaction(const SqlConnection& conn,
                                                   std::string_view scope, std::string_view key,
                                                   const Attempt& attempt, std::string bytes,
                                                   const CallOptions& options);

  std::shared_ptr<detail::ExecutorImpl> impl_;
};

}  // namespace idem
