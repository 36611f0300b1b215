#include "idem/executor.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "core/backoff.h"
#include "core/call_counter.h"
#include "core/heartbeat.h"
#include "core/owner_table.h"
#include "core/wait_queue.h"

namespace idem {
namespace {

using detail::Backoff;
using detail::coarse_now;
using detail::HeartbeatLease;
using detail::IdHash;
using detail::IdView;
using detail::InFlight;
using detail::OwnerState;
using detail::RequestStop;
using detail::SteadyClock;
using detail::WaitQueue;

// A complete() call that failed with a store error, and did not land, is retried after
// this pause, doubling up to the cap, while the local view of the lease is still valid
// (SPEC §4: a complete repeated with the same token is idempotent). See write_result.
constexpr Duration kCompleteFirstRetry{5};
constexpr Duration kCompleteMaxRetry{250};

// The options of one call: the executor's, overridden by the call's, validated.
struct Call {
  Duration lease;
  Duration interval;
  Duration ttl;
  WaitPolicy wait;
  const std::optional<std::string>& fingerprint;
  const std::stop_token& stop;
};

// Where a blocking call sleeps between two asks of the store: until a time, a wake-up (a
// watch, the executor's shutdown: both call it), or its stop token.
struct Wakeup {
  std::mutex mu;
  std::condition_variable_any cv;
  bool woken = false;  // guarded by mu
  void wake() {
    {
      std::lock_guard lock(mu);
      woken = true;
    }
    cv.notify_one();
  }
  void operator()() { wake(); }
  template <typename Stop>
  void sleep_until(const std::stop_token& stop, SteadyClock::time_point until, Stop stopped) {
    std::unique_lock lock(mu);
    cv.wait_until(lock, stop, until, [&] { return stopped() || woken; });
    woken = false;
  }
};

Duration resolve_interval(Duration heartbeat, Duration lease) {
  if (heartbeat < Duration::zero()) {
    throw InvalidArgument("heartbeat",
                          "must not be negative, got " + std::to_string(heartbeat.count()) + " ms");
  }
  // SPEC §6: by default the heartbeat extends every lease / 3.
  if (heartbeat == Duration::zero()) return std::max(lease / 3, Duration{1});
  if (heartbeat >= lease) {
    throw InvalidArgument("heartbeat", "must be shorter than the lease (" +
                                           std::to_string(lease.count()) + " ms), got " +
                                           std::to_string(heartbeat.count()) + " ms");
  }
  return heartbeat;
}

void validate_wait(const WaitPolicy& wait) {
  if (wait.max_wait < Duration::zero() || wait.max_wait > kMaxDuration) {
    throw InvalidArgument(
        "max_wait", "must be 0 to 365 days, got " + std::to_string(wait.max_wait.count()) + " ms");
  }
  validate_duration("initial_backoff", wait.initial_backoff);
  validate_duration("max_backoff", wait.max_backoff);
  validate_duration("watched_backoff", wait.watched_backoff);
  if (wait.max_backoff < wait.initial_backoff) {
    throw InvalidArgument("max_backoff", "must be at least initial_backoff (" +
                                             std::to_string(wait.initial_backoff.count()) +
                                             " ms), got " +
                                             std::to_string(wait.max_backoff.count()) + " ms");
  }
}

void validate_options(const ExecutorOptions& o) {
  validate_duration("lease", o.lease);
  validate_duration("ttl", o.ttl);
  resolve_interval(o.heartbeat, o.lease);
  validate_wait(o.wait);
  if (o.max_payload > kMaxPayloadBytes) {
    throw InvalidArgument("max_payload", "must be at most " + std::to_string(kMaxPayloadBytes) +
                                             " bytes, got " + std::to_string(o.max_payload));
  }
  if (o.shutdown_timeout < Duration::zero() || o.shutdown_timeout > kMaxDuration) {
    throw InvalidArgument(
        "shutdown_timeout",
        "must be 0 to 365 days, got " + std::to_string(o.shutdown_timeout.count()) + " ms");
  }
}

// SPEC §5: a stored fingerprint and the call's that differ mean the key was reused.
void check_fingerprint(const std::optional<std::string>& stored,
                       const std::optional<std::string>& requested, RecordRef record) {
  if (stored && requested && *stored != *requested) throw KeyReuse(*stored, *requested, record);
}

// What a duplicate reports when it gives up on an in-process owner: the owner's deadline.
Busy busy_of(const InFlight& owner, SteadyClock::time_point now) {
  const auto left = std::max(owner.local_deadline() - now, SteadyClock::duration::zero());
  return Busy{owner.lease_expires_at(), std::chrono::ceil<Duration>(left), owner.fingerprint};
}

using BytesBegin = BeginResult<std::string>;

ShutDown shut_down_error() {
  return ShutDown("the executor is shutting down and refuses new calls");
}

LeaseLost released_by_shutdown(const InFlight& owner) {
  return LeaseLost(owner.token(),
                   "the executor shut down and released the lease before the result came; "
                   "the result was not recorded",
                   owner.record());
}

Result<std::string> fresh_result(Token token, std::uint32_t attempt, bool stolen,
                                 std::string&& bytes) {
  Result<std::string> r;
  r.token = token;
  r.attempt = attempt;
  r.stolen = stolen;
  r.value = std::move(bytes);
  return r;
}

}  // namespace

namespace detail {

class ExecutorImpl : public std::enable_shared_from_this<ExecutorImpl> {
  // Stops counting a call when it leaves (null: not counted, or counted elsewhere).
  struct Uncount {
    CallCounter::Slot* slot;
    ~Uncount() {
      if (slot != nullptr) CallCounter::leave(slot);
    }
  };

 public:
  ExecutorImpl(std::shared_ptr<Store> store, ExecutorOptions options)
      : store_(std::move(store)),
        options_(std::move(options)),
        default_interval_(resolve_interval(options_.heartbeat, options_.lease)),
        events_(static_cast<bool>(options_.on_event)),
        heartbeat_(*store_, options_.on_heartbeat_error, lease_handler()) {}

  Store& store() const noexcept { return *store_; }
  const ExecutorOptions& options() const noexcept { return options_; }
  std::size_t active_leases() const noexcept { return heartbeat_.active(); }
  std::size_t waiting_duplicates() const noexcept {
    return waiting_.load(std::memory_order_relaxed);
  }
  bool closing() const noexcept { return closing_.load(std::memory_order_acquire); }

  // Executor::watch: the call of this executor that holds the key (or polls it), and the
  // store's notification. `by_store`: set when the store's notification is part of it.
  std::unique_ptr<RecordWatch> watch(std::string_view scope, std::string_view key,
                                     std::function<void()> changed,
                                     bool* by_store = nullptr) const {
    validate_scope(scope);
    validate_key(key);
    if (!changed) throw InvalidArgument("watch callback", "must not be empty");
    const IdView id{scope, key};
    std::unique_ptr<RecordWatch> in_memory;
    if (std::shared_ptr<InFlight> owner = owners_.find(id, IdHash{}(id), nullptr)) {
      in_memory = watch_owner(std::move(owner), changed);
    }
    std::unique_ptr<RecordWatch> in_store;
    try {
      in_store = store_->watch(scope, key, std::move(changed));
    } catch (const std::exception&) {
      // A store that could not start to listen: the caller polls, which is always correct.
    }
    if (by_store != nullptr) *by_store = in_store != nullptr;
    if (!in_memory) return in_store;
    if (!in_store) return in_memory;
    struct Both final : RecordWatch {
      std::unique_ptr<RecordWatch> first, second;
    };
    auto both = std::make_unique<Both>();
    both->first = std::move(in_memory);
    both->second = std::move(in_store);
    return both;
  }

