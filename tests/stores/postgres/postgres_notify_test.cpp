// SPEC §7 on PostgreSQL: a duplicate waiting in another process (or on another store
// object) wakes when the owner completes, releases or forgets, through LISTEN/NOTIFY
// (stores/postgres/postgres_listener.h); thousands of watches share one listening
// connection; a killed listening connection is made again and its waiters still answer;
// notify=off, a read-only store and a transaction pooler without listen= give no watch. The
// waiting workers poll once an hour: only a notification (or the wake-up of every watch
// after the listener connects) can end their wait before the test's bound. The shared suite
// also runs with notify=on.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"
#include "idem/stores/postgres_store.h"
#include "idem/testing/matchers.h"  // gtest printers for the store results (ODR)
#include "idem/testing/store_conformance.h"
#include "stores/postgres/postgres_listener.h"
#include "stores/postgres/postgres_schema.h"
#include "stores/postgres/postgres_test_util.h"
#include "support/eventually.h"
#include "support/threads.h"
#include "support/worker_process.h"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr const char* kHour = "3600000";

// The shared suite, unchanged, with every write also notifying.
std::shared_ptr<Store> fresh_notifying_store() {
  PostgresStoreOptions o;
  o.notify = true;
  return fresh_postgres_store(std::move(o));
}

IDEM_INSTANTIATE_STORE_CONFORMANCE(
    PostgresNotifyOn,
    StoreTestContext{.name = "postgres_notify",
                     .make = [](std::shared_ptr<ManualClock>) { return fresh_notifying_store(); },
                     .fake_clock = false,
                     .tick = Duration{200}});

std::string with_param(const std::string& url, const std::string& param) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") + param;
}

// An application_name no other test (in any process) uses, so that pg_stat_activity shows
// this test's connections alone.
std::string fresh_application_name() {
  static std::atomic<int> counter{0};
  return "idemnotify_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
}

