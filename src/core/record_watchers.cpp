#include "core/record_watchers.h"

#include <utility>

namespace idem::detail {

std::uint64_t stable_record_hash(std::string_view scope, std::string_view key) noexcept {
  std::uint64_t h = 14695981039346656037ULL;
  const auto mix = [&h](unsigned char byte) {
    h ^= byte;
    h *= 1099511628211ULL;
  };
  // The scope's length first, so ("a:b", "c") and ("a", "b:c") differ.
  for (std::size_t n = scope.size(), i = 0; i < sizeof n; ++i, n >>= 8) {
    mix(static_cast<unsigned char>(n & 0xff));
  }
  for (char c : scope) mix(static_cast<unsigned char>(c));
  for (char c : key) mix(static_cast<unsigned char>(c));
  return h;
}

class RecordWatchers::Watch final : public RecordWatch {
 public:
  Watch(std::shared_ptr<Shared> shared, Entries::iterator entry)
      : shared_(std::move(shared)), entry_(entry) {}
  ~Watch() override {
    std::lock_guard lock(shared_->mu);
    shared_->entries.erase(entry_);
    if (shared_->entries.empty() && shared_->on_last) shared_->on_last();
  }

 private:
  std::shared_ptr<Shared> shared_;
  Entries::iterator entry_;
};

RecordWatchers::RecordWatchers(std::function<void()> on_first, std::function<void()> on_last)
    : shared_(std::make_shared<Shared>()) {
  shared_->on_first = std::move(on_first);
  shared_->on_last = std::move(on_last);
}

RecordWatchers::~RecordWatchers() {
  // Watches still alive end quietly: the store that would call the hooks is going away.
  std::lock_guard lock(shared_->mu);
  shared_->on_first = nullptr;
  shared_->on_last = nullptr;
}

std::unique_ptr<RecordWatch> RecordWatchers::add(std::uint64_t hash,
                                                 std::function<void()> changed) {
  std::lock_guard lock(shared_->mu);
  if (shared_->entries.empty() && shared_->on_first) shared_->on_first();
  auto entry = shared_->entries.emplace(hash, std::move(changed));
  return std::make_unique<Watch>(shared_, entry);
}

void RecordWatchers::notify_if(const std::function<bool(std::uint64_t hash)>& concerns) {
  std::lock_guard lock(shared_->mu);
  for (auto& [hash, changed] : shared_->entries) {
    if (concerns(hash)) changed();
  }
}

void RecordWatchers::notify(std::uint64_t hash) {
  std::lock_guard lock(shared_->mu);
  const auto [first, last] = shared_->entries.equal_range(hash);
  for (auto it = first; it != last; ++it) it->second();
}

void RecordWatchers::notify_all() {
  std::lock_guard lock(shared_->mu);
  for (auto& entry : shared_->entries) entry.second();
}

std::size_t RecordWatchers::size() const {
  std::lock_guard lock(shared_->mu);
  return shared_->entries.size();
}

}  // namespace idem::detail
