// A deterministic simulation of the executor (issue 9): many executors over one in-memory
// store, as separate processes would share a store, driven step by step from one thread by
// a seeded schedule. Each schedule mixes callers (run and begin/complete/release),
// duplicates that poll, store errors before and after an operation takes effect (the fault
// wrapper), slow calls (the clock moves, or other processes act, while a call is on its
// way to the store), paused processes (an open lease that is neither extended nor ended
// while time passes), crashed processes (a lease never released), heartbeats, clock jumps
// past leases and TTLs, operator forgets and purges at random.
//
// Every store call is checked against a reference model of SPEC §4 (ModelStore), and every
// answer the executor gives against the promises of issue 9: a key is never completed
// twice, a stored result is never overwritten or lost before its TTL, a stale owner is
// always fenced (never reported done), a finished action is never reported lost while the
// record holds its result, the action never runs without a lease, and every failure is an
// idem::Error with a code the call may give.
//
// Determinism: one thread makes every decision and every call; the executors' heartbeat
// threads stay idle (their first beat is due tens of seconds of real time after a lease is
// taken, and a schedule lasts milliseconds), so heartbeats are steps of the schedule, sent
// through the owning process's store exactly as the heartbeat sends them. Waiting with a
// bound is modelled as repeated polls (max_wait 0) at chosen steps.
//
// IDEM_SIM_SEED=n replays schedule n alone with its trace; IDEM_SIM_SCHEDULES and
// IDEM_SIM_FIRST_SEED run other seeds. A failing seed prints the exact command.

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"
#include "idem/executor.h"
#include "idem/store_wrapper.h"
#include "idem/stores/memory_store.h"
#include "idem/testing/fault_store.h"
#include "idem/testing/matchers.h"  // gtest printers for the store results (ODR)

namespace {

using namespace std::chrono_literals;
using idem::Duration;
using idem::RecordState;
using idem::Timestamp;
using idem::Token;
using idem::WriteResult;
using idem::testing::FaultStore;
using idem::testing::Op;

constexpr std::string_view kScope = "sim";

// A broken promise; ends the schedule.
struct Violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The action's own exception, which run() must hand back unchanged.
struct ActionFailed : std::runtime_error {
  explicit ActionFailed(int n) : std::runtime_error("action failed"), serial(n) {}
  int serial;
};

std::string ms(Timestamp t) { return std::to_string(t.time_since_epoch().count()); }

// ---- the reference model of SPEC §4, checked on every call that reaches the store ----

struct ModelRecord {
  RecordState state = RecordState::kInProgress;
  Token token = 0;
  std::uint32_t attempt = 0;
  Timestamp lease_expires_at{};
  Timestamp completed_at{};
  Timestamp expires_at{};
  std::string payload;
};

class ModelStore final : public idem::StoreWrapper {
 public:
  ModelStore(std::shared_ptr<Store> target, std::shared_ptr<idem::ManualClock> clock)
      : StoreWrapper(std::move(target)), clock_(std::move(clock)) {}

  // The model's record for `key`, when the model says there is one.
  const ModelRecord* find(const std::string& key) const {
    auto it = recs_.find(key);
    return it == recs_.end() ? nullptr : &it->second;
  }
  // Whether (key, token) was ever completed, and every completion in order.
  struct Completion {
    Token token;
    std::string payload;
    Timestamp completed_at;
    Timestamp expires_at;
    std::uint64_t forgets_before;  // forgets of the key before this completion
  };
  const std::vector<Completion>& completions(const std::string& key) { return done_[key]; }
  std::uint64_t forgets(const std::string& key) { return forgets_[key]; }

  // The store and the model agree on every record.
  void reconcile(const std::vector<std::string>& keys) {
    std::lock_guard lock(mu_);
    for (const std::string& key : keys) {
      const auto got = target().get(kScope, key);
      const ModelRecord* m = find(key);
      if (!got && !m) continue;
      if (!got || !m) {
        fail("reconcile " + key + ": store has " + (got ? "a record" : "none") + ", model " +
             (m ? "a record" : "none"));
      }
      if (got->state != m->state || got->token != m->token ||
          (m->state == RecordState::kComplete &&
           (got->payload != m->payload || got->expires_at != m->expires_at)) ||
          (m->state == RecordState::kInProgress &&
           (got->lease_expires_at != m->lease_expires_at || got->expires_at != m->expires_at ||
            got->attempt != m->attempt))) {
        fail("reconcile " + key + ": store and model differ (store token " +
             std::to_string(got->token) + ", model token " + std::to_string(m->token) + ")");
      }
    }
  }