  // --- waiting (SPEC §5, §7) ---
  //
  // One mechanism serves every caller that finds a key busy: a KeyWait, taken in turns.
  // Each turn asks (the in-process owner first, in memory, then the store) and either
  // settles the call or says when to ask next. Blocking begin() sleeps between its turns
  // on the caller's own thread; begin_async's waiters take theirs on the wait queue's
  // thread (core/wait_queue). Both are woken by the same watches: the in-process call they
  // follow, and the store's notification. The backoff between polls is the one rule of
  // detail::poll_pause.

  struct KeyWait {
    KeyWait(ExecutorImpl& e, std::string_view s, std::string_view k, Call c, Uncount* u,
            SteadyClock::time_point since, std::function<void()> wake_up)
        : impl(e),
          scope(s),
          key(k),
          id{s, k},
          hash(IdHash{}(id)),
          call(c),
          uncount(u),
          started(since),
          wake(std::move(wake_up)),
          backoff(c.wait.initial_backoff, c.wait.max_backoff) {}
    ~KeyWait() { impl.let_go(*this); }
    KeyWait(const KeyWait&) = delete;
    KeyWait& operator=(const KeyWait&) = delete;

    RecordRef record() const { return RecordRef{scope, key}; }
    std::optional<std::string_view> fingerprint() const {
      if (!call.fingerprint) return std::nullopt;
      return *call.fingerprint;
    }
    // The waiting bound counts from the first time the key is found busy, so a call that
    // never waits never reads the clock for it.
    SteadyClock::time_point bound() {
      if (!deadline) deadline = SteadyClock::now() + call.wait.max_wait;
      return *deadline;
    }

    ExecutorImpl& impl;
    std::string_view scope;
    std::string_view key;
    IdView id;
    std::size_t hash;
    Call call;
    // run()'s call count, handed to the handle when the lease is acquired; null for a
    // handle from begin() or begin_async, which does not count the call.
    Uncount* uncount;
    SteadyClock::time_point started;
    // Ends the sleep between turns early. Called by the watches, on their threads.
    std::function<void()> wake;
    Backoff backoff;
    std::optional<SteadyClock::time_point> deadline;
    // begin_async's first turn, on the caller's thread: a busy key is left to the queue.
    bool hand_over = false;
    // Set once the store has answered this wait: the first ask always goes to the store,
    // so that an in-process owner whose record is gone (forgotten, purged) is not followed
    // in memory while the store would let this call acquire.
    bool asked = false;
    // Set while this wait polls the store for the in-process duplicates that follow it;
    // whatever ends the wait hands them the outcome or sends them back to the table.
    std::shared_ptr<InFlight> poller;
    // The in-process owner (or poller) this wait follows in memory, and its watch, which
    // holds the count that makes it publish its outcome.
    std::shared_ptr<InFlight> leader;
    std::unique_ptr<RecordWatch> leader_watch;
    // The store's notification, asked for once, when this wait first polls.
    std::unique_ptr<RecordWatch> store_watch;
    bool store_watch_asked = false;
    // The latest busy answer, given when the wait is cancelled.
    Busy last{};
    // The answer, once a turn has settled the call.
    std::optional<BytesBegin> answer;
  };

  // What a wait holds that calls back in or lists it: given up when it ends (before its
  // answer is handed over, for begin_async). Idempotent.
  void let_go(KeyWait& w) noexcept {
    w.store_watch.reset();
    drop_leader(w);
    if (w.poller) {
      owners_.finish(*w.poller, OwnerState::kGone, nullptr);
      w.poller.reset();
    }
  }

  void drop_leader(KeyWait& w) noexcept {
    if (!w.leader) return;
    w.leader_watch.reset();  // uncounts the wait on the leader
    w.leader.reset();
    waiting_.fetch_sub(1, std::memory_order_relaxed);
  }

  // SPEC §7: follows an in-process call that holds (or polls) the key, found with
  // OwnerTable::find (which counted this wait on it).
  void adopt_leader(KeyWait& w, std::shared_ptr<InFlight> leader) {
    if (w.poller) {
      // An owner appeared in this process; our own followers follow it from now on.
      owners_.finish(*w.poller, OwnerState::kGone, nullptr);
      w.poller.reset();
    }
    w.leader = leader;
    waiting_.fetch_add(1, std::memory_order_relaxed);
    // The watch takes over find's count; it wakes the wait at once if the leader has
    // finished already.
    w.leader_watch = detail::watch_owner(std::move(leader), w.wake);
    // SPEC §5: key reuse is detected against the in-process owner's fingerprint too.
    check_fingerprint(w.leader->fingerprint, w.call.fingerprint, w.record());
  }

  // Ends a wait with a busy answer (the bound ran out, or the call was cancelled).
  std::nullopt_t settle_busy(KeyWait& w, Busy busy) {
    if (events_) emit(EventKind::kInProgress, w.record(), 0, 0, w.started);
    w.answer.emplace(BytesBegin(std::move(busy)));
    return std::nullopt;
  }

