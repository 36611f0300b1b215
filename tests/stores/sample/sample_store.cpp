// The sample store (tests only): every record in one ordered map under one mutex, time by
// the caller's clock (OpenOptions::clock) or the system clock. The smallest store that keeps
// the contract (SPEC §3–§8), opened as "sample:"; a template for a new store's shape, not
// for its speed.

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/store.h"
#include "stores/sample/sample_url.h"

namespace idem {
namespace {

class SampleStore final : public Store {
 public:
  explicit SampleStore(std::shared_ptr<const Clock> clock)
      : clock_(clock ? std::move(clock) : SystemClock::instance()) {}

  std::string describe() const override { return "sample:"; }

 protected:
  AcquireResult do_acquire(std::string_view scope, std::string_view key, Duration lease,
                           Duration ttl, std::optional<std::string_view> fingerprint) override {
    std::lock_guard lock(mu_);
    const Timestamp now = clock_->now();
    Record& r = records_[Id{scope, key}];
    const bool fresh = r.token == 0;
    const bool live =
        r.state == RecordState::kComplete ? r.expires_at > now : r.lease_expires_at > now;
    if (!fresh && live && r.state == RecordState::kComplete) {
      return Replay{r.payload, r.completed_at, r.expires_at, r.fingerprint};
    }
    if (!fresh && live) return Busy{r.lease_expires_at, r.lease_expires_at - now, r.fingerprint};
    // SPEC §4: an expired COMPLETE is replaced as if absent; an expired lease is stolen.
    const bool stolen = !fresh && r.state == RecordState::kInProgress;
    const std::uint32_t attempt = stolen ? r.attempt + 1 : 1;
    r = Record{};
    r.token = ++last_token_;
    r.attempt = attempt;
    r.acquired_at = now;
    r.lease_expires_at = now + lease;
    r.expires_at = now + ttl;
    if (fingerprint) r.fingerprint = std::string(*fingerprint);
    return Acquired{Lease{r.token, now, r.lease_expires_at, r.expires_at, lease, attempt}, stolen};
  }

  WriteResult do_complete(std::string_view scope, std::string_view key, Token token,
                          std::string_view payload, Duration ttl) override {
    std::lock_guard lock(mu_);
    auto it = records_.find(Id{scope, key});
    if (it == records_.end() || it->second.token != token) return WriteResult::kFenced;
    Record& r = it->second;
    if (r.state == RecordState::kComplete) return WriteResult::kDone;  // a repeated complete
    const Timestamp now = clock_->now();
    r.state = RecordState::kComplete;
    r.acquired_at = {};
    r.lease_expires_at = {};
    r.completed_at = now;
    r.expires_at = now + ttl;
    r.payload = payload;
    return WriteResult::kDone;
  }

  WriteResult do_release(std::string_view scope, std::string_view key, Token token) override {
    std::lock_guard lock(mu_);
    if (owned(scope, key, token) == nullptr) return WriteResult::kFenced;
    records_.erase(Id{scope, key});
    return WriteResult::kDone;
  }

  ExtendResult do_extend(std::string_view scope, std::string_view key, Token token,
                         Duration lease) override {
    std::lock_guard lock(mu_);
    Record* r = owned(scope, key, token);
    if (r == nullptr) return ExtendResult{};
    r->lease_expires_at = clock_->now() + lease;
    return ExtendResult{WriteResult::kDone, r->lease_expires_at, lease};
  }

  std::size_t do_purge(std::size_t limit) override {
    std::lock_guard lock(mu_);
    const Timestamp now = clock_->now();
    std::size_t deleted = 0;
    for (auto it = records_.begin(); it != records_.end() && deleted < limit;) {
      const Record& r = it->second;
      // SPEC §4: past its TTL, and for IN_PROGRESS past its lease too.
      const bool gone =
          r.expires_at <= now && (r.state == RecordState::kComplete || r.lease_expires_at <= now);
      it = gone ? records_.erase(it) : std::next(it);
      deleted += gone ? 1 : 0;
    }
    return deleted;
  }

  std::optional<Record> do_get(std::string_view scope, std::string_view key) override {
    std::lock_guard lock(mu_);
    auto it = records_.find(Id{scope, key});
    if (it == records_.end()) return std::nullopt;
    Record out = it->second;
    out.now = clock_->now();
    return out;
  }

  bool do_forget(std::string_view scope, std::string_view key) override {
    std::lock_guard lock(mu_);
    return records_.erase(Id{scope, key}) == 1;
  }

 private:
  using Id = std::pair<std::string, std::string>;  // (scope, key)

  // The live IN_PROGRESS record with `token` at (scope, key), or null.
  Record* owned(std::string_view scope, std::string_view key, Token token) {
    auto it = records_.find(Id{scope, key});
    if (it == records_.end() || it->second.token != token ||
        it->second.state != RecordState::kInProgress) {
      return nullptr;
    }
    return &it->second;
  }

  std::shared_ptr<const Clock> clock_;
  std::mutex mu_;
  std::map<Id, Record> records_;
  Token last_token_ = 0;
};

}  // namespace

std::shared_ptr<Store> detail::open_sample_store(const Url& url, const OpenOptions& options) {
  if (url.has_authority || !url.path.empty() || !url.query.empty()) {
    throw InvalidArgument("store URL", "'sample:' takes no host, path or parameters");
  }
  return std::make_shared<SampleStore>(options.clock);
}

}  // namespace idem