 protected:
  idem::AcquireResult do_acquire(std::string_view scope, std::string_view key, Duration lease,
                                 Duration ttl,
                                 std::optional<std::string_view> fingerprint) override {
    std::lock_guard lock(mu_);
    const Timestamp now = clock_->now();
    const std::string k(key);
    idem::AcquireResult r = StoreWrapper::do_acquire(scope, key, lease, ttl, fingerprint);
    ModelRecord* m = recs_.count(k) ? &recs_[k] : nullptr;
    const auto expect_acquired = [&](bool stolen, std::uint32_t attempt) {
      const auto* a = std::get_if<idem::Acquired>(&r);
      if (a == nullptr) fail("acquire " + k + ": expected Acquired");
      if (a->stolen != stolen || a->lease.attempt != attempt) {
        fail("acquire " + k + ": wrong stolen/attempt");
      }
      // SPEC §2: greater than every earlier token of the key (and, for this store, of
      // every key).
      if (a->lease.token <= last_token_) fail("acquire " + k + ": token did not increase");
      if (a->lease.lease_expires_at != now + lease || a->lease.expires_at != now + ttl) {
        fail("acquire " + k + ": wrong deadlines");
      }
      last_token_ = a->lease.token;
      recs_[k] = ModelRecord{
          RecordState::kInProgress, a->lease.token, attempt, now + lease, {}, now + ttl, {}};
    };
    if (m == nullptr || (m->state == RecordState::kComplete && m->expires_at <= now)) {
      expect_acquired(false, 1);
    } else if (m->state == RecordState::kInProgress && m->lease_expires_at <= now) {
      expect_acquired(true, m->attempt + 1);
    } else if (m->state == RecordState::kInProgress) {
      const auto* b = std::get_if<idem::Busy>(&r);
      if (b == nullptr || b->lease_expires_at != m->lease_expires_at) {
        fail("acquire " + k + ": expected Busy until " + ms(m->lease_expires_at));
      }
    } else {
      const auto* p = std::get_if<idem::Replay>(&r);
      if (p == nullptr || p->payload != m->payload || p->expires_at != m->expires_at) {
        fail("acquire " + k + ": expected Replay of " + m->payload);
      }
    }
    return r;
  }

  WriteResult do_complete(std::string_view scope, std::string_view key, Token token,
                          std::string_view payload, Duration ttl) override {
    std::lock_guard lock(mu_);
    const Timestamp now = clock_->now();
    const std::string k(key);
    const WriteResult r = StoreWrapper::do_complete(scope, key, token, payload, ttl);
    auto it = recs_.find(k);
    if (it == recs_.end() || it->second.token != token) {
      if (r != WriteResult::kFenced) fail("complete " + k + ": a stale token was not fenced");
      return r;
    }
    if (r != WriteResult::kDone) fail("complete " + k + ": the owner was fenced");
    ModelRecord& m = it->second;
    if (m.state == RecordState::kInProgress) {
      m.state = RecordState::kComplete;
      m.payload.assign(payload);
      m.completed_at = now;
      m.expires_at = now + ttl;
      done_[k].push_back(Completion{token, m.payload, now, m.expires_at, forgets_[k]});
    }
    return r;
  }

  WriteResult do_release(std::string_view scope, std::string_view key, Token token) override {
    std::lock_guard lock(mu_);
    const std::string k(key);
    const WriteResult r = StoreWrapper::do_release(scope, key, token);
    auto it = recs_.find(k);
    const bool owner = it != recs_.end() && it->second.token == token &&
                       it->second.state == RecordState::kInProgress;
    if ((r == WriteResult::kDone) != owner) fail("release " + k + ": disagrees with the model");
    if (owner) recs_.erase(it);
    return r;
  }

