// Several processes on one SQLite file, through idem::Executor: racing workers complete each
// key once, a killed owner's lease is stolen, a paused owner is fenced. The worker is
// sqlite_store_worker.cpp; its path comes from the build (IDEM_SQLITE_WORKER).

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"
#include "idem/stores/sqlite_store.h"
#include "stores/sqlite/sqlite_test_util.h"

extern char** environ;

namespace idem {
namespace {

using namespace std::chrono_literals;
using testing::fresh_db_path;
using ::testing::HasSubstr;
using testing::RawDb;
using ::testing::StartsWith;

// Every wait on a worker is bounded by this, so a broken worker fails the test instead of
// hanging it. It is a bound, not an expectation about speed.
constexpr int kWorkerTimeoutMs = 60'000;

// A worker process with its standard input and output connected to pipes. Killed (if
// still running) and reaped by the destructor.
class Worker {
 public:
  explicit Worker(const std::vector<std::string>& args) {
    int in[2];
    int out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe failed";
      return;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    std::vector<std::string> full{IDEM_SQLITE_WORKER};
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : full) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
    if (rc != 0) {
      ADD_FAILURE() << "posix_spawn " << IDEM_SQLITE_WORKER << " failed: " << rc;
      pid_ = -1;
    }
  }

  ~Worker() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait();
    }
    if (stdin_ >= 0) ::close(stdin_);
    if (stdout_ >= 0) ::close(stdout_);
  }

  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // The next line the worker printed, without its newline; empty after the bound or EOF.
  std::string read_line() {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(kWorkerTimeoutMs);
    for (;;) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) {
        ADD_FAILURE() << "worker " << pid_ << " printed no line in time";
        return {};
      }
      pollfd p{stdout_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[512];
      const ssize_t n = ::read(stdout_, chunk, sizeof chunk);
      if (n <= 0) return std::exchange(buffer_, {});
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  void write_line(const std::string& line) {
    const std::string text = line + "\n";
    EXPECT_EQ(::write(stdin_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }

  void signal(int sig) { ASSERT_EQ(::kill(pid_, sig), 0); }

  // Stops the worker with SIGSTOP and returns once it is stopped.
  void stop() {
    ASSERT_EQ(::kill(pid_, SIGSTOP), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid_, &status, WUNTRACED), pid_);
    ASSERT_TRUE(WIFSTOPPED(status));
  }

  // Waits for the worker to exit (bounded) and returns its exit status, or -1.
  int wait() {
    if (pid_ <= 0) return -1;
    int status = 0;
    for (int i = 0; i < kWorkerTimeoutMs / 10; ++i) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "worker " << pid_ << " did not exit in time";
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  std::string buffer_;
};

std::string url_of(const std::string& path) { return "sqlite://" + path; }

void expect_integrity_ok(const std::string& path) {
  RawDb raw(path);
  EXPECT_EQ(raw.query_text("PRAGMA integrity_check"), "ok");
}

// Whether nobody holds the file's write lock right now.
bool write_lock_free(const std::string& path) {
  RawDb raw(path);
  if (raw.exec("BEGIN IMMEDIATE", /*expect_ok=*/false) != SQLITE_OK) return false;
  raw.exec("ROLLBACK");
  return true;
}

// Stops `worker` at a moment when it does not hold the write lock: its heartbeat may be in
// the middle of an extend, and a writer frozen inside its transaction would block every
// other process until the busy timeout.
void stop_outside_write(Worker& worker, const std::string& path) {
  for (int i = 0; i < 100; ++i) {
    worker.stop();
    if (write_lock_free(path)) return;
    worker.signal(SIGCONT);
    std::this_thread::sleep_for(5ms);
  }
  FAIL() << "the worker always held the write lock";
}

// Waits until the store reports the lease on (scope, key) as expired by its own clock.
void wait_for_lease_expiry(Store& store, std::string_view key) {
  for (int i = 0; i < kWorkerTimeoutMs / 20; ++i) {
    std::optional<Record> r = store.get("mp", key);
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->state, RecordState::kInProgress);
    if (r->lease_expires_at <= r->now) return;
    std::this_thread::sleep_for(20ms);
  }
  FAIL() << "the lease never expired";
}

TEST(SqliteMultiProcess, WorkersRacingOverKeysCompleteEachKeyOnce) {
  const std::string path = fresh_db_path("race");
  constexpr int kWorkers = 4;
  constexpr int kKeys = 40;
  const long long start_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count() +
                             300;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::string> outputs;
  for (int w = 0; w < kWorkers; ++w) {
    outputs.push_back(path + ".worker" + std::to_string(w));
    // The workers also race to create the file and its schema.
    workers.push_back(std::make_unique<Worker>(
        std::vector<std::string>{"race", url_of(path), std::to_string(w), std::to_string(kKeys),
                                 std::to_string(start_ms), outputs.back()}));
  }
  for (auto& w : workers) EXPECT_EQ(w->wait(), 0);

  std::map<std::string, std::vector<std::string>> ran;       // key -> payloads of runs
  std::map<std::string, std::vector<std::string>> replayed;  // key -> payloads replayed
  for (const std::string& file : outputs) {
    std::ifstream in(file);
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
      ++lines;
      std::istringstream fields(line);
      std::string what, key, payload;
      fields >> what >> key >> payload;
      if (what == "ran") {
        ran[key].push_back(payload);
      } else if (what == "replay") {
        replayed[key].push_back(payload);
      } else {
        ADD_FAILURE() << file << ": " << line;
      }
    }
    EXPECT_EQ(lines, kKeys) << file;
  }
  ASSERT_EQ(ran.size(), static_cast<std::size_t>(kKeys));
  auto store = std::make_shared<SqliteStore>(SqliteStoreOptions{.path = path});
  for (const auto& [key, payloads] : ran) {
    ASSERT_EQ(payloads.size(), 1u) << key << " ran more than once";
    EXPECT_THAT(payloads[0], HasSubstr(":" + key));
    for (const std::string& p : replayed[key]) EXPECT_EQ(p, payloads[0]) << key;
    EXPECT_EQ(replayed[key].size(), static_cast<std::size_t>(kWorkers - 1)) << key;
    std::optional<Record> rec = store->get("mp", key);
    ASSERT_TRUE(rec.has_value());
    EXPECT_EQ(rec->state, RecordState::kComplete);
    EXPECT_EQ(rec->payload, payloads[0]);
  }
  expect_integrity_ok(path);
}

