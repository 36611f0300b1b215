// The SQLite store on its own: URLs, the file and its schema, bad files, locking, reopening,
// binary safety, purging and threads. The shared suite is instantiated in
// sqlite_conformance_test.cpp, the multi-process tests are in sqlite_multiprocess_test.cpp.

#include "idem/stores/sqlite_store.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"
#include "idem/testing/matchers.h"  // gtest printers for the store results (ODR)
#include "stores/sqlite/sqlite_test_util.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using testing::fresh_db_path;
using ::testing::HasSubstr;
using testing::RawDb;
using testing::temp_dir;

std::shared_ptr<SqliteStore> make_store(const std::string& path,
                                        std::shared_ptr<const Clock> clock = nullptr,
                                        Duration busy_timeout = 5000ms) {
  return std::make_shared<SqliteStore>(
      SqliteStoreOptions{.path = path, .busy_timeout = busy_timeout, .clock = std::move(clock)});
}

Token acquire_token(Store& store, std::string_view scope, std::string_view key,
                    std::optional<std::string_view> fingerprint = std::nullopt) {
  AcquireResult r = store.acquire(scope, key, 10s, 1h, fingerprint);
  const auto* a = std::get_if<Acquired>(&r);
  if (a == nullptr) {
    ADD_FAILURE() << "expected Acquired for key of " << key.size() << " bytes";
    return 0;
  }
  return a->lease.token;
}

// Expects `f` to throw StoreUnavailable naming the store `path` and containing `cause`.
template <typename F>
void expect_store_error(F&& f, const std::string& path, const std::string& cause) {
  try {
    f();
    ADD_FAILURE() << "expected StoreUnavailable (" << cause << ") for " << path;
  } catch (const StoreUnavailable& e) {
    EXPECT_EQ(e.store(), "sqlite://" + path) << e.what();
    EXPECT_THAT(e.reason(), HasSubstr(cause)) << e.what();
    EXPECT_THAT(std::string(e.what()), HasSubstr(path));
  }
}

template <typename F>
void expect_bad_url(F&& f, const std::string& mention) {
  try {
    f();
    ADD_FAILURE() << "expected InvalidArgument mentioning " << mention;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "store URL") << e.what();
    EXPECT_THAT(std::string(e.what()), HasSubstr(mention));
  }
}

// --- URLs ---

TEST(SqliteStoreUrl, OpensAbsolutePathAndDescribesIt) {
  const std::string path = fresh_db_path();
  auto store = open_store("sqlite://" + path);
  EXPECT_EQ(store->describe(), "sqlite://" + path);
  EXPECT_TRUE(std::filesystem::is_regular_file(path));
  EXPECT_NE(dynamic_cast<SqliteStore*>(store.get()), nullptr);
}

TEST(SqliteStoreUrl, OpensRelativePathAgainstTheWorkingDirectory) {
  const std::string path = fresh_db_path();
  const std::string relative = std::filesystem::relative(path).string();
  ASSERT_FALSE(relative.empty());
  ASSERT_NE(relative.front(), '/');
  auto store = open_store("sqlite:" + relative);
  // describe() names the absolute file, whatever the working directory is later.
  EXPECT_EQ(store->describe(), "sqlite://" + path);
  EXPECT_TRUE(std::filesystem::is_regular_file(path));
}

TEST(SqliteStoreUrl, AcceptsKnownParameters) {
  const std::string path = fresh_db_path();
  auto store = open_store("sqlite://" + path + "?synchronous=full&busy_timeout=250");
  EXPECT_EQ(store->describe(), "sqlite://" + path);
  EXPECT_TRUE(std::holds_alternative<Acquired>(store->acquire("s", "k", 1s, 1h)));
}

TEST(SqliteStoreUrl, RejectsAHost) {
  expect_bad_url([] { open_store("sqlite://somehost/tmp/x.db"); }, "somehost");
}

TEST(SqliteStoreUrl, RejectsAnEmptyPath) {
  expect_bad_url([] { open_store("sqlite:"); }, "needs a database file");
  expect_bad_url([] { open_store("sqlite://"); }, "needs a database file");
  expect_bad_url([] { open_store("sqlite:?synchronous=full"); }, "needs a database file");
}