  idem::ExtendResult do_extend(std::string_view scope, std::string_view key, Token token,
                               Duration lease) override {
    std::lock_guard lock(mu_);
    const Timestamp now = clock_->now();
    const std::string k(key);
    const idem::ExtendResult r = StoreWrapper::do_extend(scope, key, token, lease);
    auto it = recs_.find(k);
    const bool owner = it != recs_.end() && it->second.token == token &&
                       it->second.state == RecordState::kInProgress;
    if (r.done() != owner) fail("extend " + k + ": disagrees with the model");
    if (owner) {
      if (r.lease_expires_at != now + lease) fail("extend " + k + ": wrong deadline");
      it->second.lease_expires_at = now + lease;
    }
    return r;
  }

  std::vector<idem::ExtendResult> do_extend_many(
      std::span<const idem::ExtendRequest> requests) override {
    return Store::do_extend_many(requests);  // through do_extend, one checked call each
  }

  std::size_t do_purge(std::size_t limit) override {
    std::lock_guard lock(mu_);
    const Timestamp now = clock_->now();
    std::set<std::string> eligible;
    for (const auto& [k, m] : recs_) {
      // SPEC §4, purge.
      if (m.expires_at <= now && (m.state == RecordState::kComplete || m.lease_expires_at <= now)) {
        eligible.insert(k);
      }
    }
    const std::size_t n = StoreWrapper::do_purge(limit);
    if (n > limit || n > eligible.size()) fail("purge deleted more than it may");
    std::size_t gone = 0;
    for (const std::string& k : eligible) {
      if (!target().get(kScope, k)) {
        recs_.erase(k);
        ++gone;
      }
    }
    if (gone != n)
      fail("purge: reported " + std::to_string(n) + ", deleted " + std::to_string(gone));
    return n;
  }

  std::optional<idem::Record> do_get(std::string_view scope, std::string_view key) override {
    std::lock_guard lock(mu_);
    auto r = StoreWrapper::do_get(scope, key);
    const ModelRecord* m = find(std::string(key));
    if (r.has_value() != (m != nullptr) || (m && (r->token != m->token || r->state != m->state))) {
      fail("get " + std::string(key) + ": disagrees with the model");
    }
    return r;
  }

  bool do_forget(std::string_view scope, std::string_view key) override {
    std::lock_guard lock(mu_);
    const std::string k(key);
    const bool r = StoreWrapper::do_forget(scope, key);
    if (r != (recs_.erase(k) == 1)) fail("forget " + k + ": disagrees with the model");
    ++forgets_[k];
    return r;
  }

 private:
  [[noreturn]] void fail(const std::string& what) { throw Violation("store model: " + what); }

  std::shared_ptr<idem::ManualClock> clock_;
  std::mutex mu_;
  std::map<std::string, ModelRecord> recs_;
  std::map<std::string, std::vector<Completion>> done_;
  std::map<std::string, std::uint64_t> forgets_;
  Token last_token_ = 0;
};

// One process's view of the network: a call may arrive late. When armed, the next call of
// the chosen operation runs `hook` (the clock moves, another process acts) before it
// reaches the store.
class SlowLink final : public idem::StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  void arm(Op op, std::function<void()> hook) {
    op_ = op;
    hook_ = std::move(hook);
  }

 protected:
  idem::AcquireResult do_acquire(std::string_view s, std::string_view k, Duration l, Duration t,
                                 std::optional<std::string_view> f) override {
    delay(Op::kAcquire);
    return StoreWrapper::do_acquire(s, k, l, t, f);
  }
  WriteResult do_complete(std::string_view s, std::string_view k, Token t, std::string_view p,
                          Duration ttl) override {
    delay(Op::kComplete);
    return StoreWrapper::do_complete(s, k, t, p, ttl);
  }
  WriteResult do_release(std::string_view s, std::string_view k, Token t) override {
    delay(Op::kRelease);
    return StoreWrapper::do_release(s, k, t);
  }
  idem::ExtendResult do_extend(std::string_view s, std::string_view k, Token t,
                               Duration l) override {
    delay(Op::kExtend);
    return StoreWrapper::do_extend(s, k, t, l);
  }
  std::vector<idem::ExtendResult> do_extend_many(
      std::span<const idem::ExtendRequest> requests) override {
    return Store::do_extend_many(requests);
  }
  std::size_t do_purge(std::size_t limit) override {
    delay(Op::kPurge);
    return StoreWrapper::do_purge(limit);
  }
  std::optional<idem::Record> do_get(std::string_view s, std::string_view k) override {
    delay(Op::kGet);
    return StoreWrapper::do_get(s, k);
  }
  bool do_forget(std::string_view s, std::string_view k) override {
    delay(Op::kForget);
    return StoreWrapper::do_forget(s, k);
  }

