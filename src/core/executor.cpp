#include "idem/executor.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "core/heartbeat.h"

namespace idem {
namespace {

using detail::coarse_now;
using detail::HeartbeatLease;
using detail::SteadyClock;

// A completed complete() call that failed with a store error is retried after this pause,
// doubling up to the cap, while the local view of the lease is still valid (SPEC §4: a
// complete repeated with the same token is idempotent).
constexpr Duration kCompleteFirstRetry{5};
constexpr Duration kCompleteMaxRetry{250};

// Independently locked parts of the in-process owner table, so callers working on
// different keys rarely meet on one lock.
constexpr std::size_t kOwnerShards = 64;

// (scope, key) as views; the table's keys point into the owner's own copy.
struct IdView {
  std::string_view scope;
  std::string_view key;
  bool operator==(const IdView&) const = default;
};

// One pass over scope and key, eight bytes at a time: the table only ever holds the calls
// in flight, so a short multiply-xorshift mix is plenty and costs less than two calls of
// std::hash on the hot path.
std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v;
  h *= 0x9e3779b97f4a7c15ULL;
  return h ^ (h >> 29);
}

std::uint64_t hash_bytes(std::uint64_t h, std::string_view s) {
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t v;
    std::memcpy(&v, s.data() + i, 8);
    h = mix(h, v);
  }
  std::uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  return mix(h, tail ^ (std::uint64_t{s.size()} << 56));
}

struct IdHash {
  std::size_t operator()(const IdView& id) const noexcept {
    return static_cast<std::size_t>(
        hash_bytes(hash_bytes(0x243f6a8885a308d3ULL, id.scope), id.key));
  }
};

enum class OwnerState {
  kRunning,    // the action is running
  kCompleted,  // the result is recorded in the store
  kGone,       // released, fenced or failed: waiters go back to the store
};

}  // namespace

namespace detail {

// A call of this executor that holds the lease on a key (the state behind an
// AttemptHandle), or one that polls the store for the key on behalf of the duplicates in
// this process. In-process duplicates find it in the owner table and wait on it in memory
// instead of polling the store (SPEC §7).
struct InFlight {
  // An owner: this call holds the lease.
  InFlight(std::string_view scope, std::string_view key, std::size_t id_hash,
           const Acquired& acquired, Duration lease, Duration interval,
           SteadyClock::time_point local_deadline, const std::optional<std::string>& fp,
           ExecutorImpl* executor, Duration result_ttl)
      : hb(scope, key, acquired.lease.token, lease, interval, local_deadline,
           acquired.lease.lease_expires_at),
        hash(id_hash),
        fingerprint(fp),
        exec(executor),
        ttl(result_ttl),
        attempt(acquired.lease.token, acquired.lease.attempt, acquired.stolen, hb.stop_token()) {}
  // A poller: another process holds the lease and this call polls the store on behalf of
  // every duplicate in this process (SPEC §7: they do not poll the store themselves).
  InFlight(std::string_view scope, std::string_view key, std::size_t id_hash, const Busy& busy,
           Duration lease, Duration interval, SteadyClock::time_point local_deadline)
      : hb(scope, key, 0, lease, interval, local_deadline, busy.lease_expires_at),
        hash(id_hash),
        fingerprint(busy.fingerprint),
        attempt(0, 0, false, {}) {}

  // The heartbeat's view of the lease (an owner's is registered with the heartbeat; a
  // poller's only records the owner's deadline); it also owns the copy of (scope, key).
  HeartbeatLease hb;
  // IdHash of (scope, key), compared before the strings when the table is searched.
  const std::size_t hash;
  // The fingerprint stored with the record.
  const std::optional<std::string> fingerprint;
  // An owner's executor, and the TTL its result is stored with.
  ExecutorImpl* const exec = nullptr;
  const Duration ttl{0};
  // What the action sees of an owner's lease.
  const Attempt attempt;
  // Duplicates that found this owner in the table and may still read its outcome.
  std::atomic<int> waiters{0};

  std::mutex mu;
  std::condition_variable cv;
  OwnerState state = OwnerState::kRunning;  // guarded by mu
  bool has_payload = false;                 // guarded by mu
  std::string payload;                      // guarded by mu

  IdView id() const { return IdView{hb.scope(), hb.key()}; }
  bool is(const IdView& other, std::size_t other_hash) const {
    return hash == other_hash && id() == other;
  }
};

}  // namespace detail