TEST(SqliteStoreUrl, RejectsAnUnknownParameterByName) {
  const std::string path = fresh_db_path();
  expect_bad_url([&] { open_store("sqlite://" + path + "?journal=off"); }, "'journal'");
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(SqliteStoreUrl, RejectsABadSynchronousValue) {
  const std::string path = fresh_db_path();
  expect_bad_url([&] { open_store("sqlite://" + path + "?synchronous=sometimes"); }, "synchronous");
  expect_bad_url([&] { open_store("sqlite://" + path + "?synchronous=off"); }, "synchronous");
}

TEST(SqliteStoreUrl, RejectsABadBusyTimeout) {
  const std::string path = fresh_db_path();
  expect_bad_url([&] { open_store("sqlite://" + path + "?busy_timeout=soon"); }, "busy_timeout");
  expect_bad_url([&] { open_store("sqlite://" + path + "?busy_timeout=-5"); }, "busy_timeout");
}

TEST(SqliteStoreOptions, RejectsBadOptions) {
  EXPECT_THROW(SqliteStore(SqliteStoreOptions{.path = ""}), InvalidArgument);
  EXPECT_THROW(SqliteStore(SqliteStoreOptions{.path = fresh_db_path(), .synchronous = "off"}),
               InvalidArgument);
  EXPECT_THROW(SqliteStore(SqliteStoreOptions{.path = fresh_db_path(), .busy_timeout = -1ms}),
               InvalidArgument);
}

// --- The file and its schema ---

TEST(SqliteStoreFile, CreatesTheSchemaInWalMode) {
  const std::string path = fresh_db_path();
  make_store(path);
  RawDb raw(path);
  EXPECT_EQ(raw.query_int("PRAGMA user_version"), 1);
  EXPECT_EQ(raw.query_int("PRAGMA application_id"), 0x6964656d);
  EXPECT_EQ(raw.query_text("PRAGMA journal_mode"), "wal");
  EXPECT_EQ(raw.query_int("SELECT count(*) FROM sqlite_schema WHERE name = 'idem_records'"), 1);
  EXPECT_EQ(raw.query_int("SELECT last_token FROM idem_meta"), 0);
}

TEST(SqliteStoreFile, OpensAnExistingStoreTwiceAtOnce) {
  const std::string path = fresh_db_path();
  auto a = make_store(path);
  auto b = make_store(path);
  const Token t = acquire_token(*a, "s", "k");
  ASSERT_EQ(a->complete("s", "k", t, "done", 1h), WriteResult::kDone);
  AcquireResult r = b->acquire("s", "k", 1s, 1h);
  ASSERT_TRUE(std::holds_alternative<Replay>(r));
  EXPECT_EQ(std::get<Replay>(r).payload, "done");
}

TEST(SqliteStoreFile, RefusesAFileFromANewerSchemaVersion) {
  const std::string path = fresh_db_path();
  make_store(path);
  RawDb(path).exec("PRAGMA user_version = 2");
  expect_store_error([&] { make_store(path); }, path, "newer version of idem");
  // Refused, not rewritten.
  EXPECT_EQ(RawDb(path).query_int("PRAGMA user_version"), 2);
}

TEST(SqliteStoreFile, RefusesAnSqliteFileOfAnotherSchema) {
  const std::string path = fresh_db_path();
  RawDb(path).exec("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)");
  expect_store_error([&] { make_store(path); }, path, "not an idem database");
  RawDb raw(path);
  // Untouched: no idem tables, still in its own journal mode.
  EXPECT_EQ(raw.query_int("SELECT count(*) FROM sqlite_schema"), 1);
  EXPECT_EQ(raw.query_text("PRAGMA journal_mode"), "delete");
  EXPECT_EQ(raw.query_int("PRAGMA user_version"), 0);
}

TEST(SqliteStoreFile, RefusesAnSqliteFileOfAnotherApplication) {
  const std::string path = fresh_db_path();
  RawDb(path).exec("PRAGMA application_id = 42");
  expect_store_error([&] { make_store(path); }, path, "not an idem database");
}

TEST(SqliteStoreFile, RefusesAFileThatIsNotSqlite) {
  const std::string path = fresh_db_path();
  {
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 200; ++i) out << "this is a text file, not a database\n";
  }
  expect_store_error([&] { make_store(path); }, path, "file is not a database");
  expect_store_error([&] { open_store("sqlite://" + path); }, path, "file is not a database");
}

TEST(SqliteStoreFile, FailsForAPathUnderARegularFile) {
  const std::string file = fresh_db_path("plain");
  std::ofstream(file) << "x";
  const std::string path = file + "/store.db";
  expect_store_error([&] { make_store(path); }, path, "unable to open database file");
}