 private:
  void delay(Op op) {
    if (!hook_ || op != op_) return;
    auto hook = std::move(hook_);
    hook_ = nullptr;
    hook();
  }
  Op op_ = Op::kAcquire;
  std::function<void()> hook_;
};

// ---- figures, summed over every schedule of a run ----

struct Figures {
  std::uint64_t schedules = 0;
  std::uint64_t steps = 0;
  std::uint64_t executor_calls = 0;
  std::uint64_t store_calls = 0;
  std::uint64_t faults_before = 0;
  std::uint64_t lost_replies = 0;
  std::uint64_t slow_calls = 0;
  std::uint64_t clock_jumps = 0;
  std::uint64_t purges = 0;
  std::uint64_t crashes = 0;
  std::uint64_t fresh_results = 0;
  std::uint64_t replays = 0;
  std::uint64_t fenced = 0;
  std::uint64_t errors = 0;
};

// ---- one schedule ----

constexpr std::array<Op, 8> kFaultOps = {Op::kAcquire,    Op::kComplete, Op::kRelease, Op::kExtend,
                                         Op::kExtendMany, Op::kGet,      Op::kPurge,   Op::kForget};

class Schedule {
 public:
  Schedule(std::uint64_t seed, bool trace) : rng_(seed), trace_(trace) {
    processes_ = pick(2, 4);
    for (int i = 0; i < pick(2, 4); ++i) keys_.push_back("k" + std::to_string(i));
    memory_ = std::make_shared<idem::MemoryStore>(idem::MemoryStoreOptions{.clock = clock_});
    model_ = std::make_shared<ModelStore>(memory_, clock_);
    for (int p = 0; p < processes_; ++p) {
      auto link = std::make_shared<SlowLink>(model_);
      auto faults = std::make_shared<FaultStore>(link);
      links_.push_back(link);
      faults_.push_back(faults);
      execs_.push_back(std::make_unique<idem::Executor>(
          faults,
          idem::ExecutorOptions{
              .lease = kLease, .heartbeat = kLease - 1ms, .ttl = kTtl, .shutdown_timeout = 1s}));
    }
  }

  ~Schedule() {
    handles_.clear();
    execs_.clear();
  }

  void run(int steps, Figures& fig) {
    for (int i = 0; i < steps; ++i) {
      step(0);
      model_->reconcile(keys_);
    }
    // The end of the schedule: every open lease completes or is given up, then the
    // processes stop.
    while (!handles_.empty()) {
      if (chance(2)) {
        complete(0);
      } else {
        release_or_crash();
      }
      model_->reconcile(keys_);
    }
    fig.schedules++;
    fig.steps += static_cast<std::uint64_t>(steps);
    for (const auto& f : faults_) {
      fig.store_calls += f->total_calls();
      for (Op op : kFaultOps) {
        fig.faults_before += f->failed(op);
        fig.lost_replies += f->lost_replies(op);
      }
    }
    fig.executor_calls += stats_.executor_calls;
    fig.slow_calls += stats_.slow_calls;
    fig.clock_jumps += stats_.clock_jumps;
    fig.purges += stats_.purges;
    fig.crashes += stats_.crashes;
    fig.fresh_results += stats_.fresh;
    fig.replays += stats_.replays;
    fig.fenced += stats_.fenced;
    fig.errors += stats_.errors;
  }

  const std::vector<std::string>& log() const { return log_; }

 private:
  static constexpr Duration kLease = 30s;
  static constexpr Duration kTtl = 300s;

  struct Open {
    int process;
    std::string key;
    idem::AttemptHandle<std::string> handle;
  };

  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(int one_in) { return pick(1, one_in) == 1; }
  const std::string& any_key() {
    return keys_[static_cast<std::size_t>(pick(0, int(keys_.size()) - 1))];
  }
  int any_process() { return pick(0, processes_ - 1); }