// The server processes whose application_name is `name`.
int backends_named(const std::string& name) {
  RawPg raw(postgres_url());
  return std::stoi(
      raw.value("SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + name + "'"));
}

// The store's listener threads in this process, by the name it gives them.
std::size_t listener_threads() { return threads_named("idem-pg-listen"); }

Token hold(Store& store, const std::string& key) {
  AcquireResult r = store.acquire("mp", key, 10min, 1h);
  EXPECT_TRUE(std::holds_alternative<Acquired>(r));
  return std::holds_alternative<Acquired>(r) ? std::get<Acquired>(r).lease.token : 0;
}

// A watch that counts its wake-ups.
struct Counted {
  std::atomic<int> woken{0};
  std::unique_ptr<RecordWatch> watch;
  Counted(Store& store, const std::string& scope, const std::string& key) {
    watch = store.watch(scope, key, [this] { ++woken; });
  }
};

// Waits until the store's listener listens and has woken every watch once for connecting
// (postgres_listener.h), so that later wake-ups come from notifications.
bool listening(const PostgresStore& store) {
  return eventually([&] { return store.listener_stats().listening; });
}

// A fresh table and the URL that opens it with notify=on; the table is dropped at the end.
class PostgresNotify : public ::testing::Test {
 protected:
  void TearDown() override { drop_table(postgres_url(), table_); }

  std::string url(const std::string& extra = "notify=on") const {
    return with_param(with_param(postgres_url(), "table=" + table_), extra);
  }

  PostgresStoreOptions options(const std::string& conninfo = postgres_url()) const {
    return PostgresStoreOptions{.conninfo = conninfo, .table = table_, .notify = true};
  }

  // The owner (this process) holds "job" while a waiter in another process, opened with
  // `waiter_params` and polling every `backoff_ms`, waits for it; `meanwhile` runs once the
  // store answered the waiter busy `busy` times, then `finish` ends the owner's lease.
  // Returns the waiter's answer. With a listener, the third busy answer comes after it
  // listens (it wakes every watch once then), so only a notification can bring a fourth
  // call before the next poll.
  template <typename Finish, typename Meanwhile>
  std::string wait_in_another_process(const std::string& waiter_params, const char* backoff_ms,
                                      const char* busy, Finish finish, Meanwhile meanwhile) {
    PostgresStore owner(options());
    const Token token = hold(owner, "job");
    Worker waiter({"wait", url(waiter_params), "job", backoff_ms, busy});
    EXPECT_EQ(waiter.read_line(), "waiting");
    meanwhile();
    EXPECT_EQ(finish(owner, token), WriteResult::kDone);
    std::string answer = waiter.read_line();
    EXPECT_EQ(waiter.wait(), 0);
    return answer;
  }

  static WriteResult complete(Store& owner, Token token) {
    return owner.complete("mp", "job", token, "first", 1h);
  }

  std::string table_ = fresh_table("notify");
};

TEST_F(PostgresNotify, AWaiterInAnotherProcessWakesWhenTheOwnerCompletes) {
  EXPECT_EQ(wait_in_another_process("notify=on", kHour, "3", complete, [] {}),
            "replay first acquires=4");
}

TEST_F(PostgresNotify, AWaiterInAnotherProcessWakesWhenTheOwnerReleases) {
  const auto release = [](Store& owner, Token token) { return owner.release("mp", "job", token); };
  EXPECT_EQ(wait_in_another_process("notify=on", kHour, "3", release, [] {}), "ran acquires=4");
  EXPECT_EQ(PostgresStore(options()).get("mp", "job")->payload, "mine");
}

TEST_F(PostgresNotify, WatchesOfAnotherStoreWakeOnCompleteReleaseAndForgetOfTheirRecordOnly) {
  PostgresStore watcher(options());
  PostgresStore writer(options());
  Counted job(watcher, "mp", "job");
  Counted other(watcher, "mp", "other");
  ASSERT_NE(job.watch, nullptr);
  ASSERT_TRUE(listening(watcher));
  // Connecting woke both once; from now on only notifications do.
  ASSERT_TRUE(eventually([&] { return job.woken.load() == 1 && other.woken.load() == 1; }));

  Token token = hold(writer, "job");
  ASSERT_EQ(writer.complete("mp", "job", token, "done", 1h), WriteResult::kDone);
  EXPECT_TRUE(eventually([&] { return job.woken.load() == 2; })) << job.woken.load();
  ASSERT_TRUE(writer.forget("mp", "job"));
  EXPECT_TRUE(eventually([&] { return job.woken.load() == 3; })) << job.woken.load();
  token = hold(writer, "job");
  ASSERT_EQ(writer.release("mp", "job", token), WriteResult::kDone);
  EXPECT_TRUE(eventually([&] { return job.woken.load() == 4; })) << job.woken.load();
  // An acquire and a fenced complete send nothing; the next notification is the forget's.
  token = hold(writer, "job");
  ASSERT_EQ(writer.complete("mp", "job", token + 1, "x", 1h), WriteResult::kFenced);
  ASSERT_TRUE(writer.forget("mp", "job"));
  EXPECT_TRUE(eventually([&] { return job.woken.load() == 5; })) << job.woken.load();
  EXPECT_EQ(watcher.listener_stats().notifications, 4U);
  EXPECT_EQ(other.woken.load(), 1);
  EXPECT_EQ(watcher.listener_stats().connects, 1U);
}

TEST_F(PostgresNotify, ThousandsOfWatchesOnOneKeyShareOneListeningConnection) {
  const std::string app = fresh_application_name();
  PostgresStore watcher(options(with_param(postgres_url(), "application_name=" + app)));
  PostgresStore writer(options());
  const Token token = hold(writer, "hot");
  EXPECT_EQ(listener_threads(), 0U);
  EXPECT_EQ(watcher.listener_stats().connects, 0U);
  std::vector<std::unique_ptr<Counted>> watches;
  for (int i = 0; i < 2000; ++i) {
    watches.push_back(std::make_unique<Counted>(watcher, "mp", "hot"));
    ASSERT_NE(watches.back()->watch, nullptr);
  }
  ASSERT_TRUE(listening(watcher));
  const auto all_woken = [&](int n) {
    for (const auto& w : watches) {
      if (w->woken.load() != n) return false;
    }
    return true;
  };
  ASSERT_TRUE(eventually([&] { return all_woken(1); }));

  const PostgresListenerStats stats = watcher.listener_stats();
  EXPECT_EQ(stats.connects, 1U);
  EXPECT_EQ(stats.watches, 2000U);
  EXPECT_EQ(listener_threads(), 1U);
  EXPECT_EQ(backends_named(app + "-listen"), 1);
  RawPg raw(postgres_url());
  EXPECT_EQ(raw.value("SELECT application_name FROM pg_stat_activity WHERE pid = " +
                      std::to_string(stats.backend_pid)),
            app + "-listen");

  ASSERT_EQ(writer.complete("mp", "hot", token, "done", 1h), WriteResult::kDone);
  EXPECT_TRUE(eventually([&] { return all_woken(2); }));
  EXPECT_EQ(watcher.listener_stats().notifications, 1U);
  watches.clear();
  EXPECT_EQ(watcher.listener_stats().watches, 0U);
  // The connection stays for the next waiter.
  EXPECT_EQ(backends_named(app + "-listen"), 1);
}

TEST_F(PostgresNotify, AKilledListeningConnectionIsMadeAgainAndWakesEveryWatch) {
  PostgresStore watcher(options());
  PostgresStore writer(options());
  Counted job(watcher, "mp", "job");
  ASSERT_TRUE(listening(watcher));
  ASSERT_TRUE(eventually([&] { return job.woken.load() == 1; }));
  const int first_pid = watcher.listener_stats().backend_pid;
  ASSERT_NE(first_pid, 0);

  RawPg raw(postgres_url());
  EXPECT_EQ(raw.value("SELECT pg_terminate_backend(" + std::to_string(first_pid) + ")"), "t");
  // Notifications sent while it was down are lost: every watch is woken once it listens
  // again.
  EXPECT_TRUE(eventually([&] { return watcher.listener_stats().reconnects == 1; }));
  EXPECT_TRUE(eventually([&] { return job.woken.load() == 2; })) << job.woken.load();
  const PostgresListenerStats stats = watcher.listener_stats();
  EXPECT_TRUE(stats.listening);
  EXPECT_EQ(stats.connects, 2U);
  EXPECT_NE(stats.backend_pid, first_pid);

  // And it listens again.
  const Token token = hold(writer, "job");
  ASSERT_EQ(writer.complete("mp", "job", token, "done", 1h), WriteResult::kDone);
  EXPECT_TRUE(eventually([&] { return job.woken.load() == 3; })) << job.woken.load();
}

TEST_F(PostgresNotify, AWaiterInAnotherProcessAnswersWhenItsListeningConnectionIsKilled) {
  const std::string app = fresh_application_name();
  const auto kill_listener = [&] {
    ASSERT_TRUE(eventually([&] { return backends_named(app + "-listen") == 1; }));
    RawPg raw(postgres_url());
    EXPECT_EQ(raw.value("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = '" +
                        app + "-listen'"),
              "t");
  };
  // Completed while its listener may be down: the notification may be lost, and the waiter
  // polls once an hour, so only the listener's wake-up after it connects again can answer.
  EXPECT_THAT(wait_in_another_process("notify=on&application_name=" + app, kHour, "3", complete,
                                      kill_listener),
              StartsWith("replay first acquires="));
}

TEST_F(PostgresNotify, AWaiterWhoseListenerCannotConnectStillAnswersByPolling) {
  // Nothing listens on port 1: the waiter's listener never connects.
  EXPECT_THAT(wait_in_another_process("notify=on&listen=postgresql://127.0.0.1:1/idem_test", "20",
                                      "2", complete, [] {}),
              StartsWith("replay first acquires="));
}

TEST_F(PostgresNotify, NotifyIsOnByDefaultAndOffOrReadOnlyGivesNoWatchAndABadValueIsRefused) {
  {
    PostgresStore owner(options());  // makes the table
    EXPECT_EQ(open_store(url("notify=off"))->watch("mp", "k", [] {}), nullptr);
    // On by default (SPEC §7: a store that can notify does).
    EXPECT_NE(open_store(with_param(postgres_url(), "table=" + table_))->watch("mp", "k", [] {}),
              nullptr);
    EXPECT_EQ(open_store(url(), OpenOptions{.read_only = true})->watch("mp", "k", [] {}), nullptr);
  }
  try {
    (void)open_store(url("notify=1"));
    ADD_FAILURE() << "notify=1 was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'notify' must be 'on' or 'off', got '1'"));
  }
  try {
    (void)open_store(url("notify=off&listen=postgresql://127.0.0.1/db"));
    ADD_FAILURE() << "listen= with notify=off was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("notify=off"));
  }
  EXPECT_THROW(open_store(url("notify=on&listen=nonsense")), InvalidArgument);
}