  // One turn of a wait: the time of the next, or nullopt once it is settled (the answer is
  // in w.answer). Throws what begin() throws.
  std::optional<SteadyClock::time_point> turn(KeyWait& w) {
    const RecordRef record = w.record();
    const Call& call = w.call;
    for (;;) {
      if (w.leader) {
        // SPEC §7: a duplicate of a call in this process waits on it in memory.
        InFlight& leader = *w.leader;
        std::string payload;
        OwnerState state = OwnerState::kRunning;
        {
          std::lock_guard lock(leader.mu);
          state = leader.state;
          if (state == OwnerState::kCompleted && leader.has_payload) payload = leader.payload;
          if (state == OwnerState::kCompleted && !leader.has_payload) state = OwnerState::kGone;
        }
        if (state == OwnerState::kCompleted) {
          if (events_) {
            emit(EventKind::kFollowed, record, leader.token(), leader.attempt.number(), w.started);
          }
          Result<std::string> r;
          r.replayed = true;
          r.token = leader.token();
          r.attempt = leader.attempt.number();
          r.stolen = leader.attempt.stolen();
          r.value = std::move(payload);
          w.answer.emplace(BytesBegin(std::move(r)));
          return std::nullopt;
        }
        if (state == OwnerState::kGone) {
          // It gave the key up: back to the store.
          drop_leader(w);
          continue;
        }
        if (closing()) throw shut_down_error();
        const auto until = w.bound();
        const auto now = SteadyClock::now();
        if (now >= until || call.stop.stop_requested()) return settle_busy(w, busy_of(leader, now));
        w.last = busy_of(leader, now);
        // Its watch wakes this wait when it finishes.
        return until;
      }
      if (closing()) throw shut_down_error();
      if (w.asked) {
        if (auto leader = owners_.find(w.id, w.hash, w.poller.get())) {
          adopt_leader(w, std::move(leader));
          continue;
        }
      }
      const auto sent = coarse_now();
      AcquireResult acquired = guarded(
          [&] { return store_->acquire(w.scope, w.key, call.lease, call.ttl, w.fingerprint()); },
          record);
      w.asked = true;
      if (auto* replay = std::get_if<Replay>(&acquired)) {
        check_fingerprint(replay->fingerprint, call.fingerprint, record);
        if (w.poller) {
          owners_.finish(*w.poller, OwnerState::kCompleted, &replay->payload);
          w.poller.reset();
        }
        if (events_) emit(EventKind::kReplayed, record, 0, 0, w.started);
        BytesBegin out(std::in_place_index<0>);
        Result<std::string>& r = *out.replay();
        r.replayed = true;
        r.completed_at = replay->completed_at;
        r.expires_at = replay->expires_at;
        r.value = std::move(replay->payload);
        w.answer.emplace(std::move(out));
        return std::nullopt;
      }
      if (auto* a = std::get_if<Acquired>(&acquired)) {
        // run()'s call count goes to the handle.
        CallCounter::Slot* counted = nullptr;
        if (w.uncount != nullptr) counted = std::exchange(w.uncount->slot, nullptr);
        w.answer.emplace(own(w.id, w.hash, *a, sent, call, w.poller, counted, w.started));
        return std::nullopt;
      }
      Busy& busy = std::get<Busy>(acquired);
      check_fingerprint(busy.fingerprint, call.fingerprint, record);
      const auto owner_deadline =
          sent + std::chrono::duration_cast<SteadyClock::duration>(busy.lease_remaining);
      if (!w.poller) {
        // The owner may be a call of this process that registered after our lookup.
        if (auto leader = owners_.find(w.id, w.hash, nullptr)) {
          adopt_leader(w, std::move(leader));
          continue;
        }
      }
      const auto until = w.bound();
      const auto now = SteadyClock::now();
      if (now >= until || call.stop.stop_requested()) return settle_busy(w, std::move(busy));
      w.last = busy;
      if (w.hand_over) {
        // begin_async: the waiting (the table, the watch, the polls) is the queue's.
        w.hand_over = false;
        return now;
      }
      if (w.poller) {
        w.poller->observe(owner_deadline, busy.lease_expires_at);
      } else {
        auto candidate = std::make_shared<InFlight>(w.scope, w.key, w.hash, busy, call.lease,
                                                    call.interval, owner_deadline);
        // Somebody in this process got in first: wait on them instead.
        if (!owners_.add_poller(candidate)) continue;
        w.poller = std::move(candidate);
      }
      if (!w.store_watch_asked) {
        w.store_watch_asked = true;
        w.store_watch = watch_record(record, w.wake);
        // Ask once more now that the watch is on: the owner may have finished before it was.
        // From here the polls are only the fallback for a lost notification.
        if (w.store_watch) {
          w.backoff.watched(call.wait.watched_backoff);
          continue;
        }
      }
      const auto pause = detail::poll_pause(w.backoff, busy.lease_remaining, until - now);
      w.backoff.advance();
      return now + pause;
    }
  }

  // Acquires, replays or waits as SPEC §5 and §7 say; an acquired lease comes back as a
  // handle. `keep_alive`: the handle keeps the executor alive (Executor::begin); otherwise
  // it is run()'s and stays counted as a call until it ends.
  BytesBegin begin(std::string_view scope, std::string_view key, const CallOptions& call_options,
                   bool keep_alive) {
    // SPEC §10: every input is checked before anything reaches the store.
    validate_scope(scope);
    validate_key(key);
    // Counted from here until the call leaves (for run(), until its handle ends), so that
    // shutdown knows when nobody uses the executor's state any more.
    CallCounter::Slot* const slot = calls_.enter();
    Uncount uncount{slot};
    if (closing_.load(std::memory_order_relaxed)) throw shut_down_error();
    const auto started = events_ ? SteadyClock::now() : SteadyClock::time_point{};
    // Where this call sleeps between turns; declared before the wait, whose watches wake it.
    Wakeup sleep;
    KeyWait w(*this, scope, key, resolve(call_options), keep_alive ? nullptr : &uncount, started,
              [&sleep] { sleep.wake(); });
    // Shutdown wakes it too, once it sleeps.
    std::optional<std::stop_callback<std::reference_wrapper<Wakeup>>> on_close;
    for (;;) {
      const auto next = turn(w);
      if (!next) return std::move(*w.answer);
      if (!on_close) on_close.emplace(closing_source_.get_token(), std::ref(sleep));
      // A cancellation, a shutdown or a watch ends the sleep.
      sleep.sleep_until(w.call.stop, *next, [this] { return closing(); });
    }
  }

  // A begin_async that waits: its wait and what that refers to. Touched only in its turns
  // (the caller's first, then the wait queue's thread) and by its Stop, which runs there or
  // after that thread has ended.
  struct AsyncWait {
    AsyncWait(ExecutorImpl& e, std::string_view s, std::string_view k, CallOptions o,
              Executor::BeginCallback d, SteadyClock::time_point since)
        : scope(s),
          key(k),
          options(std::move(o)),
          done(std::move(d)),
          wait(e, scope, key, e.resolve(options), nullptr, since,
               [&e, this] { e.waits_.wake(ticket); }) {}

    std::string scope;
    std::string key;
    CallOptions options;
    Executor::BeginCallback done;
    WaitQueue::Ticket ticket;
    KeyWait wait;
    std::optional<std::stop_callback<std::function<void()>>> on_stop;
  };

  // Executor::begin_async: the first turn on the caller's thread, the rest on the queue's.
  std::optional<BytesBegin> begin_async(std::string_view scope, std::string_view key,
                                        const CallOptions& call_options,
                                        Executor::BeginCallback done) {
    if (!done) throw InvalidArgument("begin_async callback", "must not be empty");
    validate_scope(scope);
    validate_key(key);
    const auto started = SteadyClock::now();
    auto w = std::make_shared<AsyncWait>(*this, scope, key, call_options, std::move(done), started);
    std::shared_ptr<WaitQueue::Waiter> waiter = WaitQueue::make(
        [this, w]() -> std::optional<SteadyClock::time_point> {
          std::optional<SteadyClock::time_point> next;
          try {
            CallCounter::Slot* const slot = calls_.enter();
            Uncount uncount{slot};
            next = turn(w->wait);
          } catch (...) {
            settle(*w, BeginAnswer(std::current_exception()));
            return std::nullopt;
          }
          if (!next) settle(*w, BeginAnswer(std::move(*w->wait.answer)));
          return next;
        },
        [this, w](bool shutting_down) {
          if (shutting_down) {
            return settle(*w, BeginAnswer(std::make_exception_ptr(shut_down_error())));
          }
          if (events_) emit(EventKind::kInProgress, w->wait.record(), 0, 0, w->wait.started);
          settle(*w, BeginAnswer(BytesBegin(Busy(w->wait.last))));
        });
    w->ticket = waiter;
    std::optional<SteadyClock::time_point> first;
    {
      CallCounter::Slot* const slot = calls_.enter();
      Uncount uncount{slot};
      w->wait.hand_over = true;
      first = turn(w->wait);  // throws as begin() does
    }
    if (!first) {
      let_go(w->wait);
      return std::move(*w->wait.answer);
    }
    // A stop requested from here on cancels the wait at once (one requested before the
    // waiter starts cancels its first turn).
    w->on_stop.emplace(w->options.stop_token,
                       std::function<void()>([this, t = w->ticket] { waits_.cancel(t); }));
    if (!waits_.start(std::move(waiter), *first)) {
      w->on_stop.reset();
      throw shut_down_error();
    }
    return std::nullopt;
  }