  void note(const std::string& line) {
    log_.push_back("[t=" + ms(clock_->now()) + "] " + line);
    if (trace_) std::cout << log_.back() << "\n";
  }

  [[noreturn]] void violation(const std::string& what) { throw Violation(what); }

  // The SPEC §11 error a call may give, with the record named.
  void check_error(const idem::Error& e, std::initializer_list<idem::ErrorCode> allowed,
                   const std::string& key, const char* call) {
    bool ok = false;
    for (auto code : allowed) ok = ok || e.code() == code;
    if (!ok)
      violation(std::string(call) + " " + key + " gave " + to_string(e.code()) + ": " + e.what());
    if (std::string_view(e.what()).empty() || (!e.key().empty() && e.key() != key)) {
      violation(std::string(call) + " " + key + ": an error that does not say what it is about");
    }
    ++stats_.errors;
  }

  // A fresh result for (key, token): the record holds exactly it, and no other completion
  // of the key is still within its retention window (forgets by an operator aside).
  void check_fresh(const std::string& key, Token token, const std::string& value) {
    ++stats_.fresh;
    const ModelRecord* m = model_->find(key);
    if (m == nullptr || m->state != RecordState::kComplete || m->token != token ||
        m->payload != value) {
      violation("a fresh result of " + key + " (token " + std::to_string(token) +
                ") is not what the record holds");
    }
    if (!fresh_tokens_.insert({key, token}).second) {
      violation("token " + std::to_string(token) + " reported fresh twice");
    }
    const auto& all = model_->completions(key);
    for (std::size_t i = 0; i + 1 < all.size(); ++i) {
      const auto& prev = all[i];
      const auto& last = all.back();
      if (prev.expires_at > last.completed_at && prev.forgets_before == last.forgets_before) {
        violation(key + " completed twice within its TTL (tokens " + std::to_string(prev.token) +
                  " and " + std::to_string(last.token) + ")");
      }
    }
  }

  // A replayed value is the one the live record holds, and came from an action that ran.
  void check_replay(const std::string& key, const std::string& value) {
    ++stats_.replays;
    const ModelRecord* m = model_->find(key);
    if (m == nullptr || m->state != RecordState::kComplete || m->payload != value) {
      violation("a replay of " + key + " is not what the record holds: " + value);
    }
    if (!produced_.count(value)) violation("a replay of " + key + " no action produced: " + value);
  }

  // An owner the executor hands out holds the key's current lease in the store.
  void check_owned(const std::string& key, Token token) {
    const ModelRecord* m = model_->find(key);
    if (m == nullptr || m->state != RecordState::kInProgress || m->token != token) {
      violation("an action of " + key + " would run without a lease (token " +
                std::to_string(token) + ")");
    }
    for (const Open& o : handles_) {
      if (o.key == key && o.handle.active() && o.handle.token() == token) {
        violation("token " + std::to_string(token) + " handed to two owners");
      }
    }
  }

  // The outcome of a complete that did not report done: the record must not hold its result
  // when the executor says it was not recorded.
  void check_not_recorded(const std::string& key, Token token, const idem::Error& e) {
    const ModelRecord* m = model_->find(key);
    const bool recorded = m && m->state == RecordState::kComplete && m->token == token;
    const bool unknown = std::string_view(e.what()).find("may or may not") != std::string::npos;
    if (recorded && !unknown) {
      violation("complete of " + key + " reported " + to_string(e.code()) +
                " while the record holds its result: " + e.what());
    }
  }

  std::string payload_for(int process, Token token) {
    std::string p = "p" + std::to_string(process) + "/t" + std::to_string(token) + "/n" +
                    std::to_string(++serial_);
    produced_.insert(p);
    return p;
  }

  idem::CallOptions options() { return idem::CallOptions{.ttl = chance(3) ? 20s : kTtl}; }

