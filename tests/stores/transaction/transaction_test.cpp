// SPEC §14: completion inside the caller's own transaction, on SQLite and (in the release
// build, with the test server) PostgreSQL. Every test is one case per store: the caller's
// connection is a real sqlite3* on the store's file, or a real PGconn* on the store's
// database, and the caller's own writes go to an `effects` table beside idem's records.

#include "idem/transaction.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.h"
#include "idem/executor.h"
#include "idem/open_store.h"
#include "idem/store_wrapper.h"
#include "idem/stores/memory_store.h"
#include "idem/stores/sqlite_store.h"
#include "stores/transaction/caller_conn.h"
#include "support/eventually.h"

#ifdef IDEM_TEST_WITH_POSTGRES
#include "idem/stores/postgres_store.h"
#include "stores/postgres/postgres_test_util.h"
#endif

namespace idem {
namespace {

using namespace std::chrono_literals;
using testing::CallerConn;
#ifdef IDEM_TEST_WITH_POSTGRES
using testing::PgConn;
#endif
using testing::SqliteConn;

// A database that holds the store's records and the caller's `effects` table.
class Database {
 public:
  virtual ~Database() = default;
  virtual std::shared_ptr<Store> store() = 0;
  virtual std::unique_ptr<CallerConn> connect() = 0;
  // The name of the caller's table in SQL.
  virtual std::string effects() const = 0;
};

// --- SQLite ------------------------------------------------------------------------------

class SqliteDatabase final : public Database {
 public:
  SqliteDatabase() {
    dir_ = std::filesystem::temp_directory_path() /
           ("idem_tx_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "app.db").string();
    // The application's database first, then idem's records beside its tables.
    SqliteConn(path_).exec("CREATE TABLE effects (k TEXT NOT NULL, v TEXT)");
    store_ = std::make_shared<SqliteStore>(SqliteStoreOptions{.path = path_, .shared = true});
  }
  ~SqliteDatabase() override {
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::shared_ptr<Store> store() override { return store_; }
  std::unique_ptr<CallerConn> connect() override { return std::make_unique<SqliteConn>(path_); }
  std::string effects() const override { return "effects"; }
  const std::string& path() const { return path_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  static inline std::atomic<int> counter_{0};
  std::filesystem::path dir_;
  std::string path_;
  std::shared_ptr<Store> store_;
};

// --- PostgreSQL --------------------------------------------------------------------------

#ifdef IDEM_TEST_WITH_POSTGRES
class PgDatabase final : public Database {
 public:
  PgDatabase() : table_(testing::fresh_table("tx")), effects_(table_ + "_effects") {
    store_ = std::make_shared<PostgresStore>(
        PostgresStoreOptions{.conninfo = testing::postgres_url(), .table = table_});
    PgConn(testing::postgres_url()).exec("CREATE TABLE " + effects_ + " (k text NOT NULL, v text)");
  }
  ~PgDatabase() override {
    store_.reset();
    PgConn c(testing::postgres_url());
    c.exec("DROP TABLE IF EXISTS " + effects_ + "; DROP TABLE IF EXISTS " + table_);
  }
  std::shared_ptr<Store> store() override { return store_; }
  std::unique_ptr<CallerConn> connect() override {
    return std::make_unique<PgConn>(testing::postgres_url());
  }
  std::string effects() const override { return effects_; }

 private:
  std::string table_;
  std::string effects_;
  std::shared_ptr<Store> store_;
};
#endif

std::unique_ptr<Database> open_database(const std::string& kind) {
#ifdef IDEM_TEST_WITH_POSTGRES
  if (kind == "postgres") return std::make_unique<PgDatabase>();
#endif
  (void)kind;
  return std::make_unique<SqliteDatabase>();
}

std::vector<std::string> kinds() {
  std::vector<std::string> out = {"sqlite"};
#ifdef IDEM_TEST_WITH_POSTGRES
  out.push_back("postgres");
#endif
  return out;
}

class TransactionTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    db_ = open_database(GetParam());
    caller_ = db_->connect();
  }

  ExecutorOptions options(Duration lease = 30s) {
    ExecutorOptions o;
    o.lease = lease;
    return o;
  }

  std::string insert_effect(const std::string& key, const std::string& v = "x") {
    return "INSERT INTO " + db_->effects() + " (k, v) VALUES ('" + key + "', '" + v + "')";
  }
  long long effects_of(const std::string& key) {
    return db_->connect()->count("SELECT count(*) FROM " + db_->effects() + " WHERE k = '" + key +
                                 "'");
  }
  std::optional<Record> record(std::string_view key) { return db_->store()->get("s", key); }

  std::unique_ptr<Database> db_;
  std::unique_ptr<CallerConn> caller_;
};

// Commit: the caller's effect and the COMPLETE record, together; waiters see the value.
TEST_P(TransactionTest, CommitRecordsTheResultWithTheEffects) {
  Executor exec(db_->store(), options());
  auto begun = exec.begin("s", "k1");
  ASSERT_EQ(begun.kind(), BeginKind::kAcquired);
  AttemptHandle<>& h = *begun.handle();
  const Token token = h.token();
  caller_->begin();
  caller_->exec(insert_effect("k1"));
  h.complete_in(caller_->conn(), "the result");
  EXPECT_TRUE(h.completing());
  // Nothing is visible before the commit: the record is still IN_PROGRESS to others.
  ASSERT_TRUE(record("k1"));
  EXPECT_EQ(record("k1")->state, RecordState::kInProgress);
  EXPECT_EQ(effects_of("k1"), 0);
  caller_->commit();
  Result<std::string> r = h.committed();
  EXPECT_EQ(r.value, "the result");
  EXPECT_FALSE(r.replayed);
  EXPECT_EQ(r.token, token);
  EXPECT_FALSE(h.active());
  const auto rec = record("k1");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->state, RecordState::kComplete);
  EXPECT_EQ(rec->token, token);
  EXPECT_EQ(rec->payload, "the result");
  EXPECT_EQ(effects_of("k1"), 1);
  // A duplicate replays it.
  auto again = exec.run("s", "k1", [](const Attempt&) -> std::string {
    ADD_FAILURE() << "ran twice";
    return "";
  });
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.value, "the result");
  EXPECT_EQ(exec.active_leases(), 0u);
}

// Rollback: neither the effect nor the COMPLETE record; the lease is still ours and the
// handle completes afterwards.
TEST_P(TransactionTest, RollbackLeavesTheRecordInProgressUnderTheSameToken) {
  Executor exec(db_->store(), options(3s));
  auto begun = exec.begin<int>("s", "k2");
  AttemptHandle<int>& h = *begun.handle();
  const Token token = h.token();
  caller_->begin();
  caller_->exec(insert_effect("k2"));
  h.complete_in(caller_->conn(), 7);
  caller_->rollback();
  h.rolled_back();
  EXPECT_TRUE(h.active());
  EXPECT_FALSE(h.completing());
  auto rec = record("k2");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->state, RecordState::kInProgress);
  EXPECT_EQ(rec->token, token);
  EXPECT_EQ(effects_of("k2"), 0);
  // The heartbeat extends the lease again, at once.
  const Timestamp before = rec->lease_expires_at;
  EXPECT_TRUE(testing::eventually([&] {
    const auto now = record("k2");
    return now && now->token == token && now->lease_expires_at > before;
  }));
  EXPECT_FALSE(h.lease_lost());
  // A second try commits.
  caller_->begin();
  caller_->exec(insert_effect("k2"));
  h.complete_in(caller_->conn(), 8);
  caller_->commit();
  EXPECT_EQ(h.committed().value, 8);
  EXPECT_EQ(record("k2")->payload, "8");
  EXPECT_EQ(effects_of("k2"), 1);
}