TEST(PostgresNotifyChannel, IsTheTablesNameOrAStableHashWhenThatIsTooLong) {
  const postgres::TableNames shortname{"public", "idem_records"};
  EXPECT_EQ(postgres::notify_channel(shortname), "idem:public.idem_records");
  const postgres::TableNames longname{std::string(48, 's'), std::string(48, 't')};
  const std::string channel = postgres::notify_channel(longname);
  EXPECT_EQ(channel.size(), 21U);
  EXPECT_THAT(channel, StartsWith("idem:"));
  EXPECT_EQ(channel, postgres::notify_channel(longname));
  EXPECT_NE(channel, postgres::notify_channel({std::string(48, 's'), std::string(48, 'u')}));
  EXPECT_EQ(postgres::quote_identifier("a\"b"), "\"a\"\"b\"");
}

TEST_F(PostgresNotify, ALongTableNameNotifiesOnItsHashedChannel) {
  const std::string schema = "idem_notify_schema_" + std::to_string(::getpid());
  RawPg raw(postgres_url());
  raw.exec("CREATE SCHEMA IF NOT EXISTS " + schema);
  struct DropSchema {
    RawPg& raw;
    std::string schema;
    ~DropSchema() { raw.exec("DROP SCHEMA IF EXISTS " + schema + " CASCADE"); }
  } drop{raw, schema};
  PostgresStoreOptions o = options();
  o.table = schema + "." + fresh_table("long_channel_name_xx");
  ASSERT_GT(5 + o.table.size(), postgres::kMaxChannelLength);
  PostgresStore watcher(o);
  PostgresStore writer(o);
  Counted job(watcher, "mp", "job");
  ASSERT_TRUE(listening(watcher));
  ASSERT_TRUE(eventually([&] { return job.woken.load() == 1; }));
  const Token token = hold(writer, "job");
  ASSERT_EQ(writer.complete("mp", "job", token, "done", 1h), WriteResult::kDone);
  EXPECT_TRUE(eventually([&] { return job.woken.load() == 2; })) << job.woken.load();
}

