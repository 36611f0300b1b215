#include "idem/testing/fault_store.h"

#include <string>
#include <utility>

#include "idem/error.h"

namespace idem::testing {

const char* to_string(Op op) {
  switch (op) {
    case Op::kAcquire:
      return "acquire";
    case Op::kComplete:
      return "complete";
    case Op::kRelease:
      return "release";
    case Op::kExtend:
      return "extend";
    case Op::kPurge:
      return "purge";
    case Op::kGet:
      return "get";
    case Op::kForget:
      return "forget";
  }
  return "unknown";
}

namespace {
std::size_t index(Op op) { return static_cast<std::size_t>(op); }
}  // namespace

FaultStore::FaultStore(std::shared_ptr<Store> target) : StoreWrapper(std::move(target)) {}

void FaultStore::fail_next(Op op, int n) {
  std::lock_guard lock(mu_);
  ops_[index(op)].fail_next = n;
}

void FaultStore::fail_always(Op op, bool on) {
  std::lock_guard lock(mu_);
  ops_[index(op)].fail_always = on;
}

void FaultStore::pause(Op op) {
  std::lock_guard lock(mu_);
  ops_[index(op)].paused = true;
}

void FaultStore::resume(Op op) {
  {
    std::lock_guard lock(mu_);
    ops_[index(op)].paused = false;
  }
  cv_.notify_all();
}

std::size_t FaultStore::calls(Op op) const {
  std::lock_guard lock(mu_);
  return ops_[index(op)].calls;
}

std::size_t FaultStore::total_calls() const {
  std::lock_guard lock(mu_);
  std::size_t n = 0;
  for (const OpState& s : ops_) n += s.calls;
  return n;
}

std::size_t FaultStore::blocked(Op op) const {
  std::lock_guard lock(mu_);
  return ops_[index(op)].blocked;
}

bool FaultStore::wait_for_calls(Op op, std::size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return ops_[index(op)].calls >= n; });
}

bool FaultStore::wait_for_blocked(Op op, std::size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return ops_[index(op)].blocked >= n; });
}

void FaultStore::enter(Op op) {
  std::unique_lock lock(mu_);
  OpState& s = ops_[index(op)];
  ++s.calls;
  cv_.notify_all();
  if (s.paused) {
    ++s.blocked;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !s.paused; });
    --s.blocked;
  }
  if (s.fail_always || s.fail_next > 0) {
    if (s.fail_next > 0) --s.fail_next;
    throw StoreUnavailable(describe(), std::string("injected fault in ") + to_string(op));
  }
}

AcquireResult FaultStore::do_acquire(std::string_view scope, std::string_view key, Duration lease,
                                     Duration ttl, std::optional<std::string_view> fingerprint) {
  enter(Op::kAcquire);
  return StoreWrapper::do_acquire(scope, key, lease, ttl, fingerprint);
}

WriteResult FaultStore::do_complete(std::string_view scope, std::string_view key, Token token,
                                    std::string_view payload, Duration ttl) {
  enter(Op::kComplete);
  return StoreWrapper::do_complete(scope, key, token, payload, ttl);
}

WriteResult FaultStore::do_release(std::string_view scope, std::string_view key, Token token) {
  enter(Op::kRelease);
  return StoreWrapper::do_release(scope, key, token);
}

ExtendResult FaultStore::do_extend(std::string_view scope, std::string_view key, Token token,
                                   Duration lease) {
  enter(Op::kExtend);
  return StoreWrapper::do_extend(scope, key, token, lease);
}

std::vector<ExtendResult> FaultStore::do_extend_many(std::span<const ExtendRequest> requests) {
  return Store::do_extend_many(requests);
}

std::size_t FaultStore::do_purge(std::size_t limit) {
  enter(Op::kPurge);
  return StoreWrapper::do_purge(limit);
}

std::optional<Record> FaultStore::do_get(std::string_view scope, std::string_view key) {
  enter(Op::kGet);
  return StoreWrapper::do_get(scope, key);
}

bool FaultStore::do_forget(std::string_view scope, std::string_view key) {
  enter(Op::kForget);
  return StoreWrapper::do_forget(scope, key);
}

}  // namespace idem::testing