  std::size_t waiting_async() const { return waits_.size(); }

  // Answers a waiter. First it lets go of its watches, its place in the owner table and its
  // stop callback (each waits for a call of its own that is under way), so that nothing the
  // waiter still holds calls in.
  void settle(AsyncWait& w, BeginAnswer answer) noexcept {
    let_go(w.wait);
    w.on_stop.reset();
    Executor::BeginCallback done = std::move(w.done);
    w.done = nullptr;
    try {
      done(std::move(answer));
    } catch (...) {
      // The callback must not throw; the other waiters go on regardless.
    }
  }

  // The store's notification for a wait (Store::watch): calls `wake`. Null when the store
  // cannot notify, or could not start to: the wait then only polls, which is always
  // correct.
  std::unique_ptr<RecordWatch> watch_record(const RecordRef& record,
                                            const std::function<void()>& wake) {
    try {
      return store_->watch(record.scope, record.key, wake);
    } catch (const std::exception&) {
      return nullptr;
    }
  }

  // Ends an owner by storing its result (AttemptHandle::complete).
  Result<std::string> complete(InFlight& owner, std::string&& bytes) {
    // The last thing this function does is to stop counting run()'s call: after that the
    // executor's state may go away.
    Uncount uncount{owner.counted};
    if (!heartbeat_.remove(owner)) {
      // Only shutdown takes an open lease off the heartbeat behind its owner's back.
      throw released_by_shutdown(owner);
    }
    const std::size_t limit = options_.max_payload;
    if (bytes.size() > limit) {
      // SPEC §10: refuse before the result is lost, and leave the key clean for a retry.
      release_quietly(owner);
      if (events_) emit_for(EventKind::kReleased, owner, owner.started);
      owners_.finish(owner, OwnerState::kGone, nullptr);
      throw PayloadTooLarge(bytes.size(), limit, owner.record());
    }
    WriteResult written;
    try {
      written = write_result(owner, bytes);
    } catch (...) {
      owners_.finish(owner, OwnerState::kGone, nullptr);
      throw;
    }
    if (written == WriteResult::kFenced) {
      const std::string why = fenced_reason(owner);
      lose(owner);
      owners_.finish(owner, OwnerState::kGone, nullptr);
      throw LeaseLost(owner.token(), why, owner.record());
    }
    if (events_) emit_for(EventKind::kRan, owner, owner.started);
    owners_.finish(owner, OwnerState::kCompleted, &bytes);
    return fresh_result(owner.token(), owner.attempt.number(), owner.attempt.stolen(),
                        std::move(bytes));
  }

  // --- SPEC §14: the result written on the caller's transaction ---

  TransactionalStore& transactional() const {
    TransactionalStore* tx = store_->transactions();
    if (tx != nullptr) return *tx;
    throw InvalidArgument(
        "store", store_->describe() +
                     " cannot join a caller's database transaction (SPEC §14): its records "
                     "are not in a SQL database. Use a postgresql:// or sqlite:// store on the "
                     "database that holds your own data, or complete() after your commit");
  }

  // AttemptHandle::complete_in. Sets `ended` when the handle has ended (it throws then).
  void complete_in(const std::shared_ptr<InFlight>& held, const SqlConnection& conn,
                   const std::string& bytes, bool& ended) {
    InFlight& owner = *held;
    TransactionalStore& tx = transactional();
    const std::size_t limit = options_.max_payload;
    if (bytes.size() > limit) {
      ended = true;
      Uncount uncount{owner.counted};
      if (heartbeat_.remove(owner)) {
        release_quietly(owner);
        if (events_) emit_for(EventKind::kReleased, owner, owner.started);
        owners_.finish(owner, OwnerState::kGone, nullptr);
      }
      throw PayloadTooLarge(bytes.size(), limit, owner.record());
    }
    // The caller's transaction holds the record from the write to its end: an extend
    // would wait for it and then find the record COMPLETE, so the lease is not extended
    // until the caller reports the outcome.
    owner.in_caller_tx.store(true, std::memory_order_seq_cst);
    if (!heartbeat_.suspend(owner)) {
      owner.in_caller_tx.store(false, std::memory_order_relaxed);
      ended = true;
      Uncount uncount{owner.counted};
      throw released_by_shutdown(owner);
    }
    WriteResult written = WriteResult::kFenced;
    try {
      written = tx.complete_in(conn, owner.scope(), owner.key(), owner.token(), bytes, owner.ttl);
    } catch (...) {
      // Nothing of ours survives the caller's rollback: the lease is held again.
      if (!hold_again(held)) ended = true;
      throw;
    }
    if (written == WriteResult::kFenced) {
      ended = true;
      throw fenced_in_caller_tx(owner);
    }
  }

  // Ends an owner whose lease turned out lost while its result was in a caller's
  // transaction, and says why.
  LeaseLost fenced_in_caller_tx(InFlight& owner) {
    Uncount uncount{owner.counted};
    heartbeat_.remove(owner);
    owner.in_caller_tx.store(false, std::memory_order_relaxed);
    const std::string why = fenced_reason(owner);
    lose(owner);
    owners_.finish(owner, OwnerState::kGone, nullptr);
    return LeaseLost(owner.token(), why, owner.record());
  }

  // A write of the owner's was fenced: its lease is lost (Attempt::lease_lost() says so from
  // now on), told once.
  void lose(InFlight& owner) noexcept {
    if (owner.lost()) return;
    owner.mark_lost();
    if (events_) emit_for(EventKind::kLeaseLost, owner, owner.acquired_at);
  }

  // AttemptHandle::committed: the caller's commit made the result durable. The one store
  // call tells the store's waiters in other processes (the write in the caller's
  // transaction did not: TransactionalStore::notify_committed).
  Result<std::string> committed(InFlight& owner, std::string&& bytes) {
    Uncount uncount{owner.counted};
    // Whatever this returns (shutdown may have taken the lease off already), the record is
    // COMPLETE with this token now.
    heartbeat_.remove(owner);
    owner.in_caller_tx.store(false, std::memory_order_relaxed);
    if (events_) emit_for(EventKind::kRan, owner, owner.started);
    owners_.finish(owner, OwnerState::kCompleted, &bytes);
    if (TransactionalStore* tx = store_->transactions()) {
      tx->notify_committed(owner.scope(), owner.key());
    }
    return fresh_result(owner.token(), owner.attempt.number(), owner.attempt.stolen(),
                        std::move(bytes));
  }