// A stale token: the write is fenced inside the transaction, before the caller commits.
TEST_P(TransactionTest, AStaleTokenIsFencedBeforeTheCallerCommits) {
  auto store = db_->store();
  Executor exec(store, options());
  auto begun = exec.begin("s", "k3");
  AttemptHandle<>& h = *begun.handle();
  // Another caller takes the key over behind the handle's back (an operator's forget, then
  // a fresh acquire: a new token).
  ASSERT_TRUE(store->forget("s", "k3"));
  const AcquireResult thief = store->acquire("s", "k3", 30s, 1h);
  ASSERT_TRUE(std::holds_alternative<Acquired>(thief));
  caller_->begin();
  caller_->exec(insert_effect("k3"));
  EXPECT_THROW(h.complete_in(caller_->conn(), "late"), LeaseLost);
  EXPECT_FALSE(h.active());
  caller_->rollback();
  EXPECT_EQ(effects_of("k3"), 0);
  const auto rec = record("k3");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->state, RecordState::kInProgress);
  EXPECT_EQ(rec->token, std::get<Acquired>(thief).lease.token);
}

// A COMMIT whose answer is not known: resolve() reads what happened from the record.
TEST_P(TransactionTest, ResolveSettlesACommitWhoseAnswerWasLost) {
  Executor exec(db_->store(), options());
  // It committed.
  {
    auto begun = exec.begin("s", "k4");
    AttemptHandle<>& h = *begun.handle();
    caller_->begin();
    caller_->exec(insert_effect("k4"));
    h.complete_in(caller_->conn(), "v4");
    caller_->commit();
    auto r = h.resolve();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->value, "v4");
    EXPECT_FALSE(h.active());
  }
  // It did not.
  {
    auto begun = exec.begin("s", "k5");
    AttemptHandle<>& h = *begun.handle();
    caller_->begin();
    caller_->exec(insert_effect("k5"));
    h.complete_in(caller_->conn(), "v5");
    caller_->rollback();
    EXPECT_FALSE(h.resolve().has_value());
    EXPECT_TRUE(h.active());
    EXPECT_EQ(record("k5")->state, RecordState::kInProgress);
    h.release();
    EXPECT_FALSE(record("k5"));
  }
  EXPECT_EQ(effects_of("k4"), 1);
  EXPECT_EQ(effects_of("k5"), 0);
}

