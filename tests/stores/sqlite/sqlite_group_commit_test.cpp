// The SQLite store's group commit: writes queued behind a transaction in flight run together
// in the next one, and each gets exactly the outcome it would have had alone. Checked by
// replaying the order the store applied them in (sqlite::last_write_position) on the
// in-memory store, which passes the same conformance suite, as the reference model.
//
// A batch is made deterministic by holding the file's write lock from another connection:
// the store's leader waits for it inside BEGIN, the next writes queue behind it one by one
// (write_stats().queued tells when), and releasing the lock lets them run as one batch.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <exception>
#include <functional>
#include <iostream>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.h"
#include "idem/stores/memory_store.h"
#include "idem/stores/sqlite_store.h"
#include "idem/testing/matchers.h"
#include "stores/sqlite/sqlite_test_util.h"
#include "stores/sqlite/sqlite_write_queue.h"
#include "support/eventually.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using sqlite::last_write_position;
using sqlite::WritePosition;
using testing::eventually;
using testing::fresh_db_path;
using ::testing::HasSubstr;
// The printers of idem/testing/matchers.h, called directly rather than through
// ::testing::PrintToString, so the text never depends on which instantiation of
// GoogleTest's printer the linker keeps.
template <typename T>
std::string printed(const T& value) {
  std::ostringstream os;
  PrintTo(value, &os);
  return os.str();
}
using testing::RawDb;

constexpr std::string_view kScope = "s";

std::shared_ptr<SqliteStore> make_store(const std::string& path,
                                        std::shared_ptr<const Clock> clock) {
  // A long busy timeout: a leader waits inside BEGIN for as long as a test holds the lock.
  return std::make_shared<SqliteStore>(
      SqliteStoreOptions{.path = path, .busy_timeout = 60s, .clock = std::move(clock)});
}