namespace {

using detail::InFlight;

// A shard holds only the calls in flight whose key hashes to it, a handful at most in
// practice, so a plain vector searched hash-first beats a hash map: listing and unlisting a
// call allocate nothing once the vector has grown, and the search stays correct (if slower)
// with thousands in flight.
struct alignas(64) OwnerShard {
  std::mutex mu;
  // Lets a lookup skip the lock when the shard holds nobody, the common case.
  std::atomic<std::size_t> count{0};
  std::vector<std::shared_ptr<InFlight>> owners;  // at most one per (scope, key)

  std::shared_ptr<InFlight>* find(const IdView& id, std::size_t hash) {
    for (auto& o : owners) {
      if (o->is(id, hash)) return &o;
    }
    return nullptr;
  }
};

// The options of one call: the executor's, overridden by the call's, validated.
struct Call {
  Duration lease;
  Duration interval;
  Duration ttl;
  WaitPolicy wait;
  const std::optional<std::string>& fingerprint;
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
}

// SPEC §5: a stored fingerprint and the call's that differ mean the key was reused.
void check_fingerprint(const std::optional<std::string>& stored,
                       const std::optional<std::string>& requested) {
  if (stored && requested && *stored != *requested) throw KeyReuse(*stored, *requested);
}

// The pause before the next poll: half the backoff plus up to half again at random, so
// waiters that started together spread out.
SteadyClock::duration jittered(Duration backoff) {
  thread_local std::minstd_rand rng(static_cast<std::uint32_t>(
      std::hash<std::thread::id>{}(std::this_thread::get_id()) ^
      static_cast<std::size_t>(SteadyClock::now().time_since_epoch().count())));
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(backoff).count();
  const auto half = us / 2;
  std::uniform_int_distribution<long long> extra(0, us - half);
  return std::chrono::microseconds(half + extra(rng));
}

// What a duplicate reports when it gives up on an in-process owner: the owner's deadline.
Busy busy_of(const InFlight& owner, SteadyClock::time_point now) {
  const auto left = std::max(owner.hb.local_deadline() - now, SteadyClock::duration::zero());
  return Busy{owner.hb.lease_expires_at(), std::chrono::ceil<Duration>(left), owner.fingerprint};
}

using BytesBegin = BeginResult<std::string>;

}  // namespace

namespace detail {

class ExecutorImpl : public std::enable_shared_from_this<ExecutorImpl> {
 public:
  ExecutorImpl(std::shared_ptr<Store> store, ExecutorOptions options)
      : store_(std::move(store)),
        options_(std::move(options)),
        default_interval_(resolve_interval(options_.heartbeat, options_.lease)),
        heartbeat_(*store_, options_.on_heartbeat_error),
        shards_(std::make_unique<OwnerShard[]>(kOwnerShards)) {}

  Store& store() const noexcept { return *store_; }
  const ExecutorOptions& options() const noexcept { return options_; }
  std::size_t active_leases() const noexcept { return heartbeat_.active(); }
  std::size_t waiting_duplicates() const noexcept {
    return waiting_.load(std::memory_order_relaxed);
  }