  // AttemptHandle::rolled_back: the lease is extended again, at once. Returns false when
  // the handle has ended instead (the executor shut down: the lease was released).
  bool hold_again(const std::shared_ptr<InFlight>& held) {
    InFlight& owner = *held;
    owner.in_caller_tx.store(false, std::memory_order_seq_cst);
    if (!closing() && heartbeat_.resume(held)) return true;
    Uncount uncount{owner.counted};
    if (heartbeat_.remove(owner)) {
      release_quietly(owner);
      if (events_) emit_for(EventKind::kReleased, owner, owner.started);
      owners_.finish(owner, OwnerState::kGone, nullptr);
    }
    return false;
  }

  // AttemptHandle::resolve. Sets `ended` when the handle has ended.
  std::optional<Result<std::string>> resolve(const std::shared_ptr<InFlight>& held,
                                             std::string&& bytes, bool& ended) {
    InFlight& owner = *held;
    // A fenced write on the store's own connection: it waits for the caller's transaction
    // if that still holds the record, then sees what it left. Done: IN_PROGRESS with this
    // token, so the caller's transaction did not commit (and the lease is extended).
    const ExtendResult extended = guarded(
        [&] { return store_->extend(owner.scope(), owner.key(), owner.token(), owner.lease()); },
        owner.record());
    if (extended.done()) {
      if (!hold_again(held)) ended = true;
      return std::nullopt;
    }
    switch (read_back(owner)) {
      case ReadBack::kRecorded:
        ended = true;
        return committed(owner, std::move(bytes));
      case ReadBack::kNotOurs:
        ended = true;
        throw fenced_in_caller_tx(owner);
      case ReadBack::kStillOurs:
      case ReadBack::kUnknown:
        break;
    }
    throw StoreUnavailable(store_->describe(),
                           "could not tell whether the transaction that holds the result "
                           "committed; call resolve() again",
                           owner.record());
  }

  // Executor::run_in_open_transaction, first half: the acquire in the caller's transaction.
  // A key another transaction writes, or another caller's live lease holds, is waited for
  // under the call's waiting policy (SPEC §7): asked again after each pause of the policy's
  // backoff, within the bound; only where the store can wait inside a transaction
  // (TransactionalStore::can_wait_in_transaction), else InProgress at once. No watch: the
  // transaction this duplicate most often waits for is another run_in_open_transaction,
  // whose commit sends no notification (TransactionalStore::notify_committed).
  Result<std::string> begin_in_open_transaction(const SqlConnection& conn, std::string_view scope,
                                                std::string_view key, const CallOptions& options,
                                                std::optional<Attempt>& attempt) {
    TransactionalStore& tx = transactional();
    if (closing()) throw shut_down_error();
    validate_scope(scope);
    validate_key(key);
    const Call call = resolve(options);
    const RecordRef record{scope, key};
    const auto started = SteadyClock::now();
    const std::optional<std::string_view> fingerprint =
        call.fingerprint ? std::optional<std::string_view>(*call.fingerprint) : std::nullopt;
    tx.check_connection(conn, TransactionalStore::ConnectionUse::kJoin);
    const bool may_wait = call.wait.max_wait > Duration::zero() && tx.can_wait_in_transaction();
    const auto until =
        started + std::chrono::duration_cast<SteadyClock::duration>(call.wait.max_wait);
    detail::Backoff backoff(call.wait.initial_backoff, call.wait.max_backoff);
    Wakeup wakeup;
    std::optional<std::stop_callback<std::reference_wrapper<Wakeup>>> on_close;
    for (;;) {
      AcquireResult acquired = guarded(
          [&] {
            return tx.acquire_in(conn, scope, key, call.lease, call.ttl, fingerprint,
                                 /*nowait=*/true);
          },
          record);
      if (auto* a = std::get_if<Acquired>(&acquired)) {
        attempt.emplace(a->lease.token, a->lease.attempt, a->stolen, std::stop_token{});
        if (events_ && a->stolen)
          emit(EventKind::kStolen, record, a->lease.token, a->lease.attempt, started);
        return {};
      }
      if (auto* busy = std::get_if<Busy>(&acquired)) {
        check_fingerprint(busy->fingerprint, call.fingerprint, record);
        const auto now = SteadyClock::now();
        if (!may_wait || now >= until || call.stop.stop_requested()) {
          if (events_) emit(EventKind::kInProgress, record, 0, 0, started);
          throw InProgress(busy->lease_expires_at, busy->lease_remaining, record);
        }
        if (closing()) throw shut_down_error();
        // A record another transaction writes has no lease deadline to cap the pause.
        const Duration lease_left =
            busy->lease_remaining > Duration::zero() ? busy->lease_remaining : call.wait.max_wait;
        const auto pause = detail::poll_pause(backoff, lease_left, until - now);
        backoff.advance();
        if (!on_close) on_close.emplace(closing_source_.get_token(), std::ref(wakeup));
        wakeup.sleep_until(call.stop, now + pause, [this] { return closing(); });
        continue;
      }
      Replay& replay = std::get<Replay>(acquired);
      check_fingerprint(replay.fingerprint, call.fingerprint, record);
      if (events_) emit(EventKind::kReplayed, record, 0, 0, started);
      Result<std::string> r;
      r.replayed = true;
      r.completed_at = replay.completed_at;
      r.expires_at = replay.expires_at;
      r.value = std::move(replay.payload);
      return r;
    }
  }

  // Executor::run_in_open_transaction, second half: the complete in the same transaction.
  Result<std::string> complete_in_open_transaction(const SqlConnection& conn,
                                                   std::string_view scope, std::string_view key,
                                                   const Attempt& attempt, std::string&& bytes,
                                                   const CallOptions& options) {
    TransactionalStore& tx = transactional();
    const RecordRef record{scope, key};
    const std::size_t limit = options_.max_payload;
    // Nothing to release: the caller's rollback takes the record away.
    if (bytes.size() > limit) throw PayloadTooLarge(bytes.size(), limit, record);
    const Duration ttl = options.ttl.value_or(options_.ttl);
    const WriteResult written = guarded(
        [&] { return tx.complete_in(conn, scope, key, attempt.token(), bytes, ttl); }, record);
    if (written == WriteResult::kFenced) {
      // The caller's transaction holds the record it wrote; only that transaction itself
      // can have changed it since.
      throw LeaseLost(attempt.token(),
                      "the record written IN_PROGRESS in this transaction was changed or "
                      "deleted by the same transaction before the complete; roll back",
                      record);
    }
    if (events_)
      emit(EventKind::kRan, record, attempt.token(), attempt.number(), SteadyClock::now());
    return fresh_result(attempt.token(), attempt.number(), attempt.stolen(), std::move(bytes));
  }

  // Ends an owner by giving the key up (AttemptHandle::release, or its destructor). SPEC
  // §5: stop the heartbeat, release best effort.
  void release(InFlight& owner) noexcept {
    Uncount uncount{owner.counted};
    // False when shutdown released the lease already.
    if (!heartbeat_.remove(owner)) return;
    release_quietly(owner);
    if (events_) emit_for(EventKind::kReleased, owner, owner.started);
    owners_.finish(owner, OwnerState::kGone, nullptr);
  }