// Through PgBouncer in transaction pooling LISTEN would land on whichever server session
// the next transaction gets: the store only listens with a direct connection of its own
// (listen=). Its writes notify through the pooler all the same.
TEST_F(PostgresNotify, BehindATransactionPoolerOnlyAListenConnectionGivesAWatch) {
  const std::string tx = env_or_empty("IDEM_TEST_PGBOUNCER_TX_URL");
  IDEM_SKIP_OR_FAIL_UNLESS(!tx.empty(), "IDEM_TEST_PGBOUNCER_TX_URL is not set");
  PostgresStore pooled(options(tx));
  EXPECT_EQ(pooled.watch("mp", "job", [] {}), nullptr);
  EXPECT_EQ(open_store(with_param(with_param(tx, "table=" + table_), "notify=on"))
                ->watch("mp", "job", [] {}),
            nullptr);

  PostgresStoreOptions o = options(tx);
  o.listen = postgres_url();
  PostgresStore direct(o);
  Counted job(direct, "mp", "job");
  ASSERT_NE(job.watch, nullptr);
  ASSERT_TRUE(listening(direct));
  ASSERT_TRUE(eventually([&] { return job.woken.load() == 1; }));
  const Token token = hold(pooled, "job");
  ASSERT_EQ(pooled.complete("mp", "job", token, "done", 1h), WriteResult::kDone);
  EXPECT_TRUE(eventually([&] { return job.woken.load() == 2; })) << job.woken.load();
  // The same from a URL.
  auto from_url = open_store(
      with_param(with_param(tx, "table=" + table_), "notify=on&listen=" + postgres_url()));
  EXPECT_NE(from_url->watch("mp", "job", [] {}), nullptr);
}

// Session pooling keeps a server session per client connection: the store listens through
// the pooler when told so (pooler=session).
TEST_F(PostgresNotify, BehindASessionPoolerTheStoreListensThroughIt) {
  const std::string session = env_or_empty("IDEM_TEST_PGBOUNCER_SESSION_URL");
  IDEM_SKIP_OR_FAIL_UNLESS(!session.empty(), "IDEM_TEST_PGBOUNCER_SESSION_URL is not set");
  PostgresStoreOptions o = options(session);
  o.pool_size = 2;
  o.pooler = PostgresPooler::kSession;
  PostgresStore watcher(o);
  PostgresStore writer(o);
  Counted job(watcher, "mp", "job");
  ASSERT_NE(job.watch, nullptr);
  ASSERT_TRUE(listening(watcher));
  ASSERT_TRUE(eventually([&] { return job.woken.load() == 1; }));
  const Token token = hold(writer, "job");
  ASSERT_EQ(writer.release("mp", "job", token), WriteResult::kDone);
  EXPECT_TRUE(eventually([&] { return job.woken.load() == 2; })) << job.woken.load();
}

}  // namespace
}  // namespace idem::testing