  // Acquires, replays or waits as SPEC §5 and §7 say; an acquired lease comes back as a
  // handle; `keep_alive` when the handle must keep the executor alive (Executor::begin).
  BytesBegin begin(std::string_view scope, std::string_view key, const CallOptions& call_options,
                   bool keep_alive) {
    // SPEC §10: every input is checked before anything reaches the store.
    validate_scope(scope);
    validate_key(key);
    const Call call = resolve(call_options);
    // The waiting bound counts from the first time the key is found busy, so a call that
    // never waits never reads the clock for it.
    std::optional<SteadyClock::time_point> wait_deadline;
    const auto bound = [&] {
      if (!wait_deadline) wait_deadline = SteadyClock::now() + call.wait.max_wait;
      return *wait_deadline;
    };
    const std::optional<std::string_view> fingerprint =
        call.fingerprint ? std::optional<std::string_view>(*call.fingerprint) : std::nullopt;
    const IdView id{scope, key};
    const std::size_t hash = IdHash{}(id);
    Duration backoff = call.wait.initial_backoff;

    // Set while this call polls the store for the in-process duplicates that wait on it;
    // whatever ends the call hands them the outcome or sends them back to the table.
    std::shared_ptr<InFlight> poller;
    struct StopPolling {
      const ExecutorImpl& impl;
      std::shared_ptr<InFlight>& poller;
      ~StopPolling() {
        if (poller) impl.finish(*poller, OwnerState::kGone, nullptr);
      }
    } stop_polling{*this, poller};

    for (;;) {
      // SPEC §7: a duplicate of a call in this process waits on it in memory.
      if (auto owner = find_owner(id, hash, poller.get())) {
        if (poller) {
          // An owner appeared in this process; our own waiters follow it from now on.
          finish(*poller, OwnerState::kGone, nullptr);
          poller.reset();
        }
        if (auto r = follow(*owner, call, bound())) return std::move(*r);
        continue;
      }
      const auto sent = coarse_now();
      AcquireResult acquired =
          guarded([&] { return store_->acquire(scope, key, call.lease, call.ttl, fingerprint); });
      if (auto* replay = std::get_if<Replay>(&acquired)) {
        check_fingerprint(replay->fingerprint, call.fingerprint);
        if (poller) {
          finish(*poller, OwnerState::kCompleted, &replay->payload);
          poller.reset();
        }
        return BytesBegin(Result<std::string>{std::move(replay->payload), true});
      }
      if (auto* a = std::get_if<Acquired>(&acquired)) {
        return own(id, hash, *a, sent, call, poller, keep_alive);
      }
      Busy& busy = std::get<Busy>(acquired);
      check_fingerprint(busy.fingerprint, call.fingerprint);
      const auto owner_deadline =
          sent + std::chrono::duration_cast<SteadyClock::duration>(busy.lease_remaining);
      if (!poller) {
        // The owner may be a call of this process that registered after our lookup.
        if (auto owner = find_owner(id, hash, nullptr)) {
          if (auto r = follow(*owner, call, bound())) return std::move(*r);
          continue;
        }
      }
      const auto until = bound();
      const auto now = SteadyClock::now();
      if (now >= until) return BytesBegin(std::move(busy));
      if (poller) {
        poller->hb.observe(owner_deadline, busy.lease_expires_at);
      } else {
        auto candidate = std::make_shared<InFlight>(scope, key, hash, busy, call.lease,
                                                    call.interval, owner_deadline);
        // Somebody in this process got in first: wait on them instead.
        if (!register_poller(candidate)) continue;
        poller = std::move(candidate);
      }
      // SPEC §7: never sleep past the owner's lease deadline (the store's own count of the
      // time left) nor past the waiting bound.
      const auto pause =
          std::min({jittered(backoff), SteadyClock::duration(busy.lease_remaining), until - now});
      std::this_thread::sleep_for(pause);
      backoff = std::min(backoff * 2, call.wait.max_backoff);
    }
  }

  // Ends an owner by storing its result (AttemptHandle::complete).
  Result<std::string> complete(InFlight& owner, std::string&& bytes) {
    heartbeat_.remove(owner.hb);
    if (bytes.size() > options_.max_payload) {
      // SPEC §10: refuse before the result is lost, and leave the key clean for a retry.
      release_quietly(owner);
      finish(owner, OwnerState::kGone, nullptr);
      throw PayloadTooLarge(bytes.size(), options_.max_payload);
    }
    WriteResult written;
    try {
      written = write_result(owner, bytes);
    } catch (...) {
      finish(owner, OwnerState::kGone, nullptr);
      throw;
    }
    if (written == WriteResult::kFenced) {
      finish(owner, OwnerState::kGone, nullptr);
      throw LeaseLost(owner.hb.token(),
                      "the result was not recorded because another caller now owns the key");
    }
    finish(owner, OwnerState::kCompleted, &bytes);
    return Result<std::string>{std::move(bytes), false};
  }

  // Ends an owner by giving the key up (AttemptHandle::release, or its destructor). SPEC
  // §5: stop the heartbeat, release best effort.
  void release(InFlight& owner) noexcept {
    heartbeat_.remove(owner.hb);
    release_quietly(owner);
    finish(owner, OwnerState::kGone, nullptr);
  }

 private:
  Call resolve(const CallOptions& c) const {
    // The executor's own options were validated once, at construction.
    const Duration lease = c.lease.value_or(options_.lease);
    if (c.lease) validate_duration("lease", lease);
    const Duration ttl = c.ttl.value_or(options_.ttl);
    if (c.ttl) validate_duration("ttl", ttl);
    const Duration interval =
        c.lease || c.heartbeat ? resolve_interval(c.heartbeat.value_or(options_.heartbeat), lease)
                               : default_interval_;
    const WaitPolicy& wait = c.wait ? *c.wait : options_.wait;
    if (c.wait) validate_wait(wait);
    return Call{lease, interval, ttl, wait, c.fingerprint};
  }

