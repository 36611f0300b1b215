#pragma once

// The in-process owner table (SPEC §7): the calls of one executor that hold a lease, or
// poll the store for a key, listed by (scope, key), so that a duplicate in the same process
// finds them and waits on them in memory (a follower) instead of polling the store.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "core/call_counter.h"
#include "core/heartbeat.h"
#include "idem/executor.h"

namespace idem::detail {

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
inline std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v;
  h *= 0x9e3779b97f4a7c15ULL;
  return h ^ (h >> 29);
}

inline std::uint64_t hash_bytes(std::uint64_t h, std::string_view s) {
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

// Requests an attempt's stop token when the call's CallOptions::stop_token is requested.
struct RequestStop {
  HeartbeatLease* lease;
  void operator()() const noexcept { lease->request_stop(); }
};

// A call of this executor that holds the lease on a key (the state behind an
// AttemptHandle; the heartbeat keeps it as its lease), or one that polls the store for
// the key on behalf of the duplicates in this process. In-process duplicates find it in
// the owner table and wait on it in memory instead of polling the store (SPEC §7).
struct InFlight : HeartbeatLease {
  // An owner: this call holds the lease.
  InFlight(std::string_view scope, std::string_view key, std::size_t id_hash,
           const Acquired& acquired, Duration lease, Duration interval,
           SteadyClock::time_point sent, SteadyClock::time_point local_deadline,
           const std::optional<std::string>& fp, ExecutorImpl* executor, Duration result_ttl,
           SteadyClock::time_point call_started)
      : HeartbeatLease(scope, key, acquired.lease.token, lease, interval, local_deadline,
                       acquired.lease.lease_expires_at),
        hash(id_hash),
        fingerprint(fp),
        exec(executor),
        ttl(result_ttl),
        acquired_at(sent),
        started(call_started),
        attempt(acquired.lease.token, acquired.lease.attempt, acquired.stolen, stop_token(),
                &lost_flag(), RecordRef{this->scope(), this->key()}) {}
  // A poller: another process holds the lease and this call polls the store on behalf of
  // every duplicate in this process (SPEC §7: they do not poll the store themselves).
  InFlight(std::string_view scope, std::string_view key, std::size_t id_hash, const Busy& busy,
           Duration lease, Duration interval, SteadyClock::time_point local_deadline)
      : HeartbeatLease(scope, key, 0, lease, interval, local_deadline, busy.lease_expires_at),
        hash(id_hash),
        fingerprint(busy.fingerprint),
        attempt(0, 0, false, {}) {}

  bool owner() const noexcept { return exec != nullptr; }
  RecordRef record() const noexcept { return RecordRef{scope(), key()}; }

  // IdHash of (scope, key), compared before the strings when the table is searched.
  const std::size_t hash;
  // The fingerprint stored with the record.
  const std::optional<std::string> fingerprint;
  // An owner's executor, and the TTL its result is stored with.
  ExecutorImpl* const exec = nullptr;
  const Duration ttl{0};
  // When the acquire was sent, and when the call began (only read for events).
  const SteadyClock::time_point acquired_at{};
  const SteadyClock::time_point started{};
  // What the action sees of an owner's lease.
  const Attempt attempt;
  // A lease taken for run(): the call slot it is counted in until it ends, so shutdown
  // waits for the action to return. Null for a handle from Executor::begin.
  CallCounter::Slot* counted = nullptr;
  // Requests the attempt's stop token when the call is cancelled.
  std::optional<std::stop_callback<RequestStop>> cancel;
  // Duplicates that found this owner in the table and may still read its outcome.
  std::atomic<int> waiters{0};
  // SPEC §14: set while its result is written on a caller's transaction whose commit has
  // not been reported; shutdown leaves such a lease to that transaction.
  std::atomic<bool> in_caller_tx{false};

  std::mutex mu;
  // Executor::watch callbacks on this key, run (under mu) when the call finishes; each is
  // counted in `waiters` while it is listed. Guarded by mu.
  std::list<std::function<void()>> wakers;
  OwnerState state = OwnerState::kRunning;  // guarded by mu
  bool has_payload = false;                 // guarded by mu
  std::string payload;                      // guarded by mu

  IdView id() const { return IdView{scope(), key()}; }
  bool is(const IdView& other, std::size_t other_hash) const {
    return hash == other_hash && id() == other;
  }
};

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

// The table: shards of owners and pollers, at most one per (scope, key).
class OwnerTable {
 public:
  OwnerTable() : shards_(std::make_unique<OwnerShard[]>(kOwnerShards)) {}

  // The in-process owner (or poller) of the key other than `self`, counted as a waiter so
  // that it publishes its outcome.
  std::shared_ptr<InFlight> find(const IdView& id, std::size_t hash, const InFlight* self) const;

  // Lists a poller unless somebody is listed for the key already.
  bool add_poller(const std::shared_ptr<InFlight>& poller) const;

  // Lists an owner. An earlier owner that released a moment ago, or this call's own
  // poller, may still be listed: the new owner takes its place.
  void add_owner(const std::shared_ptr<InFlight>& owner) const;

  // Takes the owner off the table and hands its outcome to the duplicates waiting on it.
  void finish(InFlight& owner, OwnerState state, const std::string* payload) const noexcept;

  // Owners and pollers in the table.
  std::size_t listed() const noexcept;

  // Everybody listed.
  std::vector<std::shared_ptr<InFlight>> snapshot() const;

 private:
  OwnerShard& shard(std::size_t hash) const {
    return shards_[(hash ^ (hash >> 32)) & (kOwnerShards - 1)];
  }

  std::unique_ptr<OwnerShard[]> shards_;
};

// Executor::watch's part in memory: `changed` runs when `owner` (found in the table, so
// counted as a waiter) finishes, or at once if it has already. Ends the count when
// destroyed.
std::unique_ptr<RecordWatch> watch_owner(std::shared_ptr<InFlight> owner,
                                         std::function<void()> changed);

}  // namespace idem::detail