  void step(int depth) {
    const int what = pick(0, 99);
    if (what < 16) {
      begin(any_process(), any_key());
    } else if (what < 30) {
      run_action(any_process(), any_key(), depth);
    } else if (what < 42) {
      if (!handles_.empty()) complete(depth);
    } else if (what < 47) {
      if (!handles_.empty()) release_or_crash();
    } else if (what < 55) {
      if (!handles_.empty()) heartbeat();
    } else if (what < 68) {
      advance();
    } else if (what < 74) {
      purge();
    } else if (what < 76) {
      forget();
    } else if (what < 90) {
      arm_fault();
    } else if (depth == 0) {
      arm_slow();
    }
  }

  void begin(int p, const std::string& key) {
    ++stats_.executor_calls;
    try {
      auto r = execs_[p]->begin(kScope, key, options());
      if (auto* replay = r.replay()) {
        note("p" + std::to_string(p) + " begin " + key + ": replay " + replay->value);
        check_replay(key, replay->value);
      } else if (r.busy() != nullptr) {
        note("p" + std::to_string(p) + " begin " + key + ": busy");
      } else {
        const Token t = r.handle()->token();
        note("p" + std::to_string(p) + " begin " + key + ": lease " + std::to_string(t));
        check_owned(key, t);
        handles_.push_back(Open{p, key, std::move(*r.handle())});
      }
    } catch (const idem::Error& e) {
      note("p" + std::to_string(p) + " begin " + key + ": " + e.what());
      check_error(e, {idem::ErrorCode::kStoreUnavailable}, key, "begin");
    }
  }

  void run_action(int p, const std::string& key, int depth) {
    ++stats_.executor_calls;
    const bool throws = chance(6);
    const int nested = depth == 0 && chance(3) ? pick(1, 3) : 0;
    const int serial = ++serial_;
    Token ran = 0;
    try {
      auto r = execs_[p]->run(
          kScope, key,
          [&](const idem::Attempt& a) -> std::string {
            ran = a.token();
            note("p" + std::to_string(p) + " run " + key + ": action with lease " +
                 std::to_string(a.token()));
            check_owned(key, a.token());
            // Other processes act, and time passes, while the action runs.
            for (int i = 0; i < nested; ++i) step(depth + 1);
            if (throws) throw ActionFailed(serial);
            return payload_for(p, a.token());
          },
          options());
      if (r.replayed) {
        note("p" + std::to_string(p) + " run " + key + ": replay " + r.value);
        check_replay(key, r.value);
      } else {
        note("p" + std::to_string(p) + " run " + key + ": done " + r.value);
        if (throws) violation("run returned although its action threw");
        check_fresh(key, ran, r.value);
      }
    } catch (const ActionFailed& e) {
      note("p" + std::to_string(p) + " run " + key + ": the action's own exception");
      if (!throws || e.serial != serial) violation("run " + key + ": a foreign ActionFailed");
    } catch (const idem::Error& e) {
      note("p" + std::to_string(p) + " run " + key + ": " + e.what());
      check_error(e,
                  {idem::ErrorCode::kStoreUnavailable, idem::ErrorCode::kInProgress,
                   idem::ErrorCode::kLeaseLost},
                  key, "run");
      if (e.code() == idem::ErrorCode::kLeaseLost) ++stats_.fenced;
      if (ran != 0 && !throws &&
          (e.code() == idem::ErrorCode::kLeaseLost ||
           e.code() == idem::ErrorCode::kStoreUnavailable)) {
        check_not_recorded(key, ran, e);
      }
    } catch (const Violation&) {
      throw;
    } catch (const std::exception& e) {
      violation("run " + key + " threw something that is not an idem::Error: " + e.what());
    }
  }

  std::size_t any_handle() { return static_cast<std::size_t>(pick(0, int(handles_.size()) - 1)); }

  void complete(int depth) {
    (void)depth;
    const std::size_t i = any_handle();
    Open open = std::move(handles_[i]);
    handles_.erase(handles_.begin() + static_cast<std::ptrdiff_t>(i));
    ++stats_.executor_calls;
    const Token t = open.handle.token();
    const std::string value = payload_for(open.process, t);
    const std::string who = "p" + std::to_string(open.process) + " complete " + open.key +
                            " (lease " + std::to_string(t) + ")";
    try {
      auto r = open.handle.complete(value);
      note(who + ": done");
      if (r.value != value || r.replayed) violation(who + ": not its own value");
      check_fresh(open.key, t, value);
    } catch (const idem::Error& e) {
      note(who + ": " + e.what());
      check_error(e, {idem::ErrorCode::kLeaseLost, idem::ErrorCode::kStoreUnavailable}, open.key,
                  "complete");
      if (e.code() == idem::ErrorCode::kLeaseLost) ++stats_.fenced;
      check_not_recorded(open.key, t, e);
    }
  }