  // Runs a store call, turning an exception that is not one of ours (a misbehaving store)
  // into StoreUnavailable so the caller sees one family of errors.
  template <typename F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw StoreUnavailable(store_->describe(), e.what());
    }
  }

  OwnerShard& shard(std::size_t hash) const {
    return shards_[(hash ^ (hash >> 32)) & (kOwnerShards - 1)];
  }

  // The in-process owner (or poller) of the key other than `self`, counted as a waiter so
  // that it publishes its outcome.
  std::shared_ptr<InFlight> find_owner(const IdView& id, std::size_t hash,
                                       const InFlight* self) const {
    OwnerShard& s = shard(hash);
    if (s.count.load(std::memory_order_acquire) == 0) return nullptr;
    std::lock_guard lock(s.mu);
    auto* found = s.find(id, hash);
    if (found == nullptr || found->get() == self) return nullptr;
    (*found)->waiters.fetch_add(1, std::memory_order_relaxed);
    return *found;
  }

  // Lists a poller unless somebody is listed for the key already.
  bool register_poller(const std::shared_ptr<InFlight>& poller) const {
    OwnerShard& s = shard(poller->hash);
    std::lock_guard lock(s.mu);
    if (s.find(poller->id(), poller->hash) != nullptr) return false;
    s.owners.push_back(poller);
    s.count.fetch_add(1, std::memory_order_release);
    return true;
  }

  void register_owner(const std::shared_ptr<InFlight>& owner) const {
    OwnerShard& s = shard(owner->hash);
    // An earlier owner that released a moment ago, or this call's own poller, may still be
    // listed: the new owner takes its place. The entry replaced is dropped after the lock.
    std::shared_ptr<InFlight> replaced = owner;
    std::lock_guard lock(s.mu);
    if (auto* found = s.find(owner->id(), owner->hash)) {
      found->swap(replaced);
    } else {
      s.owners.push_back(std::move(replaced));
      s.count.fetch_add(1, std::memory_order_release);
    }
  }

  // Takes the owner off the table and hands its outcome to the duplicates waiting on it.
  void finish(InFlight& owner, OwnerState state, const std::string* payload) const noexcept {
    // The table's reference is dropped after the lock; the caller holds its own.
    std::shared_ptr<InFlight> unlisted;
    {
      OwnerShard& s = shard(owner.hash);
      std::lock_guard lock(s.mu);
      auto& owners = s.owners;
      for (std::size_t i = 0; i < owners.size(); ++i) {
        if (owners[i].get() != &owner) continue;
        unlisted = std::move(owners[i]);
        if (i + 1 != owners.size()) owners[i] = std::move(owners.back());
        owners.pop_back();
        s.count.fetch_sub(1, std::memory_order_release);
        break;
      }
    }
    // Nobody can find the owner any more; every duplicate that did is counted.
    if (owner.waiters.load(std::memory_order_relaxed) == 0) return;
    {
      std::lock_guard lock(owner.mu);
      owner.state = state;
      if (payload) {
        owner.payload = *payload;
        owner.has_payload = true;
      }
    }
    owner.cv.notify_all();
  }

  // Waits in memory on an in-process owner. Returns its result, a busy answer when the
  // waiting bound runs out, or nullopt when the owner gave the key up and the caller should
  // go back to the store.
  std::optional<BytesBegin> follow(InFlight& owner, const Call& call,
                                   SteadyClock::time_point wait_deadline) const {
    struct Leave {
      InFlight& owner;
      ~Leave() { owner.waiters.fetch_sub(1, std::memory_order_relaxed); }
    } leave{owner};
    // SPEC §5: key reuse is detected against the in-process owner's fingerprint too.
    check_fingerprint(owner.fingerprint, call.fingerprint);
    std::unique_lock lock(owner.mu);
    for (;;) {
      if (owner.state == OwnerState::kCompleted && owner.has_payload) {
        return BytesBegin(Result<std::string>{owner.payload, true});
      }
      if (owner.state != OwnerState::kRunning) return std::nullopt;
      const auto now = SteadyClock::now();
      if (now >= wait_deadline) return BytesBegin(busy_of(owner, now));
      waiting_.fetch_add(1, std::memory_order_relaxed);
      owner.cv.wait_until(lock, wait_deadline);
      waiting_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  // Best effort (SPEC §5): if the store is down the lease simply expires and the next
  // caller steals it.
  void release_quietly(const InFlight& owner) noexcept {
    try {
      (void)store_->release(owner.hb.scope(), owner.hb.key(), owner.hb.token());
    } catch (...) {
    }
  }

  WriteResult write_result(InFlight& owner, const std::string& bytes) {
    Duration pause = kCompleteFirstRetry;
    for (;;) {
      try {
        return guarded([&] {
          return store_->complete(owner.hb.scope(), owner.hb.key(), owner.hb.token(), bytes,
                                  owner.ttl);
        });
      } catch (const StoreUnavailable&) {
        // SPEC §4: a complete repeated with the same token changes nothing if the first
        // one did land, so it is safe to retry while the lease is ours by our own clock.
        if (SteadyClock::now() + pause >= owner.hb.local_deadline()) throw;
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, kCompleteMaxRetry);
      }
    }
  }

  // Takes the lease: lists the call as the key's owner, starts its heartbeat and hands it
  // back as a handle.
  BytesBegin own(const IdView& id, std::size_t hash, const Acquired& acquired,
                 SteadyClock::time_point sent, const Call& call,
                 std::shared_ptr<InFlight>& poller, bool keep_alive) {
    // SPEC §6: the local deadline is the send time plus the time left by the store's clock.
    const auto local_deadline =
        sent + std::chrono::duration_cast<SteadyClock::duration>(acquired.lease.lease_remaining);
    std::shared_ptr<InFlight> owner;
    try {
      owner = std::make_shared<InFlight>(id.scope, id.key, hash, acquired, call.lease,
                                         call.interval, local_deadline, call.fingerprint, this,
                                         call.ttl);
    } catch (...) {
      // Nothing owns the lease yet: give it back before the error leaves.
      try {
        (void)store_->release(id.scope, id.key, acquired.lease.token);
      } catch (...) {
      }
      throw;
    }
    InFlight& state = *owner;
    // From here the handle owns the lease: whatever throws, its destructor releases it
    // (and takes the lease off the heartbeat, which counts it from the start of add()).
    BytesBegin begun(HandleKey(), std::move(owner),
                     keep_alive ? shared_from_this() : std::shared_ptr<ExecutorImpl>());
    const std::shared_ptr<InFlight>& held = begun.handle()->state_;
    heartbeat_.add(std::shared_ptr<HeartbeatLease>(held, &state.hb));
    register_owner(held);
    if (poller) {
      // The duplicates that waited on this call's polling now wait on it as the owner.
      finish(*poller, OwnerState::kGone, nullptr);
      poller.reset();
    }
    return begun;
  }

  std::shared_ptr<Store> store_;
  ExecutorOptions options_;
  Duration default_interval_;
  // Declared after store_ so that it stops before the store can go away.
  detail::Heartbeat heartbeat_;
  std::unique_ptr<OwnerShard[]> shards_;
  mutable std::atomic<std::size_t> waiting_{0};
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
  }
  return *this;
}

