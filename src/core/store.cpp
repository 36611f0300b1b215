#include "idem/store.h"

#include <string>

#include "idem/error.h"

namespace idem {

void validate_scope(std::string_view scope) {
  if (scope.empty() || scope.size() > kMaxScopeBytes) {
    throw InvalidArgument("scope", "must be 1 to " + std::to_string(kMaxScopeBytes) +
                                       " bytes, got " + std::to_string(scope.size()));
  }
}

void validate_key(std::string_view key) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    throw InvalidArgument("key", "must be 1 to " + std::to_string(kMaxKeyBytes) + " bytes, got " +
                                     std::to_string(key.size()));
  }
}

void validate_duration(std::string_view name, Duration d) {
  if (d <= Duration::zero()) {
    throw InvalidArgument(std::string(name),
                          "must be positive, got " + std::to_string(d.count()) + " ms");
  }
  if (d > kMaxDuration) {
    throw InvalidArgument(std::string(name),
                          "must be at most 365 days, got " + std::to_string(d.count()) + " ms");
  }
}

void validate_payload_size(std::size_t size, std::size_t limit) {
  if (size > limit) throw PayloadTooLarge(size, limit);
}

AcquireResult Store::acquire(std::string_view scope, std::string_view key, Duration lease,
                             Duration ttl, std::optional<std::string_view> fingerprint) {
  validate_scope(scope);
  validate_key(key);
  validate_duration("lease duration", lease);
  validate_duration("ttl", ttl);
  return do_acquire(scope, key, lease, ttl, fingerprint);
}

WriteResult Store::complete(std::string_view scope, std::string_view key, Token token,
                            std::string_view payload, Duration ttl) {
  validate_scope(scope);
  validate_key(key);
  validate_payload_size(payload.size(), kMaxPayloadBytes);
  validate_duration("ttl", ttl);
  return do_complete(scope, key, token, payload, ttl);
}

WriteResult Store::release(std::string_view scope, std::string_view key, Token token) {
  validate_scope(scope);
  validate_key(key);
  return do_release(scope, key, token);
}

ExtendResult Store::extend(std::string_view scope, std::string_view key, Token token,
                           Duration lease) {
  validate_scope(scope);
  validate_key(key);
  validate_duration("lease duration", lease);
  return do_extend(scope, key, token, lease);
}

std::vector<ExtendResult> Store::extend_many(std::span<const ExtendRequest> requests) {
  for (const ExtendRequest& r : requests) {
    validate_scope(r.scope);
    validate_key(r.key);
    validate_duration("lease duration", r.lease);
  }
  if (requests.empty()) return {};
  std::vector<ExtendResult> results = do_extend_many(requests);
  if (results.size() != requests.size()) {
    throw StoreUnavailable(describe(), "extend_many returned " + std::to_string(results.size()) +
                                           " results for " + std::to_string(requests.size()) +
                                           " requests");
  }
  return results;
}

std::vector<ExtendResult> Store::do_extend_many(std::span<const ExtendRequest> requests) {
  std::vector<ExtendResult> results;
  results.reserve(requests.size());
  for (const ExtendRequest& r : requests) {
    results.push_back(do_extend(r.scope, r.key, r.token, r.lease));
  }
  return results;
}

std::size_t Store::purge(std::size_t limit) {
  if (limit == 0) throw InvalidArgument("purge limit", "must be at least 1");
  return do_purge(limit);
}

std::optional<Record> Store::get(std::string_view scope, std::string_view key) {
  validate_scope(scope);
  validate_key(key);
  return do_get(scope, key);
}

bool Store::forget(std::string_view scope, std::string_view key) {
  validate_scope(scope);
  validate_key(key);
  return do_forget(scope, key);
}

std::unique_ptr<RecordWatch> Store::watch(std::string_view scope, std::string_view key,
                                          std::function<void()> changed) {
  validate_scope(scope);
  validate_key(key);
  if (!changed) throw InvalidArgument("watch callback", "must not be empty");
  return do_watch(scope, key, std::move(changed));
}

std::unique_ptr<RecordWatch> Store::do_watch(std::string_view /*scope*/, std::string_view /*key*/,
                                             std::function<void()> /*changed*/) {
  return nullptr;
}

}  // namespace idem