TEST(SqliteStoreFile, FailsForAPathThatIsADirectory) {
  const std::string path = fresh_db_path("dir");
  std::filesystem::create_directory(path);
  expect_store_error([&] { make_store(path); }, path, "unable to open database file");
}

// Makes `dir` unwritable for this process: permission bits for an ordinary user, the
// immutable attribute for root (which ignores permission bits). Undone by the destructor.
class UnwritableDir {
 public:
  explicit UnwritableDir(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::filesystem::create_directory(dir_);
    ::chmod(dir_.c_str(), 0555);
    if (writable()) set_immutable(true);
  }
  ~UnwritableDir() {
    if (immutable_) set_immutable(false);
    ::chmod(dir_.c_str(), 0755);
  }
  bool writable() const {
    const std::filesystem::path probe = dir_ / "probe";
    const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY, 0644);
    if (fd < 0) return false;
    ::close(fd);
    ::unlink(probe.c_str());
    return true;
  }

 private:
  void set_immutable(bool on) {
    const int fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0) return;
    int flags = 0;
    if (::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0) {
      flags = on ? (flags | FS_IMMUTABLE_FL) : (flags & ~FS_IMMUTABLE_FL);
      if (::ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0) immutable_ = on;
    }
    ::close(fd);
  }

  std::filesystem::path dir_;
  bool immutable_ = false;
};

TEST(SqliteStoreFile, FailsInADirectoryThatIsNotWritable) {
  UnwritableDir dir(temp_dir() / "readonly");
  if (dir.writable()) {
    GTEST_SKIP() << "running as root on a file system without the immutable attribute (or "
                    "without CAP_LINUX_IMMUTABLE): cannot make a directory unwritable";
  }
  const std::string path = (temp_dir() / "readonly" / "store.db").string();
  expect_store_error([&] { make_store(path); }, path, "unable to open database file");
}

// --- Read-only and no-create opening (OpenOptions::read_only, create_if_missing) ---

std::shared_ptr<Store> open_with(const std::string& path, OpenOptions options) {
  return open_store("sqlite://" + path, options);
}

TEST(SqliteStoreOpenMode, ReadOnlyAndNoCreateRefuseAMissingFileAndCreateNothing) {
  const std::string path = fresh_db_path();
  expect_store_error([&] { open_with(path, {.read_only = true}); }, path, "does not exist");
  expect_store_error([&] { open_with(path, {.create_if_missing = false}); }, path,
                     "does not exist");
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
  EXPECT_FALSE(std::filesystem::exists(path + "-shm"));
}

TEST(SqliteStoreOpenMode, ReadOnlyAndNoCreateLeaveAnEmptyFileEmpty) {
  const std::string path = fresh_db_path();
  std::ofstream(path).flush();
  expect_store_error([&] { open_with(path, {.read_only = true}); }, path, "no idem schema");
  expect_store_error([&] { open_with(path, {.create_if_missing = false}); }, path,
                     "no idem schema");
  EXPECT_EQ(std::filesystem::file_size(path), 0u);
}

TEST(SqliteStoreOpenMode, NoCreateOpensAnExistingStoreForWriting) {
  const std::string path = fresh_db_path();
  make_store(path);
  auto store = open_with(path, {.create_if_missing = false});
  const Token t = acquire_token(*store, "s", "k");
  EXPECT_EQ(store->complete("s", "k", t, "done", 1h), WriteResult::kDone);
}

TEST(SqliteStoreOpenMode, ReadOnlyReadsAndRefusesEveryWrite) {
  const std::string path = fresh_db_path();
  auto writer = make_store(path);
  const Token t = acquire_token(*writer, "s", "done");
  ASSERT_EQ(writer->complete("s", "done", t, "result", 1h), WriteResult::kDone);
  const Token running = acquire_token(*writer, "s", "running");

  auto reader = open_with(path, {.read_only = true});
  EXPECT_EQ(reader->describe(), "sqlite://" + path);
  ASSERT_TRUE(reader->get("s", "done").has_value());
  EXPECT_EQ(reader->get("s", "done")->payload, "result");
  // Answers that need no write work; everything else is refused and changes nothing.
  EXPECT_TRUE(std::holds_alternative<Replay>(reader->acquire("s", "done", 1s, 1h)));
  EXPECT_TRUE(std::holds_alternative<Busy>(reader->acquire("s", "running", 1s, 1h)));
  const std::string cause = "readonly";
  expect_store_error([&] { (void)reader->acquire("s", "fresh", 1s, 1h); }, path, cause);
  expect_store_error([&] { (void)reader->complete("s", "running", running, "x", 1h); }, path,
                     cause);
  expect_store_error([&] { (void)reader->extend("s", "running", running, 1s); }, path, cause);
  expect_store_error([&] { (void)reader->release("s", "running", running); }, path, cause);
  expect_store_error([&] { (void)reader->forget("s", "done"); }, path, cause);
  expect_store_error([&] { (void)reader->purge(10); }, path, cause);
  EXPECT_FALSE(writer->get("s", "fresh").has_value());
  EXPECT_EQ(writer->get("s", "running")->state, RecordState::kInProgress);
  EXPECT_TRUE(writer->get("s", "done").has_value());
  // A reader sees what a writer commits after it opened.
  ASSERT_EQ(writer->complete("s", "running", running, "later", 1h), WriteResult::kDone);
  EXPECT_EQ(reader->get("s", "running")->payload, "later");
}