// One store call, with its inputs, what it returned (printed, so outcomes compare as text)
// and where the group commit applied it.
struct Call {
  enum class Kind { kAcquire, kComplete, kRelease, kExtend, kExtendMany, kForget, kPurge };
  Kind kind = Kind::kAcquire;
  std::string key;
  Token token = 0;
  Duration lease{10'000};
  Duration ttl{3'600'000};
  std::string payload;
  std::vector<std::pair<std::string, Token>> extends;  // extend_many: (key, token)

  Timestamp now{};      // the (fake) clock during the call
  std::string outcome;  // the result as the testing kit prints it, or "error: <what>"
  bool queued = false;  // applied in a batch (else an acquire answered by its first read)
  WritePosition position;
  // For an acquire answered by its first read: the batches it may have seen, by number.
  std::uint64_t first_batch = 0;
  std::uint64_t last_batch = 0;
};

std::string fingerprint_of(const std::string& key) { return "fp-" + key; }

// Runs `call` on `store` and fills in its outcome.
void perform(Store& store, Call& call) {
  try {
    switch (call.kind) {
      case Call::Kind::kAcquire:
        call.outcome = printed(
            store.acquire(kScope, call.key, call.lease, call.ttl, fingerprint_of(call.key)));
        break;
      case Call::Kind::kComplete:
        call.outcome =
            printed(store.complete(kScope, call.key, call.token, call.payload, call.ttl));
        break;
      case Call::Kind::kRelease:
        call.outcome = printed(store.release(kScope, call.key, call.token));
        break;
      case Call::Kind::kExtend:
        call.outcome = printed(store.extend(kScope, call.key, call.token, call.lease));
        break;
      case Call::Kind::kExtendMany: {
        std::vector<ExtendRequest> requests;
        for (const auto& [key, token] : call.extends) {
          requests.push_back({kScope, key, token, call.lease});
        }
        for (const ExtendResult& r : store.extend_many(requests)) {
          call.outcome += printed(r) + ";";
        }
        break;
      }
      case Call::Kind::kForget:
        call.outcome = store.forget(kScope, call.key) ? "forgot" : "nothing to forget";
        break;
      case Call::Kind::kPurge:
        call.outcome = "purged " + std::to_string(store.purge(1000));
        break;
    }
  } catch (const std::exception& e) {
    call.outcome = std::string("error: ") + e.what();
  }
}

// Runs `call` on the SQLite store and notes where it was applied: a call that went through
// the queue moved this thread's last write position to a new batch.
void perform_on(SqliteStore& store, const ManualClock& clock, Call& call) {
  const WritePosition before = last_write_position();
  call.now = clock.now();
  call.first_batch = store.write_stats().transactions;
  perform(store, call);
  // At most one batch is in flight at any moment, so a read cannot have seen a later one.
  call.last_batch = store.write_stats().transactions + 1;
  call.position = last_write_position();
  call.queued = call.position.batch != before.batch;
}

// What an acquire answered by its read alone (Busy or Replay) says about `record` at `now`;
// nullopt when that acquire would have had to write.
std::optional<std::string> read_answer(const std::optional<Record>& record, Timestamp now) {
  if (!record) return std::nullopt;
  if (record->state == RecordState::kComplete) {
    if (record->expires_at <= now) return std::nullopt;
    return printed(AcquireResult(
        Replay{record->payload, record->completed_at, record->expires_at, record->fingerprint}));
  }
  if (record->lease_expires_at <= now) return std::nullopt;
  return printed(AcquireResult(
      Busy{record->lease_expires_at, record->lease_expires_at - now, record->fingerprint}));
}

// Replays the calls that went through the queue, in the order the store applied them, on an
// in-memory store at the same instants, and expects the very same outcome from each. An
// acquire answered by its read must match the model's record at the end of some batch it
// may have seen. Counts in `shared` the calls that shared their batch with others.
void expect_same_as_sequential_model(std::vector<Call> calls, const std::vector<std::string>& keys,
                                     std::size_t* shared = nullptr) {
  std::vector<Call*> applied;
  std::vector<const Call*> reads;
  for (Call& c : calls) (c.queued ? applied.push_back(&c) : reads.push_back(&c));
  std::sort(applied.begin(), applied.end(), [](const Call* a, const Call* b) {
    return std::pair(a->position.batch, a->position.index) <
           std::pair(b->position.batch, b->position.index);
  });

  auto clock = std::make_shared<ManualClock>();
  MemoryStore model(MemoryStoreOptions{.clock = clock});
  // states[b]: each key's record in the model once the first b batches were applied.
  std::vector<std::map<std::string, std::optional<Record>>> states(1);
  for (const std::string& key : keys) states[0][key] = std::nullopt;
  if (shared != nullptr) *shared = 0;
  for (std::size_t i = 0; i < applied.size(); ++i) {
    Call& c = *applied[i];
    const std::uint64_t batch = states.size();
    // Every batch is accounted for, its calls at indices 0..size-1.
    ASSERT_EQ(c.position.batch, batch) << "a batch is missing or out of order";
    ASSERT_LT(c.position.index, c.position.batch_size);
    if (shared != nullptr && c.position.batch_size > 1) ++*shared;
    clock->set(c.now);
    Call expected = c;
    expected.outcome.clear();
    perform(model, expected);
    EXPECT_EQ(c.outcome, expected.outcome)
        << "call " << c.position.index << " of batch " << c.position.batch << " (of "
        << c.position.batch_size << ") on key " << c.key << " differs from the model";
    if (c.position.index + 1 == c.position.batch_size) {
      auto& state = states.emplace_back();
      for (const std::string& key : keys) {
        std::optional<Record> r = model.get(kScope, key);
        if (r) r->now = Timestamp{};
        state[key] = std::move(r);
      }
    }
  }
  for (const Call* c : reads) {
    bool matched = false;
    for (std::uint64_t b = c->first_batch; b <= c->last_batch && b < states.size(); ++b) {
      matched = matched || read_answer(states[b].at(c->key), c->now) == c->outcome;
    }
    EXPECT_TRUE(matched) << "an acquire answered by its read (" << c->outcome << ") on key "
                         << c->key << " matches no state between batches " << c->first_batch
                         << " and " << c->last_batch;
  }
}

// Holds the file's write lock from another connection until release().
class WriteLockHolder {
 public:
  explicit WriteLockHolder(const std::string& path) : raw_(path) { raw_.exec("BEGIN IMMEDIATE"); }
  ~WriteLockHolder() { release(); }
  void release() {
    if (held_) raw_.exec("ROLLBACK");
    held_ = false;
  }