TEST(SqliteMultiProcess, KilledOwnersLeaseIsStolenByAnotherProcess) {
  const std::string path = fresh_db_path("killed");
  auto store = std::make_shared<SqliteStore>(SqliteStoreOptions{.path = path});

  Worker owner({"hold", url_of(path), "job", "300"});
  const std::string acquired = owner.read_line();
  ASSERT_THAT(acquired, StartsWith("acquired "));
  const Token first = std::stoull(acquired.substr(9));
  owner.signal(SIGKILL);
  owner.wait();

  // The owner died holding the lease; the next process waits for it to expire and steals.
  Worker thief({"run", url_of(path), "job", "new-owner", "5000", "30000"});
  const std::string line = thief.read_line();
  EXPECT_THAT(line, StartsWith("ran stolen=1 attempt=2 token="));
  EXPECT_EQ(thief.wait(), 0);

  std::optional<Record> rec = store->get("mp", "job");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, RecordState::kComplete);
  EXPECT_EQ(rec->payload, "new-owner");
  EXPECT_GT(rec->token, first);
  expect_integrity_ok(path);
}

TEST(SqliteMultiProcess, PausedOwnerIsFencedAfterItsLeaseWasStolen) {
  const std::string path = fresh_db_path("paused");
  auto store = std::make_shared<SqliteStore>(SqliteStoreOptions{.path = path});

  Worker owner({"hold", url_of(path), "job", "300"});
  const std::string acquired = owner.read_line();
  ASSERT_THAT(acquired, StartsWith("acquired "));
  const Token first = std::stoull(acquired.substr(9));

  // Paused, its heartbeat stops too, so the lease runs out.
  stop_outside_write(owner, path);
  wait_for_lease_expiry(*store, "job");

  Worker thief({"run", url_of(path), "job", "new-owner", "5000", "30000"});
  EXPECT_THAT(thief.read_line(), StartsWith("ran stolen=1 attempt=2 token="));
  EXPECT_EQ(thief.wait(), 0);

  // SPEC §4: the old owner wakes up and finishes; its complete is fenced.
  owner.signal(SIGCONT);
  owner.write_line("go");
  EXPECT_EQ(owner.read_line(), "lease-lost");
  EXPECT_EQ(owner.wait(), 0);

  std::optional<Record> rec = store->get("mp", "job");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, RecordState::kComplete);
  EXPECT_EQ(rec->payload, "new-owner");
  EXPECT_GT(rec->token, first);
  expect_integrity_ok(path);
}

// SQLite's write lock is not fair, least of all with synchronous=full: a process that
// commits back to back used to starve another one's writes past the busy timeout. With
// every write of a process queued in memory and one transaction per batch, and a busy
// handler that tries again within a millisecond, another process gets its turn.
TEST(SqliteMultiProcess, AProcessWritesWhileAnotherHammersTheFile) {
  const std::string path = fresh_db_path("hammer");
  const std::string url = url_of(path) + "?synchronous=full";
  auto store = open_store(url);  // creates the file before the hammer starts
  Worker hammer({"hammer", url, "16"});
  ASSERT_EQ(hammer.read_line(), "running");

  // Write until this process has done its share and the hammer has visibly gone on writing
  // meanwhile, so the two really overlapped. Each write here waits at most the default busy
  // timeout (5 s) for the lock; one that waited longer throws and fails the test.
  RawDb raw(path);
  auto hammered = [&] {
    return raw.query_int("SELECT count(*) FROM idem_records WHERE scope = CAST('mp' AS BLOB)");
  };
  const std::int64_t hammered_before = hammered();
  constexpr int kMine = 100;
  int mine = 0;
  std::vector<std::string> errors;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWorkerTimeoutMs);
  while ((mine < kMine || hammered() < hammered_before + kMine) &&
         std::chrono::steady_clock::now() < give_up) {
    const std::string key = "mine-" + std::to_string(mine++);
    try {
      AcquireResult r = store->acquire("mine", key, 30s, 1h);
      ASSERT_TRUE(std::holds_alternative<Acquired>(r));
      EXPECT_EQ(store->complete("mine", key, std::get<Acquired>(r).lease.token, "mine", 1h),
                WriteResult::kDone);
    } catch (const StoreUnavailable& e) {
      errors.push_back(e.what());
    }
  }
  EXPECT_THAT(errors, ::testing::IsEmpty());
  EXPECT_GE(mine, kMine);
  EXPECT_GE(hammered(), hammered_before + kMine) << "the hammer stalled";

  hammer.write_line("stop");
  const std::string done = hammer.read_line();
  EXPECT_THAT(done, StartsWith("done "));
  EXPECT_THAT(done, ::testing::EndsWith(" 0")) << hammer.read_line();
  EXPECT_EQ(hammer.wait(), 0);
  expect_integrity_ok(path);
}

}  // namespace
}  // namespace idem
