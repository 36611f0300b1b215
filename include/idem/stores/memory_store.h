#pragma once

// The in-memory store: in-process, for tests and single-process use. Sharded, so threads
// working on different keys rarely contend on one lock. Time comes from an injectable clock.

#include <memory>

#include "idem/clock.h"
#include "idem/store.h"

namespace idem {

struct MemoryStoreOptions {
  // The clock expiry is judged by. Null: the system clock.
  std::shared_ptr<const Clock> clock;
  // Number of independently locked shards (rounded up to a power of two). 0: 64.
  std::size_t shards = 0;
};

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(MemoryStoreOptions options = {});
  ~MemoryStore() override;

  std::string describe() const override;
  // How many records are held, expired ones included.
  std::size_t size() const;

 protected:
  AcquireResult do_acquire(std::string_view scope, std::string_view key, Duration lease,
                           Duration ttl, std::optional<std::string_view> fingerprint) override;
  WriteResult do_complete(std::string_view scope, std::string_view key, Token token,
                          std::string_view payload, Duration ttl) override;
  WriteResult do_release(std::string_view scope, std::string_view key, Token token) override;
  ExtendResult do_extend(std::string_view scope, std::string_view key, Token token,
                         Duration lease) override;
  std::size_t do_purge(std::size_t limit) override;
  std::optional<Record> do_get(std::string_view scope, std::string_view key) override;
  bool do_forget(std::string_view scope, std::string_view key) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