  // Gives a lease up, or crashes holding it (the release never reaches the store).
  void release_or_crash() {
    const std::size_t i = any_handle();
    Open open = std::move(handles_[i]);
    handles_.erase(handles_.begin() + static_cast<std::ptrdiff_t>(i));
    const bool crash = chance(3);
    note("p" + std::to_string(open.process) + (crash ? " crashes holding " : " releases ") +
         open.key + " (lease " + std::to_string(open.handle.token()) + ")");
    if (crash) {
      ++stats_.crashes;
      faults_[open.process]->fail_always(Op::kRelease);
    }
    open.handle.release();
    if (crash) faults_[open.process]->fail_always(Op::kRelease, false);
  }

  // The heartbeat of one open lease, sent as the heartbeat sends it.
  void heartbeat() {
    Open& open = handles_[any_handle()];
    const idem::ExtendRequest req{kScope, open.key, open.handle.token(), kLease};
    try {
      auto r = faults_[open.process]->extend_many(std::span(&req, 1));
      note("p" + std::to_string(open.process) + " heartbeat " + open.key + ": " +
           (r.at(0).done() ? "extended" : "fenced"));
    } catch (const idem::Error& e) {
      note("p" + std::to_string(open.process) + " heartbeat " + open.key + ": " + e.what());
      check_error(e, {idem::ErrorCode::kStoreUnavailable}, open.key, "extend");
    }
  }

  void advance() {
    static constexpr std::array<Duration, 6> kJumps = {1ms, 500ms, 5s, kLease, kLease + 1ms, 21s};
    Duration d = kJumps[static_cast<std::size_t>(pick(0, int(kJumps.size()) - 1))];
    if (chance(6)) d = kTtl + 1s;  // past every TTL
    ++stats_.clock_jumps;
    clock_->advance(d);
    note("clock +" + std::to_string(d.count()) + " ms");
  }

  void purge() {
    const int p = any_process();
    const auto limit = static_cast<std::size_t>(pick(1, 4));
    ++stats_.purges;
    try {
      const std::size_t n = faults_[p]->purge(limit);
      note("p" + std::to_string(p) + " purge: " + std::to_string(n));
    } catch (const idem::Error& e) {
      note("p" + std::to_string(p) + " purge: " + e.what());
      check_error(e, {idem::ErrorCode::kStoreUnavailable}, "", "purge");
    }
  }

  void forget() {
    const int p = any_process();
    const std::string& key = any_key();
    try {
      const bool n = faults_[p]->forget(kScope, key);
      note("p" + std::to_string(p) + " forget " + key + ": " + (n ? "deleted" : "nothing"));
    } catch (const idem::Error& e) {
      note("p" + std::to_string(p) + " forget " + key + ": " + e.what());
      check_error(e, {idem::ErrorCode::kStoreUnavailable}, key, "forget");
    }
  }

  void arm_fault() {
    const int p = any_process();
    const Op op = kFaultOps[static_cast<std::size_t>(pick(0, int(kFaultOps.size()) - 1))];
    if (chance(2)) {
      faults_[p]->fail_next(op);
      note("p" + std::to_string(p) + " will fail its next " + to_string(op));
    } else {
      faults_[p]->lose_reply_next(op);
      note("p" + std::to_string(p) + " will lose the reply of its next " + to_string(op));
    }
  }

  void arm_slow() {
    const int p = any_process();
    const Op op = kFaultOps[static_cast<std::size_t>(pick(0, 2))];  // acquire, complete, release
    const bool jump = chance(2);
    const int other = any_process();
    const std::string key = any_key();
    note("p" + std::to_string(p) + " will be slow on its next " + to_string(op));
    links_[p]->arm(op, [this, p, op, jump, other, key] {
      ++stats_.slow_calls;
      note("p" + std::to_string(p) + " " + to_string(op) + " is slow");
      if (jump) {
        clock_->advance(kLease + 1ms);
        note("clock +" + std::to_string((kLease + 1ms).count()) + " ms while it travels");
      }
      if (other != p) run_action(other, key, 1);  // someone else acts meanwhile
    });
  }