TEST(SqliteStoreOpenMode, ReadOnlyReadsAStoreInADirectoryItCannotWrite) {
  const std::filesystem::path dir = temp_dir() / "readonly-store";
  std::filesystem::create_directory(dir);
  const std::string path = (dir / "store.db").string();
  {
    auto writer = make_store(path);
    const Token t = acquire_token(*writer, "s", "k");
    ASSERT_EQ(writer->complete("s", "k", t, "kept", 1h), WriteResult::kDone);
  }
  // The last connection closed: no -wal or -shm file is left to read through.
  ASSERT_FALSE(std::filesystem::exists(path + "-shm"));
  UnwritableDir locked(dir);
  if (locked.writable()) {
    GTEST_SKIP() << "running as root on a file system without the immutable attribute (or "
                    "without CAP_LINUX_IMMUTABLE): cannot make a directory unwritable";
  }
  auto reader = open_with(path, {.read_only = true});
  std::optional<Record> r = reader->get("s", "k");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->payload, "kept");
  EXPECT_FALSE(reader->get("s", "other").has_value());
  expect_store_error([&] { (void)reader->forget("s", "k"); }, path, "readonly");
}

TEST(SqliteStoreFile, FailsWhenLockedLongerThanTheBusyTimeout) {
  const std::string path = fresh_db_path();
  auto store = make_store(path, nullptr, 100ms);
  RawDb other(path);
  other.exec("BEGIN EXCLUSIVE");
  other.exec("UPDATE idem_meta SET last_token = last_token");
  expect_store_error([&] { (void)store->acquire("s", "k", 1s, 1h); }, path, "database is locked");
  expect_store_error([&] { (void)store->forget("s", "k"); }, path, "database is locked");
  expect_store_error([&] { (void)store->purge(10); }, path, "database is locked");
  other.exec("ROLLBACK");
  // The store is usable again once the lock is gone.
  EXPECT_TRUE(std::holds_alternative<Acquired>(store->acquire("s", "k", 1s, 1h)));
}

TEST(SqliteStoreFile, ReplaysAndBusyAnswersDoNotTakeTheWriteLock) {
  const std::string path = fresh_db_path();
  auto store = make_store(path, nullptr, 100ms);
  const Token t = acquire_token(*store, "s", "done");
  ASSERT_EQ(store->complete("s", "done", t, "result", 1h), WriteResult::kDone);
  acquire_token(*store, "s", "running");

  RawDb writer(path);
  writer.exec("BEGIN IMMEDIATE");  // holds the write lock until ROLLBACK
  AcquireResult replay = store->acquire("s", "done", 1s, 1h);
  ASSERT_TRUE(std::holds_alternative<Replay>(replay));
  EXPECT_EQ(std::get<Replay>(replay).payload, "result");
  EXPECT_TRUE(std::holds_alternative<Busy>(store->acquire("s", "running", 1s, 1h)));
  EXPECT_TRUE(store->get("s", "done").has_value());
  // A fresh key must write, so it waits for the lock and gives up after the busy timeout.
  expect_store_error([&] { (void)store->acquire("s", "fresh", 1s, 1h); }, path,
                     "database is locked");
  writer.exec("ROLLBACK");
  EXPECT_TRUE(std::holds_alternative<Acquired>(store->acquire("s", "fresh", 1s, 1h)));
}

// --- Persistence and tokens ---

