// SPEC §9: every operation is one atomic step, safe from many threads at once. Races for
// one key have one winner, a stale owner racing a thief has one winner, and a randomised
// run over many keys keeps every invariant of SPEC §3 against a reference model.

#include <gmock/gmock.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <latch>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "idem/testing/matchers.h"
#include "idem/testing/store_conformance.h"

namespace idem::testing {
namespace {

// Runs `body(i)` on `n` threads that start together; returns when all have finished. An
// exception escaping a body is recorded as a failure.
void run_together(int n, const std::function<void(int)>& body) {
  std::latch start(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      try {
        body(i);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << i << " threw: " << e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

struct Tally {
  int fresh = 0;
  int stolen = 0;
  int busy = 0;
  int replay = 0;
  int other = 0;
  std::vector<Lease> winners;
};

Tally tally(const std::vector<AcquireResult>& results) {
  Tally t;
  for (const AcquireResult& r : results) {
    if (const auto* a = std::get_if<Acquired>(&r)) {
      (a->stolen ? t.stolen : t.fresh) += 1;
      t.winners.push_back(a->lease);
    } else if (std::holds_alternative<Busy>(r)) {
      ++t.busy;
    } else {
      ++t.replay;
    }
  }
  return t;
}

TEST_P(StoreConformance, ConcurrentAcquiresOfOneKeyHaveOneWinner) {
  constexpr int kThreads = 64;
  std::vector<AcquireResult> results(kThreads);
  auto race = [&] {
    run_together(kThreads,
                 [&](int i) { results[i] = store().acquire("s", "k", live(), live(), "fp"); });
    return tally(results);
  };

  // A new key: exactly one fresh lease; everyone else sees it Busy.
  Tally t = race();
  ASSERT_EQ(t.fresh, 1);
  EXPECT_EQ(t.stolen, 0);
  EXPECT_EQ(t.busy, kThreads - 1);
  const Lease first = t.winners.at(0);
  for (const AcquireResult& r : results) {
    if (const auto* busy = std::get_if<Busy>(&r)) {
      expect_same_instant(busy->lease_expires_at, first.lease_expires_at, "Busy deadline");
    }
  }

  // After a release: again exactly one first attempt.
  ASSERT_THAT(store().release("s", "k", first.token), IsDone());
  t = race();
  ASSERT_EQ(t.fresh, 1);
  EXPECT_EQ(t.busy, kThreads - 1);
  const Lease second = t.winners.at(0);
  EXPECT_GT(second.token, first.token);
  EXPECT_EQ(second.attempt, 1u);

  // After the lease passes: exactly one steal.
  ASSERT_THAT(store().extend("s", "k", second.token, ticks(2)), IsDone());
  pass(ticks(3));
  t = race();
  EXPECT_EQ(t.fresh, 0);
  ASSERT_EQ(t.stolen, 1);
  EXPECT_EQ(t.busy, kThreads - 1);
  const Lease third = t.winners.at(0);
  EXPECT_GT(third.token, second.token);
  EXPECT_EQ(third.attempt, 2u);

  // After completion: everyone replays.
  ASSERT_THAT(store().complete("s", "k", third.token, "result", live()), IsDone());
  t = race();
  EXPECT_EQ(t.replay, kThreads);
  for (const AcquireResult& r : results) EXPECT_THAT(r, IsReplay("result"));
}

TEST_P(StoreConformance, StaleOwnerRacingThiefHasOneWinner) {
  // Per key, a stale owner's complete, release or extend races a thief's acquire. Either
  // the owner got in first (done; the thief then sees its result) or the thief did
  // (stolen; the owner is fenced). Never both, never neither.
  constexpr int kKeys = 48;
  std::vector<Token> stale(kKeys);
  for (int i = 0; i < kKeys; ++i) {
    stale[i] = acquire_fresh("s", std::to_string(i), ticks(2), live()).token;
  }
  pass(ticks(3));

  std::vector<WriteResult> owner(kKeys);
  std::vector<AcquireResult> thief(kKeys);
  run_together(2 * kKeys, [&](int i) {
    const int k = i / 2;
    const std::string key = std::to_string(k);
    if (i % 2 == 1) {
      thief[k] = store().acquire("s", key, live(), live());
    } else if (k % 3 == 0) {
      owner[k] = store().complete("s", key, stale[k], "owner", live());
    } else if (k % 3 == 1) {
      owner[k] = store().release("s", key, stale[k]);
    } else {
      owner[k] = store().extend("s", key, stale[k], live()).result;
    }
  });

  for (int k = 0; k < kKeys; ++k) {
    SCOPED_TRACE("key " + std::to_string(k) + ", owner op " + std::to_string(k % 3));
    const std::optional<Record> rec = store().get("s", std::to_string(k));
    if (owner[k] == WriteResult::kFenced) {
      EXPECT_THAT(thief[k], IsStolen(2));
      ASSERT_THAT(thief[k], IsAcquired());
      EXPECT_THAT(rec, IsInProgressWith(std::get<Acquired>(thief[k]).lease.token));
    } else if (k % 3 == 0) {  // completed first
      EXPECT_THAT(thief[k], IsReplay("owner"));
      EXPECT_THAT(rec, IsCompleteWith(stale[k]));
    } else if (k % 3 == 1) {  // released first
      EXPECT_THAT(thief[k], IsFreshlyAcquired());
      ASSERT_THAT(thief[k], IsAcquired());
      EXPECT_THAT(rec, IsInProgressWith(std::get<Acquired>(thief[k]).lease.token));
    } else {  // extended first
      EXPECT_THAT(thief[k], IsBusy());
      EXPECT_THAT(rec, IsInProgressWith(stale[k]));
    }
  }
}

TEST_P(StoreConformance, PurgeRacingStealsNeverDeletesNewLease) {
  // Records whose lease and TTL both passed are purgeable, until somebody steals one. A
  // purge running alongside the steals may delete a record before its steal (which then
  // finds the key absent) but never after (SPEC §4: a live lease is never purged).
  constexpr int kKeys = 64;
  for (int i = 0; i < kKeys; ++i) acquire_fresh("s", std::to_string(i), ticks(2), ticks(2));
  pass(ticks(3));

  std::vector<AcquireResult> results(kKeys);
  std::atomic<std::size_t> purged{0};
  std::atomic<bool> acquiring_done{false};
  run_together(2, [&](int i) {
    if (i == 0) {
      for (int k = 0; k < kKeys; ++k) {
        results[k] = store().acquire("s", std::to_string(k), live(), live());
      }
      acquiring_done = true;
    } else {
      // Bounded: at most one purge per key, then one last one.
      for (int n = 0; n <= kKeys && !acquiring_done; ++n) purged += store().purge(1);
      purged += store().purge(kKeys);
    }
  });

  std::size_t fresh = 0;
  for (int k = 0; k < kKeys; ++k) {
    SCOPED_TRACE("key " + std::to_string(k));
    ASSERT_THAT(results[k], IsAcquired());
    const Acquired& a = std::get<Acquired>(results[k]);
    if (!a.stolen) ++fresh;
    EXPECT_EQ(a.lease.attempt, a.stolen ? 2u : 1u);
    EXPECT_THAT(store().get("s", std::to_string(k)), IsInProgressWith(a.lease.token));
  }
  if (!native_expiry()) {
    EXPECT_EQ(purged.load(), fresh);
  }
}

// ---- the randomised model check ----

// The reference model of one key. Fields change under `mu`; the protocol (see the test)
// makes every check race-free although acquires run outside the lock.
struct KeyModel {
  std::mutex mu;
  std::string key;
  std::string fingerprint;
  Token holder = 0;           // holds a live lease in this phase (recorded after acquire returns)
  Token pending = 0;          // the holder that is completing right now
  Token abandoned = 0;        // held at a phase end: IN_PROGRESS with a passed lease
  std::uint32_t attempt = 0;  // of the IN_PROGRESS record
  bool ttl_short = false;     // the IN_PROGRESS record's TTL ends at the next phase end
  Token completed = 0;        // the token that completed the COMPLETE record
  bool complete_ttl_short = false;
  bool complete_expired = false;
  Token last = 0;                // the last token granted for this key
  std::vector<Token> forgotten;  // results forgotten in this phase

  bool present() const { return holder != 0 || abandoned != 0 || completed != 0; }
};

std::string payload_for(const std::string& key, Token token) {
  return key + std::string("\0", 1) + std::to_string(token) + "\xff";
}

class RandomRun {
 public:
  RandomRun(Store& store, std::uint64_t seed, int keys, int threads, int phases, int ops,
            bool fake_clock, Duration lease, Duration long_ttl, bool native_expiry,
            bool store_wide_tokens, std::function<void(Duration)> pass,
            std::function<Timestamp()> fake_now)
      : store_(store),
        seed_(seed),
        models_(keys),
        threads_(threads),
        phases_(phases),
        ops_(ops),
        fake_clock_(fake_clock),
        lease_(lease),
        long_ttl_(long_ttl),
        native_expiry_(native_expiry),
        store_wide_tokens_(store_wide_tokens),
        pass_(std::move(pass)),
        fake_now_(std::move(fake_now)),
        coordinator_rng_(seed) {
    for (int k = 0; k < keys; ++k) {
      models_[k].key = "key-" + std::to_string(k) + std::string("\0", 1);
      models_[k].fingerprint = "fp-" + std::to_string(k);
    }
  }

  void run() {
    std::barrier phase_end(threads_, Boundary{this});
    std::vector<std::thread> threads;
    std::vector<std::vector<Token>> granted(threads_);
    for (int t = 0; t < threads_; ++t) {
      threads.emplace_back([this, t, &phase_end, &granted] { worker(t, phase_end, granted[t]); });
    }
    for (std::thread& th : threads) th.join();

    // SPEC §2: tokens are unique within a store that claims it (per-key order is checked
    // at every acquire, for every store).
    std::set<Token> all;
    for (const auto& tokens : granted) {
      if (!store_wide_tokens_) break;
      for (Token token : tokens) {
        if (!all.insert(token).second) fail("token " + std::to_string(token) + " granted twice");
      }
    }
    std::cout << "[ random run ] seed " << seed_ << ": " << stats_.acquired << " acquired ("
              << stats_.stolen << " stolen), " << stats_.busy << " busy, " << stats_.replay
              << " replays, " << stats_.stale_done << " stale writes done, " << stats_.stale_fenced
              << " fenced, " << stats_.purged << " purged, " << stats_.forgotten << " forgotten\n";
  }

 private:
  struct Boundary {
    RandomRun* run;
    void operator()() noexcept { run->boundary(); }
  };
  struct Stats {
    std::atomic<long> acquired{0}, stolen{0}, busy{0}, replay{0}, stale_done{0}, stale_fenced{0},
        purged{0}, forgotten{0};
  };

  void fail(const std::string& message) {
    if (failures_.fetch_add(1) < 10) {
      ADD_FAILURE() << message << " (seed " << seed_
                    << "; rerun with IDEM_CONFORMANCE_SEED=" << seed_ << ")";
    }
  }
  bool failed() const { return failures_.load() > 0; }

  void check(bool ok, const KeyModel& m, const std::string& what) {
    if (!ok) {
      fail("key " + std::to_string(&m - models_.data()) + ": " + what);
    }
  }

  void worker(int t, std::barrier<Boundary>& phase_end, std::vector<Token>& granted) {
    std::mt19937_64 rng(seed_ * 1000003 + static_cast<std::uint64_t>(t));
    std::map<int, Token> held;                 // key -> live lease token
    std::vector<std::pair<int, Token>> stale;  // leases held at an earlier phase end
    for (int phase = 0; phase < phases_; ++phase) {
      const auto started = std::chrono::steady_clock::now();
      try {
        for (int op = 0; op < ops_ && !failed(); ++op) {
          // On a real clock a phase must stay far shorter than a lease.
          if (!fake_clock_ && std::chrono::steady_clock::now() - started > lease_ / 4) break;
          step(rng, held, stale, granted);
        }
      } catch (const std::exception& e) {
        fail(std::string("store operation threw: ") + e.what());
      }
      // The phase ends: every lease still held is abandoned (its owner "crashed").
      for (const auto& [k, token] : held) {
        KeyModel& m = models_[k];
        std::lock_guard lock(m.mu);
        check(m.holder == token, m, "the model lost track of a holder");
        m.holder = 0;
        m.abandoned = token;
        stale.emplace_back(k, token);
      }
      held.clear();
      phase_end.arrive_and_wait();
    }
  }

  void step(std::mt19937_64& rng, std::map<int, Token>& held,
            std::vector<std::pair<int, Token>>& stale, std::vector<Token>& granted) {
    // Half the time act on a lease this thread holds, so most are finished in their phase.
    int k = static_cast<int>(rng() % models_.size());
    if (!held.empty() && rng() % 2 == 0) {
      k = std::next(held.begin(), static_cast<std::ptrdiff_t>(rng() % held.size()))->first;
    }
    KeyModel& m = models_[k];
    const int dice = static_cast<int>(rng() % 100);
    // Mostly short TTLs, so results expire at the next phase end and keys keep churning.
    const bool short_ttl = rng() % 4 != 0;
    const Duration ttl = short_ttl ? lease_ : long_ttl_;

    if (auto it = held.find(k); it != held.end()) {
      const Token token = it->second;
      if (dice < 45) {
        {
          std::lock_guard lock(m.mu);
          // Recorded before the store call, so no acquire can see an unrecorded completion.
          m.holder = 0;
          m.pending = token;
        }
        const WriteResult r = store_.complete("s", m.key, token, payload_for(m.key, token), ttl);
        std::lock_guard lock(m.mu);
        check(r == WriteResult::kDone, m, "the owner of a live lease was fenced at complete");
        m.pending = 0;
        m.completed = token;
        m.complete_ttl_short = short_ttl;
        m.complete_expired = false;
        held.erase(it);
      } else if (dice < 65) {
        {
          std::lock_guard lock(m.mu);
          m.holder = 0;
        }
        const WriteResult r = store_.release("s", m.key, token);
        check(r == WriteResult::kDone, m, "the owner of a live lease was fenced at release");
        held.erase(it);
      } else if (dice < 85) {
        const ExtendResult r = store_.extend("s", m.key, token, lease_);
        check(r.done(), m, "the owner of a live lease was fenced at extend");
        if (fake_clock_ && r.done()) {
          check(r.lease_expires_at == fake_now_() + lease_, m, "extend set a wrong deadline");
        }
      }
      return;  // Otherwise keep holding: the lease may be abandoned at the phase end.
    }

    if (!stale.empty() && dice < 20) {
      const std::size_t i = rng() % stale.size();
      const Token token = stale[i].second;
      KeyModel& sm = models_[stale[i].first];
      stale.erase(stale.begin() + static_cast<std::ptrdiff_t>(i));
      // Under the model's lock, so the model changes with the store in one step.
      std::lock_guard lock(sm.mu);
      const bool owns = sm.abandoned == token;
      WriteResult r;
      const int op = dice % 3;
      if (op == 0) {
        r = store_.complete("s", sm.key, token, payload_for(sm.key, token), ttl);
      } else if (op == 1) {
        r = store_.release("s", sm.key, token);
      } else {
        r = store_.extend("s", sm.key, token, lease_).result;
      }
      // SPEC §4: a token that no longer owns the record is fenced. One that still owns it
      // may succeed, or be fenced by a steal whose acquire has not been recorded yet.
      if (!owns) {
        check(r == WriteResult::kFenced, sm, "a stale token that lost its record was not fenced");
      }
      if (r == WriteResult::kFenced) {
        ++stats_.stale_fenced;
        return;
      }
      ++stats_.stale_done;
      if (!owns) return;
      sm.abandoned = 0;
      if (op == 0) {
        sm.completed = token;
        sm.complete_ttl_short = short_ttl;
        sm.complete_expired = false;
      } else if (op == 2) {
        // The lease lives again: this thread holds it once more.
        sm.holder = token;
        held[stale_key(sm)] = token;
      }
      return;
    }

    if (dice >= 20 && dice < 25) {
      // An operator forgets a live result. Only a live COMPLETE record: no acquire can be
      // changing it behind the model's back.
      std::lock_guard lock(m.mu);
      if (m.completed == 0 || m.complete_expired || m.pending != 0) return;
      const bool deleted = store_.forget("s", m.key);
      check(deleted, m, "forget did not find a live COMPLETE record");
      ++stats_.forgotten;
      // A duplicate that replayed it just before may check its result after this.
      m.forgotten.push_back(m.completed);
      m.completed = 0;
      return;
    }

    const AcquireResult r = store_.acquire("s", m.key, lease_, ttl, m.fingerprint);
    std::lock_guard lock(m.mu);
    if (const auto* a = std::get_if<Acquired>(&r)) {
      ++stats_.acquired;
      if (a->stolen) ++stats_.stolen;
      const Token token = a->lease.token;
      granted.push_back(token);
      // SPEC §2: strictly greater than every earlier token for the key.
      check(token > m.last, m,
            "token " + std::to_string(token) + " not above " + std::to_string(m.last));
      // SPEC §4: a live lease or a live COMPLETE is never acquired.
      check(m.holder == 0 && m.pending == 0, m, "acquired a key held by a live lease");
      check(m.completed == 0 || m.complete_expired, m, "acquired a key with a live result");
      // SPEC §4: stolen exactly when an abandoned lease was taken over, attempt + 1.
      check(a->stolen == (m.abandoned != 0), m,
            std::string("stolen=") + (a->stolen ? "true" : "false") + " but the model says " +
                (m.abandoned != 0 ? "abandoned" : "absent"));
      const std::uint32_t expected_attempt = a->stolen ? m.attempt + 1 : 1;
      check(a->lease.attempt == expected_attempt, m,
            "attempt " + std::to_string(a->lease.attempt) + ", expected " +
                std::to_string(expected_attempt));
      if (fake_clock_) {
        check(a->lease.lease_expires_at == fake_now_() + lease_, m, "wrong lease deadline");
      }
      m.last = std::max(m.last, token);
      m.holder = token;
      m.abandoned = 0;
      m.completed = 0;
      m.complete_expired = false;
      m.attempt = a->lease.attempt;
      m.ttl_short = short_ttl;
      held[k] = token;
    } else if (const auto* b = std::get_if<Busy>(&r)) {
      ++stats_.busy;
      check(b->fingerprint == m.fingerprint, m, "Busy reported another key's fingerprint");
      check(b->lease_remaining > Duration::zero() && b->lease_remaining <= lease_, m,
            "Busy reported a lease time left outside (0, lease]");
    } else {
      ++stats_.replay;
      const Replay& replay = std::get<Replay>(r);
      // The result is the one stored by the completing token, whether or not that
      // completion has been recorded in the model yet.
      bool ok = (m.completed != 0 && !m.complete_expired &&
                 replay.payload == payload_for(m.key, m.completed)) ||
                (m.pending != 0 && replay.payload == payload_for(m.key, m.pending));
      for (Token t : m.forgotten) ok = ok || replay.payload == payload_for(m.key, t);
      check(ok, m, "Replay of a payload that is not the live result");
      check(replay.fingerprint == m.fingerprint, m, "Replay reported a wrong fingerprint");
      check(replay.expires_at > replay.completed_at, m, "Replay expires before completion");
    }
  }

  int stale_key(const KeyModel& m) const { return static_cast<int>(&m - models_.data()); }

  // Between phases, on one thread while all workers wait: lets every lease pass, sometimes
  // purges and forgets, then compares every record with the model.
  void boundary() {
    try {
      if (failed()) return;
      pass_(lease_ + lease_ / 10);
      for (KeyModel& m : models_) {
        std::lock_guard lock(m.mu);
        check(m.holder == 0 && m.pending == 0, m, "a lease outlived its phase in the model");
        if (m.completed != 0 && m.complete_ttl_short) m.complete_expired = true;
        m.forgotten.clear();
      }
      if (coordinator_rng_() % 2 == 0) purge();
      sync_native_expiry();
      for (int i = 0; i < 2; ++i) {
        if (coordinator_rng_() % 4 != 0) continue;
        KeyModel& m = models_[coordinator_rng_() % models_.size()];
        std::lock_guard lock(m.mu);
        const bool deleted = store_.forget("s", m.key);
        // SPEC §4: forget deletes whatever state the record is in.
        check(deleted == m.present(), m, "forget's answer disagrees with the model");
        if (deleted) ++stats_.forgotten;
        m.abandoned = 0;
        m.completed = 0;
        m.complete_expired = false;
      }
      verify_all();
    } catch (const std::exception& e) {
      fail(std::string("store operation threw between phases: ") + e.what());
    }
  }

  static bool purgeable(const KeyModel& m) {
    return (m.abandoned != 0 && m.ttl_short) || (m.completed != 0 && m.complete_expired);
  }

  void purge() {
    std::size_t expected = 0;
    for (const KeyModel& m : models_) expected += purgeable(m) ? 1 : 0;
    const std::size_t limit = 1 + coordinator_rng_() % (models_.size() / 2);
    const std::size_t purged = store_.purge(limit);
    stats_.purged += static_cast<long>(purged);
    if (purged > limit) fail("purge deleted more than its limit");
    std::size_t gone = 0;
    for (KeyModel& m : models_) {
      std::lock_guard lock(m.mu);
      const bool present = store_.get("s", m.key).has_value();
      if (!purgeable(m)) {
        check(present == m.present(), m, "purge deleted a record it must keep");
        continue;
      }
      if (!present) {
        ++gone;
        m.abandoned = 0;
        m.completed = 0;
        m.complete_expired = false;
      }
    }
    if (!native_expiry_) {
      if (gone != purged) fail("purge's count disagrees with what it deleted");
      if (purged < limit && gone != expected) fail("purge stopped short of its limit");
    }
  }

  // A store with native expiry may have dropped purgeable records by itself.
  void sync_native_expiry() {
    if (!native_expiry_) return;
    for (KeyModel& m : models_) {
      if (!purgeable(m) || store_.get("s", m.key).has_value()) continue;
      m.abandoned = 0;
      m.completed = 0;
      m.complete_expired = false;
    }
  }

  void verify_all() {
    for (KeyModel& m : models_) {
      std::lock_guard lock(m.mu);
      const std::optional<Record> rec = store_.get("s", m.key);
      if (m.abandoned != 0) {
        if (!rec || rec->state != RecordState::kInProgress) {
          check(false, m, "the model has an abandoned lease, the store does not");
          continue;
        }
        check(rec->token == m.abandoned, m, "IN_PROGRESS with the wrong token");
        check(rec->attempt == m.attempt, m, "IN_PROGRESS with the wrong attempt");
        check(rec->lease_expires_at <= rec->now, m, "a lease outlived its phase");
        check((rec->expires_at <= rec->now) == m.ttl_short, m, "IN_PROGRESS with a wrong TTL");
        check(rec->fingerprint == m.fingerprint, m, "IN_PROGRESS with a wrong fingerprint");
      } else if (m.completed != 0) {
        if (!rec || rec->state != RecordState::kComplete) {
          check(false, m, "the model has a result, the store does not");
          continue;
        }
        check(rec->token == m.completed, m, "COMPLETE with the wrong token");
        check(rec->payload == payload_for(m.key, m.completed), m, "COMPLETE with a wrong payload");
        check((rec->expires_at <= rec->now) == m.complete_expired, m, "COMPLETE with a wrong TTL");
        check(rec->fingerprint == m.fingerprint, m, "COMPLETE with a wrong fingerprint");
      } else {
        check(!rec.has_value(), m, "the store has a record the model does not");
      }
    }
  }

  Store& store_;
  const std::uint64_t seed_;
  std::vector<KeyModel> models_;
  const int threads_;
  const int phases_;
  const int ops_;
  const bool fake_clock_;
  const Duration lease_;
  const Duration long_ttl_;
  const bool native_expiry_;
  const bool store_wide_tokens_;
  std::function<void(Duration)> pass_;
  std::function<Timestamp()> fake_now_;
  std::mt19937_64 coordinator_rng_;  // used only between phases
  std::atomic<int> failures_{0};
  Stats stats_;
};

std::uint64_t random_run_seed() {
  if (const char* text = std::getenv("IDEM_CONFORMANCE_SEED")) {
    return std::strtoull(text, nullptr, 10);
  }
  return std::random_device{}();
}

TEST_P(StoreConformance, RandomConcurrentOperationsKeepInvariants) {
  const std::uint64_t seed = random_run_seed();
  RecordProperty("seed", std::to_string(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int scale = std::max(1, GetParam().stress_scale);
  // Time stands still inside a phase on a fake clock, so phases are cheap and many. On a
  // real clock each phase costs a lease of sleeping, so there are few, each stopping early
  // if it runs long.
  const int phases = fake_clock() ? 10 * scale : 3;
  const int ops_per_thread = fake_clock() ? 40 : 40 * scale;
  // A long TTL outlives the whole run: every phase lets a little more than a lease pass.
  const Duration long_ttl = ticks(10) * 2 * (phases + 2);
  RandomRun run(
      store(), seed, /*keys=*/24, /*threads=*/8, phases, ops_per_thread, fake_clock(),
      /*lease=*/ticks(10), long_ttl, native_expiry(), store_wide_tokens(),
      [this](Duration d) { pass(d); }, [this] { return now(); });
  run.run();
}

}  // namespace
}  // namespace idem::testing
