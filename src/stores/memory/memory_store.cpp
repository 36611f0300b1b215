#include "idem/stores/memory_store.h"

#include <atomic>
#include <bit>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/record_id.h"
#include "idem/error.h"
#include "stores/memory/memory_url.h"

namespace idem {
namespace {

struct Entry {
  RecordState state = RecordState::kInProgress;
  Token token = 0;
  std::uint32_t attempt = 1;
  Timestamp acquired_at{};
  Timestamp lease_expires_at{};
  Timestamp completed_at{};
  Timestamp expires_at{};
  std::string payload;
  std::optional<std::string> fingerprint;
};

struct Hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

struct Shard {
  std::mutex mu;
  std::unordered_map<std::string, Entry, Hash, std::equal_to<>> records;
};

std::optional<std::string> to_optional(std::optional<std::string_view> s) {
  if (!s) return std::nullopt;
  return std::string(*s);
}

// SPEC §4: purge deletes COMPLETE records past their TTL, and IN_PROGRESS records only when
// both their TTL and their lease have passed.
bool purgeable(const Entry& e, Timestamp now) {
  if (e.expires_at > now) return false;
  return e.state == RecordState::kComplete || e.lease_expires_at <= now;
}

}  // namespace

struct MemoryStore::Impl {
  std::shared_ptr<const Clock> clock;
  std::vector<Shard> shards;
  std::size_t mask = 0;
  std::atomic<Token> last_token{0};
  std::atomic<std::size_t> purge_cursor{0};

  explicit Impl(const MemoryStoreOptions& options)
      : clock(options.clock ? options.clock : SystemClock::instance()),
        shards(std::bit_ceil(options.shards == 0 ? std::size_t{64} : options.shards)),
        mask(shards.size() - 1) {}

  // Looks the id up and locks its shard; `id` is a per-thread buffer, so no allocation on
  // the hot path for keys already present.
  struct Locked {
    std::unique_lock<std::mutex> lock;
    Shard& shard;
    const std::string& id;
  };
  Locked lock(std::string_view scope, std::string_view key) {
    thread_local std::string id;
    detail::encode_record_id(id, scope, key);
    Shard& shard = shards[Hash{}(id)&mask];
    return Locked{std::unique_lock(shard.mu), shard, id};
  }

