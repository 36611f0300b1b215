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
    case Op::kExtendMany:
      return "extend_many";
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

void FaultStore::lose_reply_next(Op op, int n) {
  std::lock_guard lock(mu_);
  ops_[index(op)].lose_next = n;
}

void FaultStore::lose_reply_always(Op op, bool on) {
  std::lock_guard lock(mu_);
  ops_[index(op)].lose_always = on;
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
  // A batch's extends are counted one by one under kExtend, not again as the batch.
  std::size_t n = 0;
  for (const OpState& s : ops_) n += s.calls;
  return n - ops_[index(Op::kExtendMany)].calls;
}

std::size_t FaultStore::blocked(Op op) const {
  std::lock_guard lock(mu_);
  return ops_[index(op)].blocked;
}

std::size_t FaultStore::failed(Op op) const {
  std::lock_guard lock(mu_);
  return ops_[index(op)].failed;
}

std::size_t FaultStore::lost_replies(Op op) const {
  std::lock_guard lock(mu_);
  return ops_[index(op)].lost;
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
    ++s.failed;
    throw StoreUnavailable(describe(), std::string("injected fault in ") + to_string(op));
  }
}

void FaultStore::leave(Op op) {
  std::lock_guard lock(mu_);
  OpState& s = ops_[index(op)];
  if (s.lose_always || s.lose_next > 0) {
    if (s.lose_next > 0) --s.lose_next;
    ++s.lost;
    throw StoreUnavailable(describe(), std::string("injected lost reply of ") + to_string(op) +
                                           " (the call took effect)");
  }
}

AcquireResult FaultStore::do_acquire(std::string_view scope, std::string_view key, Duration lease,
                                     Duration ttl, std::optional<std::string_view> fingerprint) {
  return forward(Op::kAcquire,
                 [&] { return StoreWrapper::do_acquire(scope, key, lease, ttl, fingerprint); });
}

WriteResult FaultStore::do_complete(std::string_view scope, std::string_view key, Token token,
                                    std::string_view payload, Duration ttl) {
  return forward(Op::kComplete,
                 [&] { return StoreWrapper::do_complete(scope, key, token, payload, ttl); });
}

WriteResult FaultStore::do_release(std::string_view scope, std::string_view key, Token token) {
  return forward(Op::kRelease, [&] { return StoreWrapper::do_release(scope, key, token); });
}

ExtendResult FaultStore::do_extend(std::string_view scope, std::string_view key, Token token,
                                   Duration lease) {
  return forward(Op::kExtend, [&] { return StoreWrapper::do_extend(scope, key, token, lease); });
}

std::vector<ExtendResult> FaultStore::do_extend_many(std::span<const ExtendRequest> requests) {
  return forward(Op::kExtendMany, [&] { return Store::do_extend_many(requests); });
}

std::size_t FaultStore::do_purge(std::size_t limit) {
  return forward(Op::kPurge, [&] { return StoreWrapper::do_purge(limit); });
}

std::optional<Record> FaultStore::do_get(std::string_view scope, std::string_view key) {
  return forward(Op::kGet, [&] { return StoreWrapper::do_get(scope, key); });
}

bool FaultStore::do_forget(std::string_view scope, std::string_view key) {
  return forward(Op::kForget, [&] { return StoreWrapper::do_forget(scope, key); });
}

}  // namespace idem::testing
