#include "support/multiprocess_checks.h"

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
#include <optional>
#include <sstream>
#include <thread>

#ifndef IDEM_STORE_WORKER
#error "IDEM_STORE_WORKER is set by tests/support/CMakeLists.txt"
#endif

extern char** environ;

namespace idem::testing {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::StartsWith;

Worker::Worker(const std::vector<std::string>& args, const std::vector<std::string>& wrapper) {
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
  std::vector<std::string> full = wrapper;
  full.emplace_back(IDEM_STORE_WORKER);
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = posix_spawnp(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(in[0]);
  ::close(out[1]);
  stdin_ = in[1];
  stdout_ = out[0];
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn " << argv[0] << " failed: " << rc;
    pid_ = -1;
  }
}

Worker::~Worker() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    wait();
  }
  if (stdin_ >= 0) ::close(stdin_);
  if (stdout_ >= 0) ::close(stdout_);
}

std::string Worker::read_line() {
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

void Worker::write_line(const std::string& line) {
  const std::string text = line + "\n";
  EXPECT_EQ(::write(stdin_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
}

void Worker::signal(int sig) { ASSERT_EQ(::kill(pid_, sig), 0); }

void Worker::stop() {
  ASSERT_EQ(::kill(pid_, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid_, &status, WUNTRACED), pid_);
  ASSERT_TRUE(WIFSTOPPED(status));
}

int Worker::wait() {
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

void wait_for_lease_expiry(Store& store, std::string_view key) {
  for (int i = 0; i < kWorkerTimeoutMs / 20; ++i) {
    std::optional<Record> r = store.get(kWorkerScope, key);
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->state, RecordState::kInProgress);
    if (r->lease_expires_at <= r->now) return;
    std::this_thread::sleep_for(20ms);
  }
  FAIL() << "the lease never expired";
}

void check_workers_race(const std::string& url, const std::string& out_stem,
                        const std::function<std::shared_ptr<Store>()>& open, int workers,
                        int keys) {
  const long long start_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count() +
                             300;
  std::vector<std::unique_ptr<Worker>> running;
  std::vector<std::string> outputs;
  for (int w = 0; w < workers; ++w) {
    outputs.push_back(out_stem + ".worker" + std::to_string(w));
    running.push_back(std::make_unique<Worker>(
        std::vector<std::string>{"race", url, std::to_string(w), std::to_string(keys),
                                 std::to_string(start_ms), outputs.back()}));
  }
  for (auto& w : running) EXPECT_EQ(w->wait(), 0);

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
    EXPECT_EQ(lines, keys) << file;
  }
  ASSERT_EQ(ran.size(), static_cast<std::size_t>(keys));
  std::shared_ptr<Store> store = open();
  for (const auto& [key, payloads] : ran) {
    ASSERT_EQ(payloads.size(), 1u) << key << " ran more than once";
    EXPECT_THAT(payloads[0], HasSubstr(":" + key));
    for (const std::string& p : replayed[key]) EXPECT_EQ(p, payloads[0]) << key;
    EXPECT_EQ(replayed[key].size(), static_cast<std::size_t>(workers - 1)) << key;
    std::optional<Record> rec = store->get(kWorkerScope, key);
    ASSERT_TRUE(rec.has_value());
    EXPECT_EQ(rec->state, RecordState::kComplete);
    EXPECT_EQ(rec->payload, payloads[0]);
  }
}

namespace {

// Starts a worker holding `key` with a 300 ms lease; returns its token (0 on failure).
Token start_holder(Worker& owner) {
  const std::string acquired = owner.read_line();
  EXPECT_THAT(acquired, StartsWith("acquired "));
  if (acquired.rfind("acquired ", 0) != 0) return 0;
  return std::stoull(acquired.substr(9));
}

void expect_thief_result(Store& store, Token first) {
  std::optional<Record> rec = store.get(kWorkerScope, "job");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, RecordState::kComplete);
  EXPECT_EQ(rec->payload, "new-owner");
  EXPECT_GT(rec->token, first);
}

}  // namespace

void check_killed_owner_is_stolen(const std::string& url, Store& store) {
  Worker owner({"hold", url, "job", "300"});
  const Token first = start_holder(owner);
  ASSERT_NE(first, 0u);
  owner.signal(SIGKILL);
  owner.wait();

  // The owner died holding the lease; the next process waits for it to expire and steals.
  Worker thief({"run", url, "job", "new-owner", "5000", "30000"});
  EXPECT_THAT(thief.read_line(), StartsWith("ran stolen=1 attempt=2 token="));
  EXPECT_EQ(thief.wait(), 0);
  expect_thief_result(store, first);
}

void check_paused_owner_is_fenced(const std::string& url, Store& store,
                                  const std::function<void(Worker&)>& stop) {
  Worker owner({"hold", url, "job", "300"});
  const Token first = start_holder(owner);
  ASSERT_NE(first, 0u);

  // Paused, its heartbeat stops too, so the lease runs out.
  stop(owner);
  wait_for_lease_expiry(store, "job");

  Worker thief({"run", url, "job", "new-owner", "5000", "30000"});
  EXPECT_THAT(thief.read_line(), StartsWith("ran stolen=1 attempt=2 token="));
  EXPECT_EQ(thief.wait(), 0);

  // SPEC §4: the old owner wakes up and finishes; its complete is fenced.
  owner.signal(SIGCONT);
  owner.write_line("go");
  EXPECT_EQ(owner.read_line(), "lease-lost");
  EXPECT_EQ(owner.wait(), 0);
  expect_thief_result(store, first);
}

}  // namespace idem::testing