 private:
  RawDb raw_;
  bool held_ = true;
};

// Runs calls[0] while another connection holds the write lock (so its leader waits in
// BEGIN), queues calls[1..] behind it one at a time, in order, then lets them all run.
void run_as_one_batch(SqliteStore& store, const ManualClock& clock, const std::string& path,
                      std::vector<Call>& calls) {
  const std::uint64_t transactions = store.write_stats().transactions;
  WriteLockHolder lock(path);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { perform_on(store, clock, calls[0]); });
  ASSERT_TRUE(eventually([&] { return store.write_stats().in_flight == 1; }));
  for (std::size_t i = 1; i < calls.size(); ++i) {
    threads.emplace_back([&, i] { perform_on(store, clock, calls[i]); });
    ASSERT_TRUE(eventually([&] { return store.write_stats().queued == i; }))
        << "call " << i << " did not queue";
  }
  lock.release();
  for (std::thread& t : threads) t.join();
  // The first call alone, then all the others in one transaction, in the order they queued.
  EXPECT_EQ(store.write_stats().transactions, transactions + 2);
  for (std::size_t i = 1; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].position.batch, calls[0].position.batch + 1) << "call " << i;
    EXPECT_EQ(calls[i].position.index, i - 1) << "call " << i;
    EXPECT_EQ(calls[i].position.batch_size, calls.size() - 1) << "call " << i;
  }
}

Call make_call(Call::Kind kind, std::string key, Token token = 0) {
  Call c;
  c.kind = kind;
  c.key = std::move(key);
  c.token = token;
  return c;
}
Call acquire(std::string key) { return make_call(Call::Kind::kAcquire, std::move(key)); }
Call complete(std::string key, Token token, std::string payload) {
  Call c = make_call(Call::Kind::kComplete, std::move(key), token);
  c.payload = std::move(payload);
  return c;
}
Call release(std::string key, Token token) {
  return make_call(Call::Kind::kRelease, std::move(key), token);
}
Call extend(std::string key, Token token) {
  return make_call(Call::Kind::kExtend, std::move(key), token);
}
Call extend_many(std::vector<std::pair<std::string, Token>> leases) {
  Call c = make_call(Call::Kind::kExtendMany, leases.front().first);
  c.extends = std::move(leases);
  return c;
}
Call forget(std::string key) { return make_call(Call::Kind::kForget, std::move(key)); }

// Every call of `calls` in order, on a fresh SQLite store and the model.
struct Scenario {
  std::string path = fresh_db_path("batch");
  std::shared_ptr<ManualClock> clock = std::make_shared<ManualClock>();
  std::shared_ptr<SqliteStore> store = make_store(path, clock);
  std::vector<Call> history;  // calls made one at a time before the batch

  Call& alone(Call c) {
    perform_on(*store, *clock, c);
    history.push_back(std::move(c));
    return history.back();
  }
};

