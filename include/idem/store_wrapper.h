#pragma once

// A Store that forwards every call to another one (leveldb's EnvWrapper). Override one
// method to inject faults in tests or to add metrics, and leave the rest alone.
//
// do_extend_many forwards the whole batch to the wrapped store, so a wrapper that overrides
// do_extend to observe or change extends should also override do_extend_many, for example
// with `return Store::do_extend_many(requests);`, which calls do_extend once per request.

#include <memory>
#include <utility>

#include "idem/store.h"

namespace idem {

class StoreWrapper : public Store {
 public:
  explicit StoreWrapper(std::shared_ptr<Store> target) : target_(std::move(target)) {}

  Store& target() const { return *target_; }
  std::string describe() const override { return target_->describe(); }
  // The wrapped store's own steps: a caller's transaction is not wrapped.
  TransactionalStore* transactions() noexcept override { return target_->transactions(); }

 protected:
  AcquireResult do_acquire(std::string_view scope, std::string_view key, Duration lease,
                           Duration ttl, std::optional<std::string_view> fingerprint) override {
    return target_->do_acquire(scope, key, lease, ttl, fingerprint);
  }
  WriteResult do_complete(std::string_view scope, std::string_view key, Token token,
                          std::string_view payload, Duration ttl) override {
    return target_->do_complete(scope, key, token, payload, ttl);
  }
  WriteResult do_release(std::string_view scope, std::string_view key, Token token) override {
    return target_->do_release(scope, key, token);
  }
  ExtendResult do_extend(std::string_view scope, std::string_view key, Token token,
                         Duration lease) override {
    return target_->do_extend(scope, key, token, lease);
  }
  std::vector<ExtendResult> do_extend_many(std::span<const ExtendRequest> requests) override {
    return target_->do_extend_many(requests);
  }
  std::size_t do_purge(std::size_t limit) override { return target_->do_purge(limit); }
  std::optional<Record> do_get(std::string_view scope, std::string_view key) override {
    return target_->do_get(scope, key);
  }
  bool do_forget(std::string_view scope, std::string_view key) override {
    return target_->do_forget(scope, key);
  }
  std::unique_ptr<RecordWatch> do_watch(std::string_view scope, std::string_view key,
                                        std::function<void()> changed) override {
    return target_->do_watch(scope, key, std::move(changed));
  }

 private:
  std::shared_ptr<Store> target_;
};

}  // namespace idem