bool AttemptCore::active() const noexcept {
  return state_ != nullptr && !ended_;
}

InFlight& AttemptCore::state() const {
  if (state_ == nullptr) {
    throw std::logic_error("idem::AttemptHandle: the handle is empty (moved from)");
  }
  return *state_;
}

const Attempt& AttemptCore::attempt() const { return state().attempt; }

std::string_view AttemptCore::scope() const { return state().hb.scope(); }

std::string_view AttemptCore::key() const { return state().hb.key(); }

void AttemptCore::release() noexcept {
  if (state_ == nullptr || ended_) return;
  ended_ = true;
  state_->exec->release(*state_);
}

Result<std::string> AttemptCore::complete_bytes(std::string bytes) {
  InFlight& s = state();
  if (ended_) throw std::logic_error("idem::AttemptHandle: the handle has already ended");
  // Whatever complete does, it ends the lease.
  ended_ = true;
  return s.exec->complete(s, std::move(bytes));
}

}  // namespace detail

// --- Executor ---------------------------------------------------------------------------

Executor::Executor(std::shared_ptr<Store> store, ExecutorOptions options) {
  if (!store) throw InvalidArgument("store", "must not be null");
  validate_options(options);
  impl_ = std::make_shared<detail::ExecutorImpl>(std::move(store), std::move(options));
}

Executor::~Executor() = default;

BeginResult<std::string> Executor::begin_bytes(std::string_view scope, std::string_view key,
                                               const CallOptions& call, bool keep_alive) {
  return impl_->begin(scope, key, call, keep_alive);
}

Executor::BytesResult Executor::run_bytes(std::string_view scope, std::string_view key,
                                          const BytesAction& action, const CallOptions& call) {
  return run<std::string>(scope, key, action, call);
}

Store& Executor::store() const noexcept { return impl_->store(); }

const ExecutorOptions& Executor::options() const noexcept { return impl_->options(); }

std::size_t Executor::active_leases() const { return impl_->active_leases(); }

std::size_t Executor::waiting_duplicates() const { return impl_->waiting_duplicates(); }

}  // namespace idem
