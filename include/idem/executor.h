#pragma once

// The executor runs an action at most once per (scope, key) on a store (SPEC §5, §7).
//
//   idem::Executor exec(idem::open_store("sqlite:///var/lib/app/idem.db"));
//   auto r = exec.run<std::string>("payments", request_id, [&](const idem::Attempt& a) {
//     return charge(card, amount, /*fencing token*/ a.token());
//   });
//   if (r.replayed) { ... }  // a duplicate: the first run's result, the action did not run
//
// It knows nothing of any particular store.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "idem/codec.h"
#include "idem/error.h"
#include "idem/store.h"
#include "idem/types.h"

namespace idem {

using namespace std::chrono_literals;

// What a duplicate does when it finds the key held by a live lease.
struct WaitPolicy {
  // How long to wait in total for the owner to finish. 0: fail at once with InProgress.
  Duration max_wait{0};
  // First pause between polls of the store; doubles up to max_backoff, with jitter.
  // Never sleeps past the owner's lease deadline.
  Duration initial_backoff{10};
  Duration max_backoff{1000};
};

struct ExecutorOptions {
  // How long a lease lasts without a heartbeat.
  Duration lease = 30s;
  // How often the heartbeat extends a lease. 0: lease / 3.
  Duration heartbeat = Duration{0};
  // How long a completed result is replayed (retention).
  Duration ttl = 24h;
  // What a duplicate does when the key is busy. Default: fail at once.
  WaitPolicy wait{};
  // The largest encoded result the executor stores; larger results are refused with
  // PayloadTooLarge and the record is released. At most kMaxPayloadBytes.
  std::size_t max_payload = kDefaultMaxPayloadBytes;
  // Called from the heartbeat thread when an extend fails with an error (the lease is
  // kept until the local view of its deadline passes). Must not throw. Null: ignored.
  std::function<void(const std::exception&)> on_heartbeat_error{};
};

// Per-call overrides of ExecutorOptions; unset fields take the executor's values.
struct CallOptions {
  std::optional<Duration> lease{};
  std::optional<Duration> heartbeat{};
  std::optional<Duration> ttl{};
  std::optional<WaitPolicy> wait{};
  // A digest of the request. When both the stored record and the call carry one and they
  // differ, run throws KeyReuse instead of replaying or waiting.
  std::optional<std::string> fingerprint{};
};

// What the action sees of its lease.
class Attempt {
 public:
  Attempt(Token token, std::uint32_t number, bool stolen, std::stop_token stop)
      : token_(token), number_(number), stolen_(stolen), stop_(std::move(stop)) {}

  // The lease token: hand it to downstream systems as a fencing token.
  Token token() const noexcept { return token_; }
  // 1 on the first acquisition of the key, +1 each time an abandoned lease was stolen.
  std::uint32_t number() const noexcept { return number_; }
  // Whether this attempt took over the abandoned lease of an earlier one.
  bool stolen() const noexcept { return stolen_; }
  // Requested when the lease is lost (fenced by the store, or the heartbeat could not
  // reach the store before the lease deadline). Stop work as soon as it is convenient.
  std::stop_token stop_token() const noexcept { return stop_; }
  bool lease_lost() const noexcept { return stop_.stop_requested(); }

 private:
  Token token_;
  std::uint32_t number_;
  bool stolen_;
  std::stop_token stop_;
};

template <typename T>
struct Result {
  T value;
  // True when the value is a stored result of an earlier run and the action did not run.
  bool replayed = false;
};

class Executor {
 public:
  explicit Executor(std::shared_ptr<Store> store, ExecutorOptions options = {});
  // Stops the heartbeat thread. REQUIRES: no run() in flight.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs `action(const Attempt&)` at most once per (scope, key) and returns its result, or
  // the stored result of the run that completed first. Throws InvalidArgument, InProgress,
  // KeyReuse, LeaseLost, StoreUnavailable (SPEC §11), or the action's own exception
  // unchanged after releasing the record.
  template <typename T, typename F>
  Result<T> run(std::string_view scope, std::string_view key, F&& action,
                const CallOptions& call = {}) {
    static_assert(std::is_invocable_r_v<T, F&, const Attempt&>,
                  "the action must be callable as T(const idem::Attempt&)");
    if constexpr (std::is_same_v<T, std::string>) {
      // Bytes need no codec; moving them saves two copies on every call.
      return run_bytes(
          scope, key, [&action](const Attempt& attempt) -> std::string { return action(attempt); },
          call);
    } else {
      BytesResult r = run_bytes(
          scope, key,
          [&action](const Attempt& attempt) { return Codec<T>::encode(action(attempt)); }, call);
      return Result<T>{Codec<T>::decode(r.value), r.replayed};
    }
  }

  // run for an action returning std::string (bytes).
  template <typename F>
  Result<std::string> run(std::string_view scope, std::string_view key, F&& action,
                          const CallOptions& call = {}) {
    return run<std::string>(scope, key, std::forward<F>(action), call);
  }

  using BytesResult = Result<std::string>;
  using BytesAction = std::function<std::string(const Attempt&)>;

  // The untyped core of run: the action returns the bytes to store.
  BytesResult run_bytes(std::string_view scope, std::string_view key, const BytesAction& action,
                        const CallOptions& call = {});

  Store& store() const noexcept;
  const ExecutorOptions& options() const noexcept;

  // How many leases the heartbeat currently keeps alive (for tests and metrics).
  std::size_t active_leases() const;
  // How many duplicates are waiting in memory on a call of this executor that holds their
  // key (for tests and metrics).
  std::size_t waiting_duplicates() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
