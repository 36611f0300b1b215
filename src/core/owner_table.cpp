#include "core/owner_table.h"

namespace idem::detail {

std::shared_ptr<InFlight> OwnerTable::find(const IdView& id, std::size_t hash,
                                           const InFlight* self) const {
  OwnerShard& s = shard(hash);
  if (s.count.load(std::memory_order_acquire) == 0) return nullptr;
  std::lock_guard lock(s.mu);
  auto* found = s.find(id, hash);
  if (found == nullptr || found->get() == self) return nullptr;
  (*found)->waiters.fetch_add(1, std::memory_order_relaxed);
  return *found;
}

bool OwnerTable::add_poller(const std::shared_ptr<InFlight>& poller) const {
  OwnerShard& s = shard(poller->hash);
  std::lock_guard lock(s.mu);
  if (s.find(poller->id(), poller->hash) != nullptr) return false;
  s.owners.push_back(poller);
  s.count.fetch_add(1, std::memory_order_release);
  return true;
}

void OwnerTable::add_owner(const std::shared_ptr<InFlight>& owner) const {
  OwnerShard& s = shard(owner->hash);
  // The entry replaced is dropped after the lock.
  std::shared_ptr<InFlight> replaced = owner;
  std::lock_guard lock(s.mu);
  if (auto* found = s.find(owner->id(), owner->hash)) {
    found->swap(replaced);
  } else {
    s.owners.push_back(std::move(replaced));
    s.count.fetch_add(1, std::memory_order_release);
  }
}

void OwnerTable::finish(InFlight& owner, OwnerState state,
                        const std::string* payload) const noexcept {
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
    for (const auto& changed : owner.wakers) changed();
  }
}

std::size_t OwnerTable::listed() const noexcept {
  std::size_t n = 0;
  for (std::size_t i = 0; i < kOwnerShards; ++i) {
    n += shards_[i].count.load(std::memory_order_acquire);
  }
  return n;
}

std::vector<std::shared_ptr<InFlight>> OwnerTable::snapshot() const {
  std::vector<std::shared_ptr<InFlight>> all;
  for (std::size_t i = 0; i < kOwnerShards; ++i) {
    OwnerShard& s = shards_[i];
    if (s.count.load(std::memory_order_acquire) == 0) continue;
    std::lock_guard lock(s.mu);
    all.insert(all.end(), s.owners.begin(), s.owners.end());
  }
  return all;
}

namespace {

class OwnerWatch final : public RecordWatch {
 public:
  OwnerWatch(std::shared_ptr<InFlight> owner, std::function<void()> changed)
      : owner_(std::move(owner)) {
    std::unique_lock lock(owner_->mu);
    if (owner_->state == OwnerState::kRunning) {
      listed_ = owner_->wakers.insert(owner_->wakers.end(), std::move(changed));
      return;
    }
    // It finished between the caller's last look and this watch: tell at once.
    lock.unlock();
    changed();
  }
  ~OwnerWatch() override {
    {
      std::lock_guard lock(owner_->mu);
      if (listed_) owner_->wakers.erase(*listed_);
    }
    owner_->waiters.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  std::shared_ptr<InFlight> owner_;
  std::optional<std::list<std::function<void()>>::iterator> listed_;
};

}  // namespace

std::unique_ptr<RecordWatch> watch_owner(std::shared_ptr<InFlight> owner,
                                         std::function<void()> changed) {
  return std::make_unique<OwnerWatch>(std::move(owner), std::move(changed));
}

}  // namespace idem::detail