  // Ends an owner without a store call (AttemptHandle::abandon): the lease runs out on its
  // own and the next caller steals it (SPEC §4, §7).
  void abandon(InFlight& owner) noexcept {
    Uncount uncount{owner.counted};
    // False when shutdown released the lease already.
    if (!heartbeat_.remove(owner)) return;
    if (events_) emit_for(EventKind::kAbandoned, owner, owner.started);
    owners_.finish(owner, OwnerState::kGone, nullptr);
  }

  void shutdown(Duration timeout) noexcept {
    std::lock_guard serial(shutdown_mu_);
    if (shut_down_) return;
    closing_.store(true, std::memory_order_seq_cst);
    calls_.synchronize();
    wake_waiters();
    // begin_async's waiters: a turn under way ends (its ask sees the shutdown), the rest are
    // answered ShutDown.
    waits_.shutdown();
    // Calls in flight and open handles get `timeout` to end on their own.
    const auto give_up = SteadyClock::now() + timeout;
    while (listed() + counted() > 0 && SteadyClock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // Then their leases are released, so no key stays stuck, and their stop tokens are
    // requested. Calls that were already past their acquire may still list a lease, so
    // this goes on until no call is inside the executor's code: run()'s actions included,
    // since they return into it.
    for (;;) {
      abandon_listed();
      wake_waiters();
      if (counted() == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    shut_down_ = true;
  }

 private:
  Heartbeat::LeaseHandler lease_handler() {
    if (!events_) return nullptr;
    return [this](const HeartbeatLease& lease, const std::exception* error) {
      const auto& owner = static_cast<const InFlight&>(lease);
      emit(error != nullptr ? EventKind::kHeartbeatError : EventKind::kLeaseLost, owner.record(),
           owner.token(), owner.attempt.number(), owner.acquired_at, error);
    };
  }

  void emit(EventKind kind, RecordRef record, Token token, std::uint32_t attempt,
            SteadyClock::time_point since, const std::exception* error = nullptr) const noexcept {
    try {
      Event e;
      e.kind = kind;
      e.scope = record.scope;
      e.key = record.key;
      e.token = token;
      e.attempt = attempt;
      e.elapsed = std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - since);
      e.error = error;
      options_.on_event(e);
    } catch (...) {
      // The hook must not throw; if it does, the call goes on regardless.
    }
  }

  void emit_for(EventKind kind, const InFlight& owner,
                SteadyClock::time_point since) const noexcept {
    emit(kind, owner.record(), owner.token(), owner.attempt.number(), since);
  }

  Call resolve(const CallOptions& c) const {
    // The executor's own options were validated once, at construction.
    const Duration lease = c.lease.value_or(options_.lease);
    if (c.lease) validate_duration("lease", lease);
    const Duration ttl = c.ttl.value_or(options_.ttl);
    if (c.ttl) validate_duration("ttl", ttl);
    Duration interval = default_interval_;
    if (c.heartbeat) {
      interval = resolve_interval(*c.heartbeat, lease);
    } else if (c.lease) {
      // The executor's interval, unless this call's lease is too short for it: then the
      // call gets the default for its lease rather than an error about an option it never set.
      interval = options_.heartbeat > Duration::zero() && options_.heartbeat < lease
                     ? options_.heartbeat
                     : resolve_interval(Duration::zero(), lease);
    }
    const WaitPolicy& wait = c.wait ? *c.wait : options_.wait;
    if (c.wait) validate_wait(wait);
    return Call{lease, interval, ttl, wait, c.fingerprint, c.stop_token};
  }

  // Runs a store call, turning a store's runtime failure that is not one of ours into
  // StoreUnavailable so the caller sees one family of errors. Anything else (a
  // std::logic_error is a bug, not an outage; std::bad_alloc) goes through unchanged.
  template <typename F>
  [[gnu::always_inline]] auto guarded(F&& f, const RecordRef& record) -> decltype(f()) {
    try {
      return f();
    } catch (const StoreUnavailable& e) {
      // A store does not know which call it served: name the record here.
      if (!e.key().empty()) throw;
      throw StoreUnavailable(e.store(), e.reason(), record, e.unconfirmed());
    } catch (const Error&) {
      throw;
    } catch (const std::runtime_error& e) {
      throw StoreUnavailable(store_->describe(), e.what(), record);
    }
  }

  std::shared_ptr<InFlight> find_owner(const IdView& id, std::size_t hash,
                                       const InFlight* self) const {
    return owners_.find(id, hash, self);
  }

  // Best effort (SPEC §5): if the store is down the lease simply expires and the next
  // caller steals it.
  void release_quietly(const InFlight& owner) noexcept {
    try {
      (void)store_->release(owner.scope(), owner.key(), owner.token());
    } catch (...) {
    }
  }

  // What a read of the record says of a complete whose reply did not come.
  enum class ReadBack {
    kRecorded,   // COMPLETE with this token: the result is recorded
    kStillOurs,  // IN_PROGRESS with this token: the complete did not land
    kNotOurs,    // absent, or another token: this token can no longer complete
    kUnknown,    // the read failed too
  };

  ReadBack read_back(const InFlight& owner) noexcept {
    try {
      const std::optional<Record> now = store_->get(owner.scope(), owner.key());
      if (!now || now->token != owner.token()) return ReadBack::kNotOurs;
      return now->state == RecordState::kComplete ? ReadBack::kRecorded : ReadBack::kStillOurs;
    } catch (...) {
      return ReadBack::kUnknown;
    }
  }

  // Stores the result. A store error leaves the outcome unknown: the complete may have
  // landed and only its reply been lost. So the record is read back at once, and a record
  // COMPLETE with this token is this call's result, recorded (never reported as lost). A
  // record still IN_PROGRESS with this token gets the complete again, at once the first
  // time (the read just reached the store) and then with a doubling pause, while the lease
  // is ours by our own clock. SPEC §4 makes every repeat safe: a complete repeated with the
  // token that completed the record changes nothing and is done. An error that says the
  // write is unconfirmed (StoreUnavailable::unconfirmed) is never settled by a read: the
  // complete is repeated until the store confirms it or the lease runs out.
  WriteResult write_result(InFlight& owner, const std::string& bytes) {
    Backoff pause(kCompleteFirstRetry, kCompleteMaxRetry);
    for (int tries = 0;; ++tries) {
      try {
        return guarded(
            [&] {
              return store_->complete(owner.scope(), owner.key(), owner.token(), bytes, owner.ttl);
            },
            owner.record());
      } catch (const StoreUnavailable& e) {
        // A write the store took but could not confirm durable (store.h): a read would show
        // it and prove nothing, so only a repeat that the store confirms records the result.
        const ReadBack seen = e.unconfirmed() ? ReadBack::kUnknown : read_back(owner);
        if (seen == ReadBack::kRecorded) return WriteResult::kDone;
        if (seen == ReadBack::kNotOurs) return WriteResult::kFenced;
        const bool immediately = tries == 0 && seen == ReadBack::kStillOurs;
        if (!immediately && SteadyClock::now() + pause.pause() >= owner.local_deadline()) {
          throw StoreUnavailable(
              e.store(),
              e.reason() + (seen == ReadBack::kStillOurs
                                ? "; the result was not recorded"
                                : "; the result may or may not have been recorded"),
              owner.record(), e.unconfirmed());
        }
        if (!immediately) {
          std::this_thread::sleep_for(pause.pause());
          pause.advance();
        }
      }
    }
  }

  // Why a complete was fenced, for the LeaseLost message: one read of the record tells a
  // takeover from a deletion (a rare path, so the extra store call costs nothing).
  std::string fenced_reason(const InFlight& owner) noexcept {
    const std::string tail = "; the result was not recorded";
    try {
      const std::optional<Record> now = store_->get(owner.scope(), owner.key());
      if (!now) {
        return "the record was deleted (forgotten by an operator, or purged) or lost by the "
               "store (a failover of a replicated store can lose recent writes) while this call "
               "held the lease" +
               tail;
      }
      if (now->state == RecordState::kInProgress && now->token == owner.token()) {
        // Our own lease still holds the store's record: the write looked somewhere else.
        return "the write found no record IN_PROGRESS under this lease where it looked, while "
               "the store's record still is (lease " +
               std::to_string(now->token) +
               "): the connection it was written on does not reach the store's records" + tail;
      }
      if (now->state == RecordState::kInProgress && now->attempt <= 1) {
        // Attempt 1 under another token: the key was acquired afresh, so this lease's
        // record had gone first; it did not expire and get taken over.
        return "another caller acquired the key afresh (lease " + std::to_string(now->token) +
               ", attempt 1) after this lease's record was deleted or lost (an operator's "
               "forget, a purge, or a store failover)" +
               tail;
      }
      if (now->state == RecordState::kInProgress) {
        return "another caller took the key over (lease " + std::to_string(now->token) +
               ", attempt " + std::to_string(now->attempt) + ") after this lease expired" + tail;
      }
      return "another caller (lease " + std::to_string(now->token) +
             ") completed the key after this lease expired or its record was lost" + tail;
    } catch (...) {
      return "the store fenced the write: the lease expired and another caller took the key "
             "over, or the record was deleted" +
             tail;
    }
  }

  // Takes the lease: lists the call as the key's owner, starts its heartbeat and hands it
  // back as a handle.
  BytesBegin own(const IdView& id, std::size_t hash, const Acquired& acquired,
                 SteadyClock::time_point sent, const Call& call, std::shared_ptr<InFlight>& poller,
                 CallCounter::Slot* counted, SteadyClock::time_point started) {
    // SPEC §6: the local deadline is the send time plus the time left by the store's clock.
    const auto local_deadline =
        sent + std::chrono::duration_cast<SteadyClock::duration>(acquired.lease.lease_remaining);
    std::shared_ptr<InFlight> owner;
    try {
      owner = std::make_shared<InFlight>(id.scope, id.key, hash, acquired, call.lease,
                                         call.interval, sent, local_deadline, call.fingerprint,
                                         this, call.ttl, started);
    } catch (...) {
      // Nothing owns the lease yet: give it back before the error leaves, and stop
      // counting the call that the handle would have counted.
      try {
        (void)store_->release(id.scope, id.key, acquired.lease.token);
      } catch (...) {
      }
      if (counted != nullptr) CallCounter::leave(counted);
      throw;
    }
    InFlight& state = *owner;
    state.counted = counted;
    // From here the handle owns the lease: whatever throws, its destructor releases it
    // (and takes the lease off the heartbeat, which counts it from the start of add()).
    BytesBegin begun(HandleKey(), std::move(owner),
                     counted == nullptr ? shared_from_this() : std::shared_ptr<ExecutorImpl>());
    const std::shared_ptr<InFlight>& held = begun.handle()->state_;
    heartbeat_.add(held);
    owners_.add_owner(held);
    if (call.stop.stop_possible()) state.cancel.emplace(call.stop, RequestStop{&state});
    if (poller) {
      // The duplicates that waited on this call's polling now wait on it as the owner.
      owners_.finish(*poller, OwnerState::kGone, nullptr);
      poller.reset();
    }
    if (events_ && acquired.stolen) emit_for(EventKind::kStolen, state, started);
    return begun;
  }

  // --- shutdown ---

  // Calls inside the executor's code (run()'s actions included).
  std::int64_t counted() const noexcept { return calls_.total(); }

  // Owners and pollers in the table.
  std::size_t listed() const noexcept { return owners_.listed(); }

  // Wakes every blocking call that waits (polling, or on a call in memory) so that it sees
  // the shutdown.
  void wake_waiters() noexcept { closing_source_.request_stop(); }

  // Releases the lease of every owner still listed (a run()'s action still running, an
  // open handle): its stop token is requested and its complete() will throw LeaseLost.
  void abandon_listed() noexcept {
    for (const auto& owner : owners_.snapshot()) {
      if (!owner->owner()) continue;
      owner->request_stop();
      // SPEC §14: its result is written on a caller's transaction, which decides; a release
      // would only wait for that transaction's row lock.
      if (owner->in_caller_tx.load(std::memory_order_seq_cst)) continue;
      if (!heartbeat_.remove(*owner)) continue;  // ending on its own thread right now
      release_quietly(*owner);
      if (events_) emit_for(EventKind::kReleased, *owner, owner->started);
      owners_.finish(*owner, OwnerState::kGone, nullptr);
    }
  }

  std::shared_ptr<Store> store_;
  ExecutorOptions options_;
  Duration default_interval_;
  const bool events_;
  // Declared after store_ so that it stops before the store can go away.
  detail::Heartbeat heartbeat_;
  detail::OwnerTable owners_;
  CallCounter calls_;
  mutable std::atomic<std::size_t> waiting_{0};
  // Set once by shutdown; new calls are refused and waits end.
  std::atomic<bool> closing_{false};
  // Requested by shutdown, with closing_: wakes the blocking calls that wait.
  std::stop_source closing_source_;
  std::mutex shutdown_mu_;
  bool shut_down_ = false;  // guarded by shutdown_mu_
  // begin_async's waiters. Last, so that its thread ends first.
  WaitQueue waits_;
};

// --- AttemptCore ------------------------------------------------------------------------

AttemptCore::AttemptCore(std::shared_ptr<InFlight> state,
                         std::shared_ptr<ExecutorImpl> keep_alive) noexcept
    : keep_alive_(std::move(keep_alive)), state_(std::move(state)) {}

AttemptCore& AttemptCore::operator=(AttemptCore&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
    keep_alive_ = std::move(other.keep_alive_);
    ended_ = other.ended_;
    completing_ = other.completing_;
    pending_ = std::move(other.pending_);
  }
  return *this;
}

const Attempt& AttemptCore::attempt() const {
  if (state_ == nullptr) {
    throw std::logic_error("idem::AttemptHandle: the handle is empty (moved from)");
  }
  return state_->attempt;
}

std::string_view AttemptCore::scope() const {
  (void)attempt();  // throws on an empty handle
  return state_->scope();
}

std::string_view AttemptCore::key() const {
  (void)attempt();
  return state_->key();
}

void AttemptCore::release() noexcept {
  if (state_ == nullptr || ended_) return;
  if (completing_) {
    abandon();
    return;
  }
  ended_ = true;
  state_->exec->release(*state_);
}

void AttemptCore::abandon() noexcept {
  if (state_ == nullptr || ended_) return;
  ended_ = true;
  completing_ = false;
  state_->in_caller_tx.store(false, std::memory_order_relaxed);
  state_->exec->abandon(*state_);
}

Result<std::string> AttemptCore::complete_bytes(std::string bytes) {
  (void)attempt();  // throws on an empty handle
  if (ended_) throw std::logic_error("idem::AttemptHandle: the handle has already ended");
  // Whatever complete does, it ends the lease.
  ended_ = true;
  return state_->exec->complete(*state_, std::move(bytes));
}

void AttemptCore::complete_in_bytes(const SqlConnection& conn, std::string bytes) {
  (void)attempt();  // throws on an empty handle
  if (ended_) throw std::logic_error("idem::AttemptHandle: the handle has already ended");
  if (completing_) {
    throw std::logic_error(
        "idem::AttemptHandle: complete_in() was called already; report its commit first");
  }
  bool ended = false;
  try {
    state_->exec->complete_in(state_, conn, bytes, ended);
  } catch (...) {
    ended_ = ended;
    throw;
  }
  completing_ = true;
  pending_ = std::move(bytes);
}

namespace {
[[noreturn]] void not_completing() {
  throw std::logic_error("idem::AttemptHandle: no complete_in() waits for a commit on this handle");
}
}  // namespace

Result<std::string> AttemptCore::committed_bytes() {
  if (!completing()) not_completing();
  ended_ = true;
  completing_ = false;
  return state_->exec->committed(*state_, std::move(pending_));
}

void AttemptCore::rolled_back() {
  if (!completing()) not_completing();
  completing_ = false;
  pending_.clear();
  if (!state_->exec->hold_again(state_)) ended_ = true;
}

std::optional<Result<std::string>> AttemptCore::resolve_bytes() {
  if (!completing()) not_completing();
  bool ended = false;
  std::optional<Result<std::string>> out;
  try {
    out = state_->exec->resolve(state_, std::string(pending_), ended);
  } catch (...) {
    if (ended) {
      ended_ = true;
      completing_ = false;
    }
    throw;
  }
  completing_ = false;
  pending_.clear();
  ended_ = ended;
  return out;
}

void throw_decode_failed(std::string bytes, RecordRef record) {
  try {
    throw;
  } catch (const std::exception& e) {
    throw DecodeFailed(std::move(bytes), e.what(), record);
  } catch (...) {
    throw DecodeFailed(std::move(bytes),
                       "the codec threw an exception that is not a std::exception", record);
  }
}

}  // namespace detail

// --- Attempt, Executor ------------------------------------------------------------------

void Attempt::throw_if_lost() const {
  if (!lease_lost()) return;
  throw LeaseLost(token_,
                  "the action stopped on a lost lease (fenced by the store, or not extended "
                  "before its deadline); its result was not recorded",
                  record_);
}

const char* to_string(EventKind kind) {
  switch (kind) {
    case EventKind::kRan:
      return "ran";
    case EventKind::kReplayed:
      return "replayed";
    case EventKind::kFollowed:
      return "followed";
    case EventKind::kInProgress:
      return "in_progress";
    case EventKind::kReleased:
      return "released";
    case EventKind::kStolen:
      return "stolen";
    case EventKind::kLeaseLost:
      return "lease_lost";
    case EventKind::kHeartbeatError:
      return "heartbeat_error";
    case EventKind::kAbandoned:
      return "abandoned";
  }
  return "unknown";
}

Executor::Executor(std::shared_ptr<Store> store, ExecutorOptions options) {
  if (!store) throw InvalidArgument("store", "must not be null");
  validate_options(options);
  impl_ = std::make_shared<detail::ExecutorImpl>(std::move(store), std::move(options));
}

Executor::~Executor() {
  if (impl_) impl_->shutdown(impl_->options().shutdown_timeout);
}

Executor& Executor::operator=(Executor&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->shutdown(impl_->options().shutdown_timeout);
    impl_ = std::move(other.impl_);
  }
  return *this;
}

void Executor::shutdown(std::optional<Duration> timeout) {
  if (impl_) impl_->shutdown(timeout.value_or(impl_->options().shutdown_timeout));
}

bool Executor::is_shut_down() const noexcept { return !impl_ || impl_->closing(); }

BeginResult<std::string> Executor::begin_bytes(std::string_view scope, std::string_view key,
                                               const CallOptions& call, bool keep_alive) {
  if (!impl_) throw ShutDown("the executor was moved from");
  return impl_->begin(scope, key, call, keep_alive);
}

Executor::BytesResult Executor::run_bytes(std::string_view scope, std::string_view key,
                                          const BytesAction& action, const CallOptions& call) {
  return run<std::string>(scope, key, action, call);
}

namespace {
[[noreturn]] void moved_from() {
  throw std::logic_error("idem::Executor: used after it was moved from");
}
}  // namespace

TransactionalStore& Executor::transactional_store() const {
  if (!impl_) throw ShutDown("the executor was moved from");
  return impl_->transactional();
}

Result<std::string> Executor::begin_in_open_transaction(const SqlConnection& conn,
                                                        std::string_view scope,
                                                        std::string_view key,
                                                        const CallOptions& options,
                                                        std::optional<Attempt>& attempt) {
  if (!impl_) throw ShutDown("the executor was moved from");
  return impl_->begin_in_open_transaction(conn, scope, key, options, attempt);
}

Result<std::string> Executor::complete_in_open_transaction(
    const SqlConnection& conn, std::string_view scope, std::string_view key, const Attempt& attempt,
    std::string bytes, const CallOptions& options) {
  if (!impl_) throw ShutDown("the executor was moved from");
  return impl_->complete_in_open_transaction(conn, scope, key, attempt, std::move(bytes), options);
}

void Executor::throw_action_ended_transaction(detail::AttemptCore& handle) {
  const Token token = handle.token();
  handle.abandon();
  throw InvalidArgument(
      "action",
      "ended the transaction run_in_transaction began on its connection (a COMMIT or ROLLBACK "
      "of its own), so its writes may have committed without the record: the key is kept, "
      "IN_PROGRESS under lease " +
          std::to_string(token) +
          " until the lease runs out, and the next caller then takes it over (attempt 2, "
          "stolen) to decide. Do not end the transaction inside the action");
}

Store& Executor::store() const {
  if (!impl_) moved_from();
  return impl_->store();
}

const ExecutorOptions& Executor::options() const {
  if (!impl_) moved_from();
  return impl_->options();
}

std::unique_ptr<RecordWatch> Executor::watch(std::string_view scope, std::string_view key,
                                             std::function<void()> changed) const {
  if (!impl_) moved_from();
  return impl_->watch(scope, key, std::move(changed));
}

std::size_t Executor::active_leases() const { return impl_ ? impl_->active_leases() : 0; }

std::size_t Executor::waiting_duplicates() const { return impl_ ? impl_->waiting_duplicates() : 0; }

std::size_t Executor::waiting_async() const { return impl_ ? impl_->waiting_async() : 0; }

std::optional<BeginResult<std::string>> Executor::begin_async(std::string_view scope,
                                                              std::string_view key,
                                                              const CallOptions& call,
                                                              BeginCallback done) {
  if (!impl_) throw ShutDown("the executor was moved from");
  return impl_->begin_async(scope, key, call, std::move(done));
}

}  // namespace idem