  Token next_token() { return last_token.fetch_add(1, std::memory_order_relaxed) + 1; }
};

MemoryStore::MemoryStore(MemoryStoreOptions options) : impl_(std::make_unique<Impl>(options)) {}

MemoryStore::~MemoryStore() = default;

std::string MemoryStore::describe() const { return "memory:"; }

std::size_t MemoryStore::size() const {
  std::size_t n = 0;
  for (Shard& shard : impl_->shards) {
    std::lock_guard lock(shard.mu);
    n += shard.records.size();
  }
  return n;
}

AcquireResult MemoryStore::do_acquire(std::string_view scope, std::string_view key, Duration lease,
                                      Duration ttl, std::optional<std::string_view> fingerprint) {
  auto [lock, shard, id] = impl_->lock(scope, key);
  const Timestamp now = impl_->clock->now();
  auto it = shard.records.find(std::string_view(id));
  bool stolen = false;
  std::uint32_t attempt = 1;
  if (it != shard.records.end()) {
    Entry& e = it->second;
    if (e.state == RecordState::kComplete) {
      if (e.expires_at > now) {
        return Replay{e.payload, e.completed_at, e.expires_at, e.fingerprint};
      }
      // SPEC §4: an expired COMPLETE is replaced as if absent.
    } else if (e.lease_expires_at > now) {
      return Busy{e.lease_expires_at, e.lease_expires_at - now, e.fingerprint};
    } else {
      stolen = true;
      attempt = e.attempt + 1;
    }
  } else {
    it = shard.records.emplace(id, Entry{}).first;
  }
  Entry& e = it->second;
  e = Entry{};
  e.state = RecordState::kInProgress;
  e.token = impl_->next_token();
  e.attempt = attempt;
  e.acquired_at = now;
  e.lease_expires_at = now + lease;
  e.expires_at = now + ttl;
  e.fingerprint = to_optional(fingerprint);
  return Acquired{Lease{e.token, now, e.lease_expires_at, e.expires_at, lease, attempt}, stolen};
}

WriteResult MemoryStore::do_complete(std::string_view scope, std::string_view key, Token token,
                                     std::string_view payload, Duration ttl) {
  auto [lock, shard, id] = impl_->lock(scope, key);
  auto it = shard.records.find(std::string_view(id));
  if (it == shard.records.end() || it->second.token != token) return WriteResult::kFenced;
  Entry& e = it->second;
  // SPEC §4: a complete repeated with the completing token succeeds and changes nothing.
  if (e.state == RecordState::kComplete) return WriteResult::kDone;
  const Timestamp now = impl_->clock->now();
  e.state = RecordState::kComplete;
  e.payload.assign(payload);
  e.completed_at = now;
  e.expires_at = now + ttl;
  e.acquired_at = {};
  e.lease_expires_at = {};
  return WriteResult::kDone;
}

WriteResult MemoryStore::do_release(std::string_view scope, std::string_view key, Token token) {
  auto [lock, shard, id] = impl_->lock(scope, key);
  auto it = shard.records.find(std::string_view(id));
  if (it == shard.records.end() || it->second.token != token ||
      it->second.state != RecordState::kInProgress) {
    return WriteResult::kFenced;
  }
  shard.records.erase(it);
  return WriteResult::kDone;
}

ExtendResult MemoryStore::do_extend(std::string_view scope, std::string_view key, Token token,
                                    Duration lease) {
  auto [lock, shard, id] = impl_->lock(scope, key);
  auto it = shard.records.find(std::string_view(id));
  if (it == shard.records.end() || it->second.token != token ||
      it->second.state != RecordState::kInProgress) {
    return ExtendResult{};
  }
  const Timestamp now = impl_->clock->now();
  it->second.lease_expires_at = now + lease;
  return ExtendResult{WriteResult::kDone, it->second.lease_expires_at, lease};
}

std::size_t MemoryStore::do_purge(std::size_t limit) {
  const Timestamp now = impl_->clock->now();
  std::size_t deleted = 0;
  const std::size_t n = impl_->shards.size();
  // Start where the last pass stopped so a small limit still reaches every shard in turn.
  const std::size_t start = impl_->purge_cursor.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < n && deleted < limit; ++i) {
    const std::size_t s = (start + i) & impl_->mask;
    Shard& shard = impl_->shards[s];
    std::lock_guard lock(shard.mu);
    for (auto it = shard.records.begin(); it != shard.records.end() && deleted < limit;) {
      if (purgeable(it->second, now)) {
        it = shard.records.erase(it);
        ++deleted;
      } else {
        ++it;
      }
    }
    if (deleted >= limit) impl_->purge_cursor.store(s, std::memory_order_relaxed);
  }
  return deleted;
}

std::optional<Record> MemoryStore::do_get(std::string_view scope, std::string_view key) {
  auto [lock, shard, id] = impl_->lock(scope, key);
  auto it = shard.records.find(std::string_view(id));
  if (it == shard.records.end()) return std::nullopt;
  const Entry& e = it->second;
  Record r;
  r.state = e.state;
  r.token = e.token;
  r.attempt = e.attempt;
  r.acquired_at = e.acquired_at;
  r.lease_expires_at = e.lease_expires_at;
  r.completed_at = e.completed_at;
  r.expires_at = e.expires_at;
  r.payload = e.payload;
  r.fingerprint = e.fingerprint;
  r.now = impl_->clock->now();
  return r;
}

bool MemoryStore::do_forget(std::string_view scope, std::string_view key) {
  auto [lock, shard, id] = impl_->lock(scope, key);
  auto it = shard.records.find(std::string_view(id));
  if (it == shard.records.end()) return false;
  shard.records.erase(it);
  return true;
}

namespace detail {
std::shared_ptr<Store> open_memory_store(const Url& url, const OpenOptions& options) {
  if (url.has_authority || !url.path.empty() || !url.query.empty()) {
    throw InvalidArgument("store URL", "'memory:' takes no host, path or parameters");
  }
  return std::make_shared<MemoryStore>(MemoryStoreOptions{.clock = options.clock});
}
}  // namespace detail

}  // namespace idem