TEST(SqliteGroupCommit, ABatchGivesEachOperationTheOutcomeItWouldHaveAlone) {
  Scenario s;
  s.alone(acquire("held"));
  s.alone(acquire("done"));
  s.alone(complete("done", 2, "first"));
  s.alone(acquire("stale"));
  s.clock->advance(11s);  // the lease on "stale" has passed; "held" is extended below
  s.alone(extend("held", 1));

  // Tokens come from one counter, so the batch's first acquire will be granted token 4.
  const Token next = 4;
  std::vector<Call> batch = {
      extend("held", 1),                // the leader, alone in its transaction
      acquire("new"),                   // fresh: token 4
      acquire("new"),                   // the same key again: Busy, by the write above
      complete("new", next, "result"),  // completes a lease granted in this very batch
      acquire("new"),                   // Replay of it
      complete("new", next, "result"),  // a repeated complete: done, changes nothing
      release("held", 1),               // deletes "held"
      extend("held", 1),                // fenced: released just before
      acquire("stale"),                 // steals: token 5, attempt 2
      complete("stale", 3, "late"),     // the old owner, fenced by the steal
      acquire("other"),                 // fresh: token 6
      extend_many({{"new", next}, {"stale", 5}, {"other", 6}, {"done", 2}}),
      forget("done"),
      complete("done", 2, "again"),  // fenced: forgotten just before
  };
  run_as_one_batch(*s.store, *s.clock, s.path, batch);
  EXPECT_THAT(batch[1].outcome, HasSubstr("token=4"));
  EXPECT_THAT(batch[2].outcome, HasSubstr("Busy"));
  EXPECT_THAT(batch[4].outcome, HasSubstr("Replay"));
  EXPECT_THAT(batch[8].outcome, HasSubstr("stolen=true, Lease{token=5, attempt=2"));
  EXPECT_EQ(batch[7].outcome, "ExtendResult{fenced}");
  EXPECT_EQ(batch[9].outcome, "fenced");
  EXPECT_THAT(batch[10].outcome, HasSubstr("token=6"));
  EXPECT_EQ(batch[13].outcome, "fenced");

  std::vector<Call> all = s.history;
  all.insert(all.end(), batch.begin(), batch.end());
  expect_same_as_sequential_model(all, {"held", "done", "stale", "new", "other"});
}

TEST(SqliteGroupCommit, ManyThreadsOnOverlappingKeysGetTheOutcomesOfASequentialOrder) {
  constexpr int kThreads = 8;
  constexpr int kPhases = 4;
  constexpr int kCallsPerPhase = 60;
  const std::vector<std::string> keys = {"a", "b", "c", "d", "e"};
  const std::string path = fresh_db_path("model");
  auto clock = std::make_shared<ManualClock>();
  auto store = make_store(path, clock);

  // Now and then another connection holds the write lock until a few writes have queued,
  // so batches of several form even on a machine so busy that the threads would otherwise
  // take turns on the CPU and each commit alone. Its waits are bounded so that it never
  // holds up the phases for long.
  std::atomic<bool> stop{false};
  std::thread blocker([&] {
    RawDb raw(path);
    while (!stop) {
      if (raw.exec("BEGIN IMMEDIATE", /*expect_ok=*/false) == SQLITE_OK) {
        eventually(
            [&] {
              const SqliteWriteStats w = store->write_stats();
              return stop || w.in_flight + w.queued >= 3;
            },
            100ms);
        raw.exec("ROLLBACK");
      }
      eventually([&] { return stop || store->write_stats().queued == 0; }, 100ms);
      std::this_thread::sleep_for(2ms);
    }
  });

  std::mutex mu;
  std::vector<Call> calls;
  // Between phases every lease passes (and short TTLs with them), so keys are stolen,
  // expire and are acquired again; inside a phase the clock stands still.
  auto phase_end = [&]() noexcept { clock->advance(11s); };
  std::barrier barrier(kThreads, phase_end);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 17u);
      std::vector<std::pair<std::string, Token>> leases;  // granted to this thread
      std::vector<Call> mine;
      auto pick_lease = [&]() -> std::pair<std::string, Token> {
        if (leases.empty() || rng() % 8 == 0) return {keys[rng() % keys.size()], rng() % 50};
        // Mostly the latest lease (usually still live), sometimes an older, stale one.
        return rng() % 3 != 0 ? leases.back() : leases[rng() % leases.size()];
      };
      for (int phase = 0; phase < kPhases; ++phase) {
        for (int i = 0; i < kCallsPerPhase; ++i) {
          Call c;
          const unsigned dice = rng() % 100;
          if (dice < 35) {
            c = acquire(keys[rng() % keys.size()]);
            c.ttl = rng() % 2 == 0 ? 5s : Duration(1h);
          } else if (dice < 55) {
            const auto [key, token] = pick_lease();
            c = complete(key, token, key + ":" + std::to_string(token));
            c.ttl = rng() % 2 == 0 ? 5s : Duration(1h);
          } else if (dice < 65) {
            const auto [key, token] = pick_lease();
            c = release(key, token);
          } else if (dice < 80) {
            const auto [key, token] = pick_lease();
            c = extend(key, token);
          } else if (dice < 88) {
            c = extend_many({pick_lease(), pick_lease(), pick_lease()});
          } else if (dice < 95) {
            c = forget(keys[rng() % keys.size()]);
          } else {
            c = make_call(Call::Kind::kPurge, keys.front());
          }
          perform_on(*store, *clock, c);
          if (c.kind == Call::Kind::kAcquire && c.outcome.starts_with("Acquired")) {
            const auto at = c.outcome.find("token=") + 6;
            leases.emplace_back(c.key, std::stoull(c.outcome.substr(at)));
          }
          mine.push_back(std::move(c));
        }
        barrier.arrive_and_wait();
      }
      std::lock_guard lock(mu);
      calls.insert(calls.end(), mine.begin(), mine.end());
    });
  }
  for (std::thread& t : threads) t.join();
  stop = true;
  blocker.join();

  for (const Call& c : calls) EXPECT_THAT(c.outcome, ::testing::Not(HasSubstr("error")));
  std::size_t shared = 0;
  expect_same_as_sequential_model(calls, keys, &shared);
  std::cout << "[ group commit ] " << calls.size() << " calls, " << shared
            << " of them in batches of several, " << store->write_stats().transactions
            << " transactions\n";
  // Eight threads writing while the lock is held queue behind each other.
  EXPECT_GT(shared, 0u);
  RawDb raw(path);
  EXPECT_EQ(raw.query_text("PRAGMA integrity_check"), "ok");
}