  struct Stats {
    std::uint64_t executor_calls = 0, slow_calls = 0, clock_jumps = 0, purges = 0, crashes = 0,
                  fresh = 0, replays = 0, fenced = 0, errors = 0;
  };

  std::mt19937_64 rng_;
  bool trace_;
  int processes_ = 0;
  std::vector<std::string> keys_;
  std::shared_ptr<idem::ManualClock> clock_ = std::make_shared<idem::ManualClock>();
  std::shared_ptr<idem::MemoryStore> memory_;
  std::shared_ptr<ModelStore> model_;
  std::vector<std::shared_ptr<SlowLink>> links_;
  std::vector<std::shared_ptr<FaultStore>> faults_;
  std::vector<std::unique_ptr<idem::Executor>> execs_;
  std::vector<Open> handles_;
  std::set<std::pair<std::string, Token>> fresh_tokens_;
  std::set<std::string> produced_;
  int serial_ = 0;
  Stats stats_;
  std::vector<std::string> log_;
};

std::optional<std::uint64_t> env_number(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::stoull(v);
}

std::string self_path() {
  std::array<char, 4096> buf{};
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<std::size_t>(n)) : "simulation_test";
}

// Fewer schedules where every step costs many times more (sanitizers, no optimisation).
constexpr std::uint64_t default_schedules() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return 1000;
#elif !defined(NDEBUG)
  return 2000;
#else
  return 10000;
#endif
}

TEST(Simulation, RandomSchedules) {
  const auto only = env_number("IDEM_SIM_SEED");
  const std::uint64_t first = only ? *only : env_number("IDEM_SIM_FIRST_SEED").value_or(1);
  const std::uint64_t count =
      only ? 1 : env_number("IDEM_SIM_SCHEDULES").value_or(default_schedules());
  Figures fig;
  const auto started = std::chrono::steady_clock::now();
  for (std::uint64_t seed = first; seed < first + count; ++seed) {
    std::optional<Schedule> s;
    try {
      s.emplace(seed, only.has_value());
      std::mt19937_64 length(seed ^ 0x5eed);
      s->run(std::uniform_int_distribution<int>(20, 80)(length), fig);
    } catch (const Violation& v) {
      std::ostringstream out;
      out << "violation in schedule " << seed << ": " << v.what() << "\n";
      if (s) {
        const auto& log = s->log();
        const std::size_t from = log.size() > 40 ? log.size() - 40 : 0;
        out << "last steps:\n";
        for (std::size_t i = from; i < log.size(); ++i) out << "  " << log[i] << "\n";
      }
      out << "replay: IDEM_SIM_SEED=" << seed << " " << self_path()
          << " --gtest_filter=Simulation.RandomSchedules\n";
      FAIL() << out.str();
    }
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - started);
  std::cout << "simulation: seeds " << first << ".." << first + count - 1 << ", schedules "
            << fig.schedules << ", steps " << fig.steps << ", executor calls " << fig.executor_calls
            << ", store calls " << fig.store_calls << ", faults before the store "
            << fig.faults_before << ", lost replies " << fig.lost_replies << ", slow calls "
            << fig.slow_calls << ", clock jumps " << fig.clock_jumps << ", purges " << fig.purges
            << ", crashes " << fig.crashes << ", fresh results " << fig.fresh_results
            << ", replays " << fig.replays << ", fenced " << fig.fenced << ", errors " << fig.errors
            << ", violations 0, " << took.count() << " ms\n";
  // The schedules must exercise what they claim to, or a quiet bug in the driver could
  // make every check vacuous.
  if (count >= 100) {
    EXPECT_GT(fig.fresh_results, 0u);
    EXPECT_GT(fig.replays, 0u);
    EXPECT_GT(fig.fenced, 0u);
    EXPECT_GT(fig.lost_replies, 0u);
    EXPECT_GT(fig.faults_before, 0u);
    EXPECT_GT(fig.crashes, 0u);
  }
}

}  // namespace