// The store's own connection meets the caller's open transaction: a thief waits for it and
// then sees what it left (a replay after a commit), never a second lease beside it.
TEST_P(TransactionTest, AThiefWaitsForTheCallersTransaction) {
  auto store = db_->store();
  Executor exec(store, options(300ms));
  auto begun = exec.begin("s", "k6");
  AttemptHandle<>& h = *begun.handle();
  caller_->begin();
  caller_->exec(insert_effect("k6"));
  h.complete_in(caller_->conn(), "v6");
  // The lease runs out while the transaction is open (the heartbeat is suspended).
  std::this_thread::sleep_for(500ms);
  std::atomic<bool> done{false};
  AcquireResult seen = AcquireResult{Busy{}};
  std::thread thief([&] {
    seen = store->acquire("s", "k6", 30s, 1h);
    done = true;
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(done.load()) << "the thief did not wait for the caller's transaction";
  caller_->commit();
  thief.join();
  ASSERT_TRUE(std::holds_alternative<Replay>(seen));
  EXPECT_EQ(std::get<Replay>(seen).payload, "v6");
  EXPECT_EQ(h.committed().value, "v6");
}

// run_in_transaction: BEGIN, the action, the record and COMMIT; a duplicate replays.
TEST_P(TransactionTest, RunInTransactionCommitsOnceAndReplays) {
  Executor exec(db_->store(), options());
  int runs = 0;
  auto action = [&](const Attempt& a) {
    ++runs;
    caller_->exec(insert_effect("k7", std::to_string(a.token())));
    return std::string("done");
  };
  auto first = exec.run_in_transaction(caller_->conn(), "s", "k7", action);
  auto second = exec.run_in_transaction(caller_->conn(), "s", "k7", action);
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(first.replayed);
  EXPECT_TRUE(second.replayed);
  EXPECT_EQ(second.value, "done");
  EXPECT_EQ(effects_of("k7"), 1);
  EXPECT_EQ(record("k7")->state, RecordState::kComplete);
}

// An action that throws: its writes are rolled back and the key is free again.
TEST_P(TransactionTest, RunInTransactionRollsBackAThrowingAction) {
  Executor exec(db_->store(), options());
  EXPECT_THROW(exec.run_in_transaction(caller_->conn(), "s", "k8",
                                       [&](const Attempt&) -> std::string {
                                         caller_->exec(insert_effect("k8"));
                                         throw std::runtime_error("boom");
                                       }),
               std::runtime_error);
  EXPECT_EQ(effects_of("k8"), 0);
  EXPECT_FALSE(record("k8"));
  EXPECT_EQ(exec.active_leases(), 0u);
}

// A store whose COMMIT's answer is lost after the commit happened (or whose commit failed):
// run_in_transaction settles it from the record.
class LostCommitAnswer final : public StoreWrapper, public TransactionalStore {
 public:
  LostCommitAnswer(std::shared_ptr<Store> target, bool commit_first, SqlConnection::Kind kind)
      : StoreWrapper(std::move(target)), commit_first_(commit_first), kind_(kind) {}
  std::string describe() const override { return StoreWrapper::describe(); }
  TransactionalStore* transactions() noexcept override { return this; }

 protected:
  TransactionalStore& inner() { return *target().transactions(); }
  WriteResult do_complete_in(const SqlConnection& c, std::string_view s, std::string_view k,
                             Token t, std::string_view p, Duration ttl) override {
    return inner().complete_in(c, s, k, t, p, ttl);
  }
  AcquireResult do_acquire_in(const SqlConnection& c, std::string_view s, std::string_view k,
                              Duration l, Duration ttl, std::optional<std::string_view> f,
                              bool nowait) override {
    return inner().acquire_in(c, s, k, l, ttl, f, nowait);
  }
  void do_begin(const SqlConnection& c) override { inner().begin(c); }
  void do_commit(const SqlConnection& c) override {
    if (commit_first_) {
      inner().commit(c);
    } else {
      inner().rollback(c);
    }
    throw StoreUnavailable(describe(), "the COMMIT's answer was lost (injected)");
  }
  void do_rollback(const SqlConnection& c) noexcept override { inner().rollback(c); }
  void do_check_connection(const SqlConnection& c, ConnectionUse use) override {
    inner().check_connection(c, use);
  }
  bool do_outside_transaction(const SqlConnection& c) const noexcept override {
    return const_cast<LostCommitAnswer*>(this)->inner().outside_transaction(c);
  }
  SqlConnection::Kind connection_kind() const noexcept override { return kind_; }

 private:
  bool commit_first_;
  SqlConnection::Kind kind_;
};

TEST_P(TransactionTest, RunInTransactionSettlesALostCommitAnswerByReadingTheRecord) {
  const SqlConnection::Kind kind = caller_->conn().kind();
  {
    Executor exec(std::make_shared<LostCommitAnswer>(db_->store(), true, kind), options());
    auto r = exec.run_in_transaction(caller_->conn(), "s", "k9", [&](const Attempt&) {
      caller_->exec(insert_effect("k9"));
      return std::string("nine");
    });
    EXPECT_EQ(r.value, "nine");
    EXPECT_FALSE(r.replayed);
    EXPECT_EQ(record("k9")->state, RecordState::kComplete);
  }
  {
    Executor exec(std::make_shared<LostCommitAnswer>(db_->store(), false, kind), options());
    EXPECT_THROW(exec.run_in_transaction(caller_->conn(), "s", "k10",
                                         [&](const Attempt&) {
                                           caller_->exec(insert_effect("k10"));
                                           return std::string("ten");
                                         }),
                 StoreUnavailable);
    // Not committed: the record was released, so the next caller starts clean.
    EXPECT_FALSE(record("k10"));
  }
  EXPECT_EQ(effects_of("k9"), 1);
  EXPECT_EQ(effects_of("k10"), 0);
}

// One transaction for everything: commit records, rollback leaves nothing at all.
TEST_P(TransactionTest, OpenTransactionFormLeavesNothingBehindOnRollback) {
  Executor exec(db_->store(), options());
  caller_->begin();
  auto r = exec.run_in_open_transaction(caller_->conn(), "s", "k11", [&](const Attempt&) {
    caller_->exec(insert_effect("k11"));
    return 11;
  });
  EXPECT_EQ(r.value, 11);
  caller_->rollback();
  EXPECT_FALSE(record("k11"));
  EXPECT_EQ(effects_of("k11"), 0);

  caller_->begin();
  r = exec.run_in_open_transaction(caller_->conn(), "s", "k11", [&](const Attempt&) {
    caller_->exec(insert_effect("k11"));
    return 12;
  });
  caller_->commit();
  EXPECT_EQ(record("k11")->state, RecordState::kComplete);
  EXPECT_EQ(effects_of("k11"), 1);

  caller_->begin();
  r = exec.run_in_open_transaction(caller_->conn(), "s", "k11", [&](const Attempt&) -> int {
    ADD_FAILURE() << "ran twice";
    return 0;
  });
  caller_->commit();
  EXPECT_TRUE(r.replayed);
  EXPECT_EQ(r.value, 12);
  EXPECT_EQ(exec.active_leases(), 0u);
}

// A duplicate in another transaction waits for the first one and then replays its result.
TEST_P(TransactionTest, OpenTransactionDuplicateWaitsAndReplays) {
  Executor exec(db_->store(), options());
  caller_->begin();
  exec.run_in_open_transaction(caller_->conn(), "s", "k12", [&](const Attempt&) {
    caller_->exec(insert_effect("k12"));
    return std::string("first");
  });
  std::atomic<bool> done{false};
  Result<std::string> seen;
  std::thread other([&] {
    auto conn = db_->connect();
    conn->begin();  // SQLite waits here; PostgreSQL under the call's waiting policy
    CallOptions wait;
    wait.wait = WaitPolicy{.max_wait = 20s};
    seen = exec.run_in_open_transaction(
        conn->conn(), "s", "k12",
        [&](const Attempt&) {
          conn->exec(insert_effect("k12"));
          return std::string("second");
        },
        wait);
    conn->commit();
    done = true;
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(done.load());
  caller_->commit();
  other.join();
  EXPECT_TRUE(seen.replayed);
  EXPECT_EQ(seen.value, "first");
  EXPECT_EQ(effects_of("k12"), 1);
}

// One waiting policy for every form: with none (the executor's default), a duplicate in
// another transaction answers InProgress at once instead of waiting (PostgreSQL; SQLite's
// duplicate waits at its BEGIN IMMEDIATE, before idem is called).
TEST_P(TransactionTest, OpenTransactionWithoutAWaitingPolicyAnswersBusyAtOnce) {
  if (caller_->conn().kind() != SqlConnection::Kind::kPostgres) {
    GTEST_SKIP() << "SQLite has no row locks: a duplicate waits at its BEGIN IMMEDIATE";
  }
  Executor exec(db_->store(), options());
  caller_->begin();
  exec.run_in_open_transaction(caller_->conn(), "s", "k15", [&](const Attempt&) {
    caller_->exec(insert_effect("k15"));
    return std::string("first");
  });
  auto other = db_->connect();
  other->begin();
  const auto started = std::chrono::steady_clock::now();
  EXPECT_THROW(exec.run_in_open_transaction(other->conn(), "s", "k15",
                                            [&](const Attempt&) -> std::string {
                                              ADD_FAILURE() << "ran beside the first";
                                              return "second";
                                            }),
               InProgress);
  // At once: not after the caller's statement or lock timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
  other->rollback();
  // With a bound too short for the first to end: InProgress once it runs out.
  other->begin();
  CallOptions brief;
  brief.wait = WaitPolicy{.max_wait = 200ms};
  EXPECT_THROW(
      exec.run_in_open_transaction(
          other->conn(), "s", "k15", [&](const Attempt&) { return std::string("x"); }, brief),
      InProgress);
  other->rollback();
  caller_->commit();
  EXPECT_EQ(effects_of("k15"), 1);
}

// The refusals: a store that cannot join, a connection of the other kind or outside a
// transaction. Nothing is acquired by a refused call.
TEST_P(TransactionTest, RefusalsAreClearAndTouchNothing) {
  Executor memory(std::make_shared<MemoryStore>(), options());
  try {
    memory.run_in_transaction(caller_->conn(), "s", "k13", [](const Attempt&) { return 1; });
    ADD_FAILURE() << "the memory store joined a SQL transaction";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot join"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(memory.store().get("s", "k13"));
  caller_->begin();
  EXPECT_THROW(
      memory.run_in_open_transaction(caller_->conn(), "s", "k13", [](const Attempt&) { return 1; }),
      InvalidArgument);
  caller_->rollback();

  Executor exec(db_->store(), options());
  auto begun = exec.begin("s", "k14");
  AttemptHandle<>& h = *begun.handle();
  // Not in a transaction: refused, the handle unchanged.
  EXPECT_THROW(h.complete_in(caller_->conn(), "v"), InvalidArgument);
  EXPECT_TRUE(h.active());
  EXPECT_FALSE(h.completing());
  // The other kind of connection.
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(":memory:", &other), SQLITE_OK);
  EXPECT_THROW(h.complete_in(SqlConnection::sqlite(other), "v"), InvalidArgument);
  sqlite3_exec(other, "BEGIN", nullptr, nullptr, nullptr);
  EXPECT_THROW(h.complete_in(SqlConnection::sqlite(other), "v"), InvalidArgument);
  sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close_v2(other);
  EXPECT_TRUE(h.active());
  EXPECT_THROW(h.committed(), std::logic_error);
  EXPECT_THROW(SqlConnection::postgres(nullptr), InvalidArgument);
  // The lease still works the usual way.
  EXPECT_EQ(h.complete("plain").value, "plain");
}

// An application's own SQLite database: refused as it is (not idem's file), taken with
// shared=1, which leaves the application's header alone.
TEST(SqliteSharedFile, IdemTablesJoinTheApplicationsDatabase) {
  SqliteDatabase scratch;  // for its temporary folder
  const std::string path = (scratch.dir() / "their.db").string();
  SqliteConn(path).exec("PRAGMA application_id = 42; CREATE TABLE orders (id INTEGER)");
  try {
    SqliteStore refused(SqliteStoreOptions{.path = path});
    ADD_FAILURE() << "a file with the application's tables was taken as idem's own";
  } catch (const StoreUnavailable& e) {
    EXPECT_NE(std::string(e.what()).find("shared=1"), std::string::npos) << e.what();
  }
  auto store = open_store("sqlite://" + path + "?shared=1");
  auto acquired = store->acquire("s", "k", 30s, 1h);
  ASSERT_TRUE(std::holds_alternative<Acquired>(acquired));
  SqliteConn app(path);
  EXPECT_EQ(app.count("PRAGMA application_id"), 42);
  EXPECT_EQ(app.count("SELECT count(*) FROM idem_records"), 1);
  // Opened again, shared, it is the same store.
  auto again = open_store("sqlite://" + path + "?shared=1");
  EXPECT_TRUE(std::holds_alternative<Busy>(again->acquire("s", "k", 30s, 1h)));
}

// Issue 36: a connection already inside a transaction is refused by run_in_transaction at
// once (SQLite: before the store's own write waits out its busy timeout on the caller's
// lock), with nothing acquired.
TEST_P(TransactionTest, RunInTransactionRefusesAConnectionInATransactionBeforeAcquiring) {
  Executor exec(db_->store(), options());
  caller_->begin();
  const auto started = std::chrono::steady_clock::now();
  try {
    exec.run_in_transaction(caller_->conn(), "s", "k20", [&](const Attempt&) -> std::string {
      ADD_FAILURE() << "ran";
      return "";
    });
    ADD_FAILURE() << "a connection inside a transaction was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("inside a transaction already"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
  caller_->rollback();
  EXPECT_FALSE(record("k20"));
  EXPECT_EQ(exec.active_leases(), 0u);
}

// Issue 36: an action that commits the transaction run_in_transaction began: its writes are
// durable without the record, so the key is kept (never released): IN_PROGRESS under the
// same lease until it runs out, then taken over as attempt 2, stolen. No second run slips
// in meanwhile.
TEST_P(TransactionTest, AnActionThatCommitsItselfKeepsTheKeyUntilItsLeaseRunsOut) {
  Executor exec(db_->store(), options(1500ms));
  Token token = 0;
  try {
    exec.run_in_transaction(caller_->conn(), "s", "k21", [&](const Attempt& a) {
      token = a.token();
      caller_->exec(insert_effect("k21"));
      caller_->commit();  // the action ends the transaction itself
      return std::string("done");
    });
    ADD_FAILURE() << "an action that committed was recorded";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "action");
    EXPECT_NE(std::string(e.what()).find("the key is kept"), std::string::npos) << e.what();
  }
  EXPECT_EQ(effects_of("k21"), 1);
  auto rec = record("k21");
  ASSERT_TRUE(rec) << "the record was released: the next caller would run the action again";
  EXPECT_EQ(rec->state, RecordState::kInProgress);
  EXPECT_EQ(rec->token, token);
  EXPECT_EQ(exec.active_leases(), 0u);  // abandoned: no heartbeat keeps it alive
  // Busy until the lease runs out...
  EXPECT_THROW(exec.run("s", "k21", [](const Attempt&) { return std::string("again"); }),
               InProgress);
  // ...then a marked takeover.
  std::this_thread::sleep_for(1600ms);
  auto r = exec.run("s", "k21", [](const Attempt& a) {
    EXPECT_TRUE(a.stolen());
    EXPECT_EQ(a.number(), 2u);
    return std::string("taken over");
  });
  EXPECT_FALSE(r.replayed);
  EXPECT_TRUE(r.stolen);
}

// The same when the action ends the transaction and then throws: its exception goes
// through, and the key is kept rather than released.
TEST_P(TransactionTest, AnActionThatRollsBackItselfAndThrowsKeepsTheKey) {
  Executor exec(db_->store(), options(30s));
  EXPECT_THROW(exec.run_in_transaction(caller_->conn(), "s", "k22",
                                       [&](const Attempt&) -> std::string {
                                         caller_->rollback();
                                         throw std::runtime_error("boom");
                                       }),
               std::runtime_error);
  auto rec = record("k22");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->state, RecordState::kInProgress);
  EXPECT_EQ(exec.active_leases(), 0u);
}

// Issue 36: every transactional form refuses a caller's connection on another database
// that has an idem table of its own, before anything is acquired in either: nothing runs,
// no record is left in the store's database nor in the other one. `other` is the other
// database's store (its table made), `conn` a caller's connection on it.
void expect_other_database_refused(Executor& exec, Store& other, CallerConn& conn,
                                   const std::string& key) {
  const auto refused = [&](const std::function<void()>& call, const char* form) {
    try {
      call();
      ADD_FAILURE() << form << " took a connection on another database";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), "connection") << form << ": " << e.what();
    }
  };
  auto never = [&](const Attempt&) -> std::string {
    ADD_FAILURE() << "the action ran";
    return "x";
  };
  refused([&] { exec.run_in_transaction(conn.conn(), "s", key, never); }, "run_in_transaction");
  conn.begin();
  refused([&] { exec.run_in_open_transaction(conn.conn(), "s", key, never); },
          "run_in_open_transaction");
  auto begun = exec.begin("s", key);
  ASSERT_EQ(begun.kind(), BeginKind::kAcquired);
  AttemptHandle<>& h = *begun.handle();
  refused([&] { h.complete_in(conn.conn(), "v"); }, "complete_in");
  EXPECT_TRUE(h.active());
  EXPECT_FALSE(h.completing());
  conn.rollback();
  h.release();
  EXPECT_FALSE(exec.store().get("s", key)) << "a record was left in the store's database";
  EXPECT_FALSE(other.get("s", key)) << "a record was written in the other database";
}

TEST(OtherDatabase, SqliteRefusesAConnectionOnAnotherFileWithItsOwnIdemTable) {
  SqliteDatabase a;
  SqliteDatabase b;  // its own effects table and idem records
  Executor exec(a.store());
  auto conn = b.connect();
  expect_other_database_refused(exec, *b.store(), *conn, "k1");
  // A link to the other file is still the other file; one to the store's own is its own.
  const auto link = a.dir() / "link.db";
  std::filesystem::create_symlink(b.path(), link);
  SqliteConn linked(link.string());
  expect_other_database_refused(exec, *b.store(), linked, "k2");
  const auto own_link = a.dir() / "own.db";
  std::filesystem::create_symlink(a.path(), own_link);
  SqliteConn own(own_link.string());
  auto r = exec.run_in_transaction(own.conn(), "s", "k3", [](const Attempt&) { return 3; });
  EXPECT_EQ(r.value, 3);
}

TEST(OtherDatabase, ReadOnlySqliteStoreSaysItIsReadOnly) {
  SqliteDatabase db;
  Executor exec(std::make_shared<SqliteStore>(
      SqliteStoreOptions{.path = db.path(), .read_only = true, .shared = true}));
  auto conn = db.connect();
  try {
    exec.run_in_transaction(conn->conn(), "s", "k", [](const Attempt&) { return 1; });
    ADD_FAILURE() << "a read-only store joined a transaction";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("read-only"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("not in a SQL database"), std::string::npos) << e.what();
  }
}

// SQLite's run_in_transaction takes this process's turn to write the file (so that its
// writers take turns without SQLite's sleeping busy handler): an action that writes through
// the same store inside its transaction waits for itself, and fails after the busy timeout
// as before, instead of hanging.
TEST(SqliteWriteTurns, AnActionThatWritesThroughTheStoreInsideItsTransactionFailsNotHangs) {
  SqliteDatabase db;
  auto store = std::make_shared<SqliteStore>(
      SqliteStoreOptions{.path = db.path(), .busy_timeout = Duration{200}, .shared = true});
  Executor exec(store);
  auto conn = db.connect();
  try {
    (void)exec.run_in_transaction(conn->conn(), "s", "outer", [&](const Attempt&) {
      return exec.run("s", "inner", [](const Attempt&) { return std::string("inner"); }).value;
    });
    ADD_FAILURE() << "an action that writes through the store inside its transaction succeeded";
  } catch (const StoreUnavailable& e) {
    std::cerr << "as expected: " << e.what() << "\n";
  }
  // Both turns were given back: the store writes again at once.
  EXPECT_EQ(exec.run("s", "after", [](const Attempt&) { return std::string("v"); }).value, "v");
  auto r = exec.run_in_transaction(conn->conn(), "s", "outer", [](const Attempt&) { return 1; });
  EXPECT_EQ(r.value, 1);
}

#ifdef IDEM_TEST_WITH_POSTGRES
// The test server's URL with another database name.
std::string with_database(std::string url, const std::string& db) {
  const std::size_t query = url.find('?');
  std::string tail = query == std::string::npos ? "" : url.substr(query);
  if (query != std::string::npos) url.resize(query);
  url.resize(url.rfind('/') + 1);
  return url + db + tail;
}

// Database B beside the test database A, with an idem table of the same name as the
// store's on A (its own store opened there) and the caller's effects table.
class OtherPgDatabase {
 public:
  explicit OtherPgDatabase(const std::string& table)
      : name_("idem_other_" + std::to_string(::getpid())) {
    PgConn admin(testing::postgres_url());
    admin.exec("DROP DATABASE IF EXISTS " + name_);
    admin.exec("CREATE DATABASE " + name_);
    store_ = std::make_shared<PostgresStore>(
        PostgresStoreOptions{.conninfo = url(testing::postgres_url()), .table = table});
  }
  ~OtherPgDatabase() {
    store_.reset();
    try {
      PgConn(testing::postgres_url()).exec("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)");
    } catch (...) {
    }
  }
  std::string url(const std::string& server) const { return with_database(server, name_); }
  Store& store() { return *store_; }

 private:
  std::string name_;
  std::shared_ptr<Store> store_;
};

// The complete written in the caller's transaction sends no notification itself (its commit
// would hold the server's notification-queue lock through the flush, one caller after
// another); the executor sends it once the commit is reported. A waiter in another process
// (here: another store object, whose polls are an hour apart) is woken by it.
TEST(PostgresTransactionNotify, AWaiterIsWokenOnceRunInTransactionCommits) {
  const std::string table = testing::fresh_table("txn");
  auto owner_store = std::make_shared<PostgresStore>(
      PostgresStoreOptions{.conninfo = testing::postgres_url(), .table = table});
  auto waiter_store = std::make_shared<PostgresStore>(
      PostgresStoreOptions{.conninfo = testing::postgres_url(), .table = table});
  // An hour's lease: the waiter's sleep is bounded by the owner's lease deadline too.
  Executor owner(owner_store, ExecutorOptions{.lease = 1h});
  Executor waiter(waiter_store);
  PgConn conn(testing::postgres_url());
  std::atomic<bool> acting{false};
  std::atomic<bool> finish{false};
  auto first = std::async(std::launch::async, [&] {
    return owner
        .run_in_transaction(conn.conn(), "s", "k",
                            [&](const Attempt&) {
                              acting = true;
                              while (!finish) std::this_thread::sleep_for(5ms);
                              return std::string("first");
                            })
        .value;
  });
  ASSERT_TRUE(testing::eventually([&] { return acting.load(); }));
  CallOptions patient;
  patient.wait =
      WaitPolicy{.max_wait = 1h, .initial_backoff = 1h, .max_backoff = 1h, .watched_backoff = 1h};
  auto second = std::async(std::launch::async, [&] {
    return waiter.run(
        "s", "k", [](const Attempt&) { return std::string("second"); }, patient);
  });
  // The waiter asked, found the lease and watches; only a notification can end its wait.
  ASSERT_TRUE(testing::eventually([&] {
    const PostgresListenerStats l = waiter_store->listener_stats();
    return l.watches == 1 && l.listening;
  }));
  finish = true;
  EXPECT_EQ(first.get(), "first");
  const bool woken = second.wait_for(30s) == std::future_status::ready;
  if (!woken) waiter.shutdown(Duration{0});  // ends the wait (ShutDown), so nothing hangs
  ASSERT_TRUE(woken) << "the waiter was not woken after the commit";
  auto r = second.get();
  EXPECT_TRUE(r.replayed);
  EXPECT_EQ(r.value, "first");
  PgConn(testing::postgres_url()).exec("DROP TABLE IF EXISTS " + table);
}

// A read-only caller's transaction cannot carry the record: InvalidArgument naming the
// connection, and nothing is written (the caller rolls back).
TEST(PostgresReadOnlyCaller, AReadOnlyTransactionIsRefusedAsTheCallersNotAnOutage) {
  const std::string table = testing::fresh_table("txro");
  auto store = std::make_shared<PostgresStore>(
      PostgresStoreOptions{.conninfo = testing::postgres_url(), .table = table});
  Executor exec(store);
  PgConn conn(testing::postgres_url());
  conn.exec("BEGIN READ ONLY");
  try {
    exec.run_in_open_transaction(conn.conn(), "s", "k", [](const Attempt&) { return 1; });
    ADD_FAILURE() << "a read-only transaction carried the record";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "connection");
    EXPECT_THAT(e.what(), ::testing::HasSubstr("read-only"));
  }
  conn.rollback();
  conn.exec("SET default_transaction_read_only = on");
  EXPECT_THROW(exec.run_in_transaction(conn.conn(), "s", "k2", [](const Attempt&) { return 2; }),
               InvalidArgument);
  conn.exec("SET default_transaction_read_only = off");
  EXPECT_FALSE(store->get("s", "k"));
  EXPECT_FALSE(store->get("s", "k2")) << "a lease was left behind";
  EXPECT_EQ(exec.active_leases(), 0u);
  PgConn(testing::postgres_url()).exec("DROP TABLE IF EXISTS " + table);
}