TEST(SqliteStorePersistence, ReopenedStoreReplaysAndTokensKeepIncreasing) {
  const std::string path = fresh_db_path();
  auto clock = std::make_shared<ManualClock>();
  Token last = 0;
  {
    auto store = make_store(path, clock);
    const Token t1 = acquire_token(*store, "s", "done");
    ASSERT_EQ(store->complete("s", "done", t1, std::string("pay\0load", 8), 1h),
              WriteResult::kDone);
    const Token t2 = acquire_token(*store, "s", "released");
    EXPECT_GT(t2, t1);
    ASSERT_EQ(store->release("s", "released", t2), WriteResult::kDone);
    last = t2;
  }
  auto store = make_store(path, clock);
  AcquireResult r = store->acquire("s", "done", 1s, 1h);
  ASSERT_TRUE(std::holds_alternative<Replay>(r));
  EXPECT_EQ(std::get<Replay>(r).payload, std::string("pay\0load", 8));

  // SPEC §2: tokens only grow, across release, forget, purge and restarts.
  AcquireResult again = store->acquire("s", "released", 1s, 1h);
  ASSERT_TRUE(std::holds_alternative<Acquired>(again));
  const Acquired& a = std::get<Acquired>(again);
  EXPECT_GT(a.lease.token, last);
  EXPECT_FALSE(a.stolen);
  EXPECT_EQ(a.lease.attempt, 1u);
  last = a.lease.token;

  ASSERT_TRUE(store->forget("s", "done"));
  const Token after_forget = acquire_token(*store, "s", "done");
  EXPECT_GT(after_forget, last);
  ASSERT_EQ(store->complete("s", "done", after_forget, "x", 1s), WriteResult::kDone);
  clock->advance(2s);
  EXPECT_EQ(store->purge(100), 1u);
  EXPECT_GT(acquire_token(*store, "s", "done"), after_forget);
}

TEST(SqliteStorePersistence, AnInProgressRecordSurvivesAReopen) {
  const std::string path = fresh_db_path();
  auto clock = std::make_shared<ManualClock>();
  Token t = 0;
  {
    auto store = make_store(path, clock);
    t = acquire_token(*store, "s", "k", "fp");
  }
  auto store = make_store(path, clock);
  AcquireResult busy = store->acquire("s", "k", 1s, 1h);
  ASSERT_TRUE(std::holds_alternative<Busy>(busy));
  EXPECT_EQ(std::get<Busy>(busy).fingerprint, "fp");
  EXPECT_EQ(store->complete("s", "k", t, "v", 1h), WriteResult::kDone);
}

// --- Bytes ---

TEST(SqliteStoreBytes, ScopeKeyPayloadAndFingerprintAreBinarySafe) {
  auto store = make_store(fresh_db_path());
  const std::string scope("a\0b", 3);
  const std::string key("\0\xff\x01key\0", 7);
  const std::string other_key("\0\xff\x01key", 6);
  std::string payload;
  for (int i = 0; i < 256; ++i) payload.push_back(static_cast<char>(i));

  const Token t = acquire_token(*store, scope, key, std::string_view("\0f", 2));
  // A key that is a prefix up to the NUL is a different record.
  acquire_token(*store, scope, other_key);
  ASSERT_EQ(store->complete(scope, key, t, payload, 1h), WriteResult::kDone);
  AcquireResult r = store->acquire(scope, key, 1s, 1h);
  ASSERT_TRUE(std::holds_alternative<Replay>(r));
  EXPECT_EQ(std::get<Replay>(r).payload, payload);
  EXPECT_EQ(std::get<Replay>(r).fingerprint, std::string("\0f", 2));
  EXPECT_TRUE(std::holds_alternative<Busy>(store->acquire(scope, other_key, 1s, 1h)));
}

TEST(SqliteStoreBytes, ScopeAndKeyAreNotConcatenated) {
  auto store = make_store(fresh_db_path());
  const Token t = acquire_token(*store, "a:b", "c");
  ASSERT_EQ(store->complete("a:b", "c", t, "first", 1h), WriteResult::kDone);
  EXPECT_TRUE(std::holds_alternative<Acquired>(store->acquire("a", "b:c", 1s, 1h)));
}

TEST(SqliteStoreBytes, EmptyPayloadAndEmptyFingerprintAreNotNull) {
  auto store = make_store(fresh_db_path());
  const Token t = acquire_token(*store, "s", "k", std::string_view());
  ASSERT_EQ(store->complete("s", "k", t, "", 1h), WriteResult::kDone);
  std::optional<Record> rec = store->get("s", "k");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->payload, "");
  ASSERT_TRUE(rec->fingerprint.has_value());
  EXPECT_EQ(*rec->fingerprint, "");

  const Token u = acquire_token(*store, "s", "no-fingerprint");
  (void)u;
  rec = store->get("s", "no-fingerprint");
  ASSERT_TRUE(rec.has_value());
  EXPECT_FALSE(rec->fingerprint.has_value());
}