// --- An operation that fails inside a batch fails alone ---
//
// Two ways, taking the store's two paths: a trigger's RAISE(ABORT) undoes its statement and
// the store rolls back to the operation's savepoint, the transaction going on; SQLITE_FULL
// on an UPDATE makes SQLite roll back the whole transaction, so the store runs the batch's
// other operations again in a new one.

// Opens every new connection of this process with PRAGMA max_page_count = 1, which SQLite
// raises to the file's current size: the file cannot grow, as on a full disk.
class FullDisk {
 public:
  FullDisk() { sqlite3_auto_extension(reinterpret_cast<void (*)()>(&limit)); }
  ~FullDisk() { sqlite3_cancel_auto_extension(reinterpret_cast<void (*)()>(&limit)); }
  FullDisk(const FullDisk&) = delete;
  FullDisk& operator=(const FullDisk&) = delete;

 private:
  static int limit(sqlite3* db, const char** /*error*/, const void* /*api*/) {
    return sqlite3_exec(db, "PRAGMA max_page_count = 1", nullptr, nullptr, nullptr);
  }
};

enum class Failure { kConstraint, kFullDisk };

class SqliteGroupCommitFailure : public ::testing::TestWithParam<Failure> {};

TEST_P(SqliteGroupCommitFailure, FailsOnlyTheOperationThatFailed) {
  const std::string path = fresh_db_path("failure");
  auto clock = std::make_shared<ManualClock>();
  std::vector<Call> history;
  {
    auto store = make_store(path, clock);
    for (const char* key : {"a", "b", "c", "big"}) {
      Call c = acquire(key);
      perform_on(*store, *clock, c);
      history.push_back(std::move(c));
    }
  }
  // A payload needing about fifty overflow pages; a trigger refuses it when asked to.
  const std::string big(200'000, 'x');
  if (GetParam() == Failure::kConstraint) {
    RawDb(path).exec(
        "CREATE TRIGGER refuse BEFORE UPDATE OF payload ON idem_records "
        "WHEN length(NEW.payload) > 100000 BEGIN SELECT RAISE(ABORT, 'payload refused'); END");
  }
  std::optional<FullDisk> full;
  if (GetParam() == Failure::kFullDisk) full.emplace();
  auto store = make_store(path, clock);

  std::vector<Call> batch = {
      extend("a", 1),  // the leader, alone
      extend("a", 1),  // the batch: before the failure
      complete("b", 2, "small"),
      complete("big", 4, big),  // fails
      release("c", 3),          // after the failure
      acquire("d"),             // fresh: token 5
  };
  run_as_one_batch(*store, *clock, path, batch);
  const char* cause =
      GetParam() == Failure::kConstraint ? "payload refused" : "database or disk is full";
  EXPECT_THAT(batch[3].outcome, HasSubstr("error"));
  EXPECT_THAT(batch[3].outcome, HasSubstr(cause));
  for (std::size_t i : {0u, 1u}) EXPECT_THAT(batch[i].outcome, HasSubstr("{done")) << i;
  EXPECT_EQ(batch[2].outcome, "done");
  EXPECT_EQ(batch[4].outcome, "done");
  EXPECT_THAT(batch[5].outcome, HasSubstr("token=5"));

  // The others were committed; the failed one changed nothing.
  full.reset();
  EXPECT_THAT(store->get(kScope, "b"), testing::IsCompleteWith(Token{2}));
  EXPECT_EQ(store->get(kScope, "c"), std::nullopt);
  EXPECT_THAT(store->get(kScope, "big"), testing::IsInProgressWith(Token{4}));
  // The model agrees, with the failed call left out of its batch. The second store object
  // numbers its batches from 1 again: they follow the first one's.
  EXPECT_EQ(batch[3].position.batch, batch[1].position.batch);
  std::vector<Call> all = history;
  for (const Call& c : batch) {
    if (c.outcome.starts_with("error")) continue;
    Call& copy = all.emplace_back(c);
    copy.position.batch += history.size();
    if (c.position.batch != batch[3].position.batch) continue;
    if (c.position.index > batch[3].position.index) --copy.position.index;
    --copy.position.batch_size;
  }
  expect_same_as_sequential_model(all, {"a", "b", "c", "big", "d"});
  RawDb raw(path);
  EXPECT_EQ(raw.query_text("PRAGMA integrity_check"), "ok");
}

INSTANTIATE_TEST_SUITE_P(Sqlite, SqliteGroupCommitFailure,
                         ::testing::Values(Failure::kConstraint, Failure::kFullDisk),
                         [](const ::testing::TestParamInfo<Failure>& info) {
                           return info.param == Failure::kConstraint ? "Constraint" : "FullDisk";
                         });

// A batch that fails as a whole (its commit) fails each write in it with an error object of
// its own: one object rethrown in many threads is freed by whichever drops it last, unseen by
// ThreadSanitizer (stores/kit/own_copy.h).
TEST(SqliteWriteQueue, AFailedBatchFailsEachWriteWithAnErrorOfItsOwn) {
  constexpr std::size_t kFollowers = 4;
  std::atomic<int> applied{0};
  sqlite::WriteQueue* queue_of_apply = nullptr;
  sqlite::WriteQueue queue({}, [&](std::span<sqlite::QueuedWrite* const>) {
    if (applied++ == 0) {
      // The leader's own batch: hold it until the followers queue behind it.
      (void)eventually([&] { return queue_of_apply->counts().queued == kFollowers; });
      return;
    }
    throw StoreUnavailable("sqlite:///x.db", "disk I/O error");
  });
  queue_of_apply = &queue;

  std::thread leader([&] {
    sqlite::QueuedWrite w;
    queue.submit(w);
  });
  EXPECT_TRUE(eventually([&] { return applied.load() == 1; }));
  std::vector<std::exception_ptr> caught(kFollowers);
  std::vector<std::thread> followers;
  for (std::size_t i = 0; i < kFollowers; ++i) {
    followers.emplace_back([&, i] {
      sqlite::QueuedWrite w;
      try {
        queue.submit(w);
      } catch (const StoreUnavailable&) {
        caught[i] = std::current_exception();
      }
    });
  }
  leader.join();
  for (auto& f : followers) f.join();
  EXPECT_EQ(applied.load(), 2) << "the followers were not one batch";
  std::set<const void*> objects;
  for (const std::exception_ptr& p : caught) {
    ASSERT_TRUE(p) << "a write of the failed batch did not fail";
    try {
      std::rethrow_exception(p);
    } catch (const StoreUnavailable& e) {
      EXPECT_THAT(e.what(), HasSubstr("disk I/O error"));
      objects.insert(&e);
    }
  }
  EXPECT_EQ(objects.size(), kFollowers) << "writes share one exception object";
}

}  // namespace
}  // namespace idem