TEST(OtherDatabase, PostgresRefusesAConnectionOnAnotherDatabaseWithItsOwnIdemTable) {
  const std::string table = testing::fresh_table("xdb");
  auto store = std::make_shared<PostgresStore>(
      PostgresStoreOptions{.conninfo = testing::postgres_url(), .table = table});
  OtherPgDatabase other(table);
  Executor exec(store);
  PgConn direct(other.url(testing::postgres_url()));
  expect_other_database_refused(exec, other.store(), direct, "k1");
  // Behind PgBouncer (both pooling modes), where the connection's own name says nothing.
  int through = 0;
  for (const char* env : {"IDEM_TEST_PGBOUNCER_TX_URL", "IDEM_TEST_PGBOUNCER_SESSION_URL"}) {
    const char* bouncer = std::getenv(env);
    if (bouncer == nullptr || *bouncer == '\0') continue;
    ++through;
    PgConn pooled(other.url(bouncer));
    expect_other_database_refused(exec, other.store(), pooled, std::string("k-") + env);
    // The store's own database through the same pooler is taken.
    PgConn own(bouncer);
    auto r = exec.run_in_transaction(own.conn(), "s", std::string("own-") + env,
                                     [](const Attempt&) { return 7; });
    EXPECT_EQ(r.value, 7);
  }
  if (std::getenv("IDEM_REQUIRE_SERVERS") != nullptr) {
    EXPECT_EQ(through, 2) << "the PgBouncer URLs were not set";
  }
  PgConn(testing::postgres_url()).exec("DROP TABLE IF EXISTS " + table);
}
#endif

INSTANTIATE_TEST_SUITE_P(Stores, TransactionTest, ::testing::ValuesIn(kinds()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace idem