// --- Purging ---

TEST(SqliteStorePurge, AnExtendedLeaseKeepsARecordPastItsTtl) {
  auto clock = std::make_shared<ManualClock>();
  auto store = make_store(fresh_db_path(), clock);
  AcquireResult r = store->acquire("s", "k", 1s, 2s);
  ASSERT_TRUE(std::holds_alternative<Acquired>(r));
  const Token t = std::get<Acquired>(r).lease.token;
  clock->advance(500ms);
  ASSERT_TRUE(store->extend("s", "k", t, 10s).done());
  clock->advance(3s);  // TTL passed, lease still live
  EXPECT_EQ(store->purge(100), 0u);
  ASSERT_TRUE(store->get("s", "k").has_value());
  clock->advance(10s);  // now the lease has passed as well
  EXPECT_EQ(store->purge(100), 1u);
  EXPECT_FALSE(store->get("s", "k").has_value());
}

TEST(SqliteStorePurge, DeletesInBatchesUpToTheLimit) {
  auto clock = std::make_shared<ManualClock>();
  auto store = make_store(fresh_db_path(), clock);
  constexpr int kRecords = 300;  // more than one internal batch
  for (int i = 0; i < kRecords; ++i) {
    const std::string key = "k" + std::to_string(i);
    const Token t = acquire_token(*store, "s", key);
    ASSERT_EQ(store->complete("s", key, t, "v", 1s), WriteResult::kDone);
  }
  acquire_token(*store, "s", "live");  // 1 h TTL: never purged here
  clock->advance(2s);
  EXPECT_EQ(store->purge(10), 10u);
  EXPECT_EQ(store->purge(1000), static_cast<std::size_t>(kRecords - 10));
  EXPECT_EQ(store->purge(1000), 0u);
  EXPECT_TRUE(store->get("s", "live").has_value());
}

// --- Threads ---

TEST(SqliteStoreThreads, ThreadsRacingOverKeysCompleteEachOnce) {
  auto store = make_store(fresh_db_path());
  constexpr int kThreads = 4;
  constexpr int kKeys = 40;
  std::mutex mu;
  std::map<std::string, int> acquisitions;
  std::map<std::string, std::string> completed_with;
  std::vector<std::string> replays_wrong;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kKeys; ++i) {
        const std::string key = "k" + std::to_string((i + t * 7) % kKeys);
        const std::string mine = "thread" + std::to_string(t);
        // Bounded: a Busy key is completed by its owner within a few of its own steps.
        for (int tries = 0; tries < 100000; ++tries) {
          AcquireResult r = store->acquire("s", key, 30s, 1h);
          if (const auto* a = std::get_if<Acquired>(&r)) {
            {
              std::lock_guard lock(mu);
              ++acquisitions[key];
              completed_with[key] = mine;
            }
            EXPECT_EQ(store->complete("s", key, a->lease.token, mine, 1h), WriteResult::kDone);
            break;
          }
          if (const auto* p = std::get_if<Replay>(&r)) {
            std::lock_guard lock(mu);
            if (completed_with[key] != p->payload) replays_wrong.push_back(key);
            break;
          }
          std::this_thread::yield();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(acquisitions.size(), static_cast<std::size_t>(kKeys));
  for (const auto& [key, n] : acquisitions) EXPECT_EQ(n, 1) << key;
  EXPECT_TRUE(replays_wrong.empty());
  RawDb raw(store->describe().substr(std::string("sqlite://").size()));
  EXPECT_EQ(raw.query_text("PRAGMA integrity_check"), "ok");
}

TEST(SqliteStoreThreads, StoresOpeningOneNewFileTogetherCreateItOnce) {
  constexpr int kRounds = 5;
  constexpr int kThreads = 6;
  for (int round = 0; round < kRounds; ++round) {
    const std::string path = fresh_db_path("together");
    std::vector<std::shared_ptr<SqliteStore>> stores(kThreads);
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        try {
          stores[t] = make_store(path);
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
      });
    }
    for (auto& th : threads) th.join();
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    RawDb raw(path);
    EXPECT_EQ(raw.query_int("SELECT count(*) FROM idem_meta"), 1);
    EXPECT_EQ(raw.query_text("PRAGMA journal_mode"), "wal");
  }
}

}  // namespace
}  // namespace idem
