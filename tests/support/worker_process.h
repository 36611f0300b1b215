#pragma once

// A store worker process (tests/support/store_worker.cpp) driven through pipes, for the
// multi-process tests of every shared store; and the check of a "race" run's outputs. The
// worker's path comes from the build (IDEM_STORE_WORKER).

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "idem/store.h"

#ifndef IDEM_STORE_WORKER
#error "IDEM_STORE_WORKER is set by the test's CMakeLists.txt"
#endif

extern char** environ;

namespace idem::testing {

using namespace std::chrono_literals;

// Every wait on a worker is bounded by this, so a broken worker fails the test instead of
// hanging it. It is a bound, not an expectation about speed.
inline constexpr int kWorkerTimeoutMs = 60'000;

// A worker process with its standard input and output connected to pipes. Killed (if
// still running) and reaped by the destructor.
class Worker {
 public:
  // Runs the store worker with `args`; `prefix` (e.g. {"faketime", "-f", "+5h"}) runs it
  // under another program.
  explicit Worker(const std::vector<std::string>& args,
                  const std::vector<std::string>& prefix = {}) {
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
    std::vector<std::string> full = prefix;
    full.push_back(IDEM_STORE_WORKER);
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
      ADD_FAILURE() << "posix_spawn " << full.front() << " failed: " << rc;
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

  // The worker's exit status (-1 after a signal) when it has exited, without waiting for
  // it; nullopt while it runs or is stopped.
  std::optional<int> exit_status() {
    int status = 0;
    if (pid_ <= 0 || ::waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
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

// Waits until the store reports the lease on (scope, key) as passed by its own clock.
inline void wait_for_lease_expiry(Store& store, std::string_view scope, std::string_view key) {
  for (int i = 0; i < kWorkerTimeoutMs / 20; ++i) {
    std::optional<Record> r = store.get(scope, key);
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->state, RecordState::kInProgress);
    if (r->lease_expires_at <= r->now) return;
    std::this_thread::sleep_for(20ms);
  }
  FAIL() << "the lease never expired";
}

// Waits until the record's TTL has passed by the store's clock, or a store with native
// expiry (Redis) has dropped it.
inline void wait_for_record_expiry(Store& store, std::string_view scope, std::string_view key) {
  for (int i = 0; i < kWorkerTimeoutMs / 20; ++i) {
    std::optional<Record> r = store.get(scope, key);
    if (!r || r->expires_at <= r->now) return;
    std::this_thread::sleep_for(20ms);
  }
  FAIL() << "the record never expired";
}

// The end of the paused-owner test of every shared store: `owner` ("hold" on key "job") is
// stopped and its lease has passed. A thief steals the key and completes it with
// "new-owner"; then the owner continues, finishes, and its complete is fenced (SPEC §4).
// The record keeps the thief's result, under a token above `first`.
inline void steal_from_paused_owner(Worker& owner, const std::string& url, Store& store,
                                    Token first) {
  Worker thief({"run", url, "job", "new-owner", "5000", "30000"});
  EXPECT_THAT(thief.read_line(), ::testing::StartsWith("ran stolen=1 attempt=2 token="));
  EXPECT_EQ(thief.wait(), 0);

  owner.signal(SIGCONT);
  owner.write_line("go");
  EXPECT_EQ(owner.read_line(), "lease-lost");
  EXPECT_EQ(owner.wait(), 0);

  std::optional<Record> rec = store.get("mp", "job");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->state, RecordState::kComplete);
  EXPECT_EQ(rec->payload, "new-owner");
  EXPECT_GT(rec->token, first);
}

// Runs `workers` "race" workers on the store at `url` over `keys` overlapping keys, started
// together, each writing its outcomes to `<output_prefix><n>`; checks that each exited with
// 0, that every key ran exactly once and that every other worker replayed that run's
// payload (check_race_outputs). Returns key -> the payload of its run.
inline std::map<std::string, std::string> run_race(const std::string& url, int workers, int keys,
                                                   const std::string& output_prefix);

// Reads the files the "race" workers wrote and checks that every key ran exactly once and
// every other worker replayed that run's payload. Returns key -> the payload of its run.
inline std::map<std::string, std::string> check_race_outputs(const std::vector<std::string>& files,
                                                             int keys) {
  std::map<std::string, std::vector<std::string>> ran;       // key -> payloads of runs
  std::map<std::string, std::vector<std::string>> replayed;  // key -> payloads replayed
  for (const std::string& file : files) {
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
  EXPECT_EQ(ran.size(), static_cast<std::size_t>(keys));
  std::map<std::string, std::string> out;
  for (const auto& [key, payloads] : ran) {
    EXPECT_EQ(payloads.size(), 1u) << key << " ran more than once";
    EXPECT_THAT(payloads[0], ::testing::HasSubstr(":" + key));
    for (const std::string& p : replayed[key]) EXPECT_EQ(p, payloads[0]) << key;
    EXPECT_EQ(replayed[key].size(), files.size() - 1) << key;
    out[key] = payloads[0];
  }
  return out;
}

inline std::map<std::string, std::string> run_race(const std::string& url, int workers, int keys,
                                                   const std::string& output_prefix) {
  const long long start_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count() +
                             500;
  std::vector<std::unique_ptr<Worker>> running;
  std::vector<std::string> outputs;
  for (int w = 0; w < workers; ++w) {
    outputs.push_back(output_prefix + std::to_string(w));
    // The workers also race to create the store's file or table.
    running.push_back(std::make_unique<Worker>(
        std::vector<std::string>{"race", url, std::to_string(w), std::to_string(keys),
                                 std::to_string(start_ms), outputs.back()}));
  }
  for (auto& w : running) EXPECT_EQ(w->wait(), 0);
  std::map<std::string, std::string> ran = check_race_outputs(outputs, keys);
  for (const std::string& f : outputs) std::remove(f.c_str());
  return ran;
}

// --- clock skew: callers under faketime, hours ahead and behind ---

struct Skewed {
  std::vector<std::string> prefix;
  long long offset_ms;
};

inline const Skewed kAhead{{"faketime", "-f", "+5h"}, 5LL * 3600 * 1000};
inline const Skewed kBehind{{"faketime", "-f", "-5h"}, -5LL * 3600 * 1000};

inline long long wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Runs the worker under a shifted clock and returns its answer line, after checking that
// its clock really was shifted.
inline std::string run_skewed(const Skewed& skew, const std::vector<std::string>& args) {
  const long long before = wall_ms();
  Worker w(args, skew.prefix);
  std::string line = w.read_line();
  if (args.front() == "acquire") {
    EXPECT_THAT(line, ::testing::StartsWith("clock "));
    const long long seen = std::stoll(line.substr(6)) - before;
    // Within an hour of the intended shift (the worker starts within seconds).
    EXPECT_LT(std::llabs(seen - skew.offset_ms), 3600LL * 1000) << "faketime did not shift";
    line = w.read_line();
  }
  EXPECT_EQ(w.wait(), 0);
  return line;
}

// The clock-skew test of every server store, on key "k" of scope "mp" at `url`: callers
// five hours ahead and behind (faketime) agree on the busy answer, the steal, fencing, the
// replay and the expiry, because only the store's clock judges them.
inline void check_callers_hours_apart_agree(const std::string& url, Store& store) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "faketime preloads a library, which a sanitizer runtime refuses";
#endif
  // The worker's steady clock stays true: only the wall clock is shifted.
  ASSERT_EQ(::setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1", 1), 0);
  constexpr int kLease = 1500;
  std::istringstream first(
      run_skewed(kAhead, {"acquire", url, "k", std::to_string(kLease), "3600000"}));
  std::string what;
  Token ahead_token = 0;
  first >> what >> ahead_token;
  ASSERT_EQ(what, "acquired");

  // Five hours behind, the lease is still live, with at most its length left.
  std::istringstream busy(run_skewed(kBehind, {"acquire", url, "k", "60000", "3600000"}));
  long long remaining = -1;
  busy >> what >> remaining;
  EXPECT_EQ(what, "busy");
  EXPECT_GT(remaining, 0);
  EXPECT_LE(remaining, kLease);

  // Once the server says the lease passed, the caller behind steals it.
  wait_for_lease_expiry(store, "mp", "k");
  std::istringstream steal(run_skewed(kBehind, {"acquire", url, "k", "60000", "3600000"}));
  Token behind_token = 0;
  int attempt = 0;
  int stolen = 0;
  steal >> what >> behind_token >> attempt >> stolen >> remaining;
  ASSERT_EQ(what, "acquired");
  EXPECT_EQ(attempt, 2);
  EXPECT_EQ(stolen, 1);
  EXPECT_GT(behind_token, ahead_token);
  EXPECT_GT(remaining, 0);
  EXPECT_LE(remaining, 60000);

  // The caller ahead is fenced; the thief completes with a short TTL.
  EXPECT_EQ(
      run_skewed(kAhead, {"complete", url, "k", std::to_string(ahead_token), "ahead", "1500"}),
      "fenced");
  EXPECT_EQ(
      run_skewed(kBehind, {"complete", url, "k", std::to_string(behind_token), "behind", "1500"}),
      "done");
  // Five hours ahead, the result has not expired: the server says so.
  EXPECT_EQ(run_skewed(kAhead, {"acquire", url, "k", "60000", "3600000"}), "replay behind");

  // Once it expired by the server's clock, the caller five hours behind starts afresh.
  wait_for_record_expiry(store, "mp", "k");
  std::istringstream fresh(run_skewed(kBehind, {"acquire", url, "k", "60000", "3600000"}));
  fresh >> what >> behind_token >> attempt >> stolen;
  EXPECT_EQ(what, "acquired");
  EXPECT_EQ(attempt, 1);
  EXPECT_EQ(stolen, 0);
  ::unsetenv("FAKETIME_DONT_FAKE_MONOTONIC");
}

}  // namespace idem::testing
