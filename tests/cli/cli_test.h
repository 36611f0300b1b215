#pragma once

// What the tool's end-to-end tests share (cli_test.cpp, cli_store_test.cpp): the binary under
// test, a temporary directory per test, the fixtures and the stores they run on.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef IDEM_CLI_TEST_SQLITE
#include <sqlite3.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "idem/open_store.h"
#include "idem/store.h"
#include "process.h"
#include "support/server_stores.h"

#ifndef IDEM_BINARY
#error "IDEM_BINARY is set by tests/cli/CMakeLists.txt"
#endif
#ifndef IDEM_SIGNAL_RECORDER
#error "IDEM_SIGNAL_RECORDER is set by tests/cli/CMakeLists.txt"
#endif
#ifndef IDEM_CLI_TEST_POOLERS
#error "IDEM_CLI_TEST_POOLERS is set by tests/cli/CMakeLists.txt"
#endif

namespace idem::cli::test {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;
using ::testing::Not;

using Json = nlohmann::json;
using namespace std::chrono_literals;

// The binary under test. IDEM_CLI_TEST_BINARY overrides the one built beside these tests, to
// check that a test fails with an older build.
inline std::string idem_binary() {
  const char* binary = std::getenv("IDEM_CLI_TEST_BINARY");
  return binary != nullptr && *binary != '\0' ? binary : IDEM_BINARY;
}

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline int count_lines(const fs::path& path) {
  std::string text = read_file(path);
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

inline std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A temporary directory per test: the home directory, the state directory, an SQLite
// store, gate files and counters.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/idem-cli-test-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

class CliTest : public ::testing::Test {
 protected:
  CliTest() {
    fs::create_directories(dir_.path() / "home");
    env_["HOME"] = dir_ / "home";
    env_["XDG_STATE_HOME"] = dir_ / "state";
    env_["IDEM_STORE"] = std::nullopt;
    // Scripts run by sh() name the binary under test as "$IDEM".
    env_["IDEM"] = idem_binary();
    // Commands killed by SIGQUIT must not leave core files behind.
    const rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    scope_ = std::string("cli-test-") + std::to_string(::getpid()) + "-" + info->name();
  }

  ~CliTest() override {
    // Commands left behind by a failing test wait on a gate; open it so they end.
    std::ofstream(dir_ / "go").put('\n');
  }

  ProcessResult idem(std::vector<std::string> args) { return run_process(argv(args), env_); }
  std::unique_ptr<Process> start_idem(std::vector<std::string> args, ProcessOptions options = {}) {
    return std::make_unique<Process>(argv(args), env_, options);
  }
  std::vector<std::string> argv(std::vector<std::string> args) {
    args.insert(args.begin(), idem_binary());
    return args;
  }
  // Runs `script` with /bin/sh (bash with `use_bash`); "$IDEM" in it is the binary.
  ProcessResult sh(const std::string& script, std::chrono::seconds bound = 60s,
                   bool use_bash = false) {
    return run_process({use_bash ? "/bin/bash" : "/bin/sh", "-c", script}, env_, bound);
  }
  std::unique_ptr<Process> start_script(const std::string& script) {
    return std::make_unique<Process>(std::vector<std::string>{"/bin/sh", "-c", script}, env_);
  }
  // The pid a command wrote to file `name` (complete once the file exists).
  pid_t pid_in(const std::string& name) const { return std::stoi(read_file(dir_.path() / name)); }
  // The signals the signal recorder received: (signal, sender pid) pairs.
  std::vector<std::pair<int, pid_t>> recorded_signals() const {
    std::vector<std::pair<int, pid_t>> out;
    std::istringstream in(read_file(dir_.path() / "signals"));
    int sig = 0;
    pid_t sender = 0;
    while (in >> sig >> sender) out.emplace_back(sig, sender);
    return out;
  }
  // Runs `argv` as another user when the tests run as root (root ignores permission bits),
  // so a file made read-only is read-only for it. The temporary directory is opened to
  // others for that.
  std::vector<std::string> as_unprivileged(std::vector<std::string> args) {
    if (::geteuid() != 0) return args;
    fs::permissions(dir_.path(), fs::perms::owner_all | fs::perms::group_read |
                                     fs::perms::group_exec | fs::perms::others_read |
                                     fs::perms::others_exec);
    const std::string uid = std::to_string(kUnprivilegedUid);
    args.insert(args.begin(),
                {"/usr/bin/setpriv", "--reuid=" + uid, "--regid=" + uid, "--clear-groups"});
    return args;
  }
  // A user id nothing else runs as, for as_unprivileged and process limits.
  static constexpr int kUnprivilegedUid = 61000;

  // A shell command that records each run in `counter`, marks that it started, waits for
  // the gate file "go" (or for the test directory to disappear), then prints `output`. The
  // "started" file appears complete, holding the shell's pid (written aside, then renamed).
  std::string gated(const std::string& output) {
    return "echo run >> " + quote(dir_ / "counter") + "; echo $$ > " + quote(dir_ / "started.tmp") +
           " && mv " + quote(dir_ / "started.tmp") + " " + quote(dir_ / "started") +
           "; while [ ! -e " + quote(dir_ / "go") + " ]; do [ -d " + quote(dir_.path()) +
           " ] || exit 1; sleep 0.01; done; printf %s " + quote(output);
  }
  bool started() const { return fs::exists(dir_.path() / "started"); }
  bool exists(const std::string& name) const { return fs::exists(dir_.path() / name); }
  // A command that records the signals it gets (see signal_recorder.cpp).
  std::vector<std::string> recorder(bool exit_on_signal = false) const {
    std::vector<std::string> out = {IDEM_SIGNAL_RECORDER, dir_.path().string()};
    if (exit_on_signal) out.push_back("exit-on-signal");
    return out;
  }
  void open_gate() const { std::ofstream(dir_ / "go").put('\n'); }
  int runs() const { return count_lines(dir_.path() / "counter"); }
  std::string counting(const std::string& script) {
    return "echo run >> " + quote(dir_ / "counter") + "; " + script;
  }

  TempDir dir_;
  EnvChanges env_;
  std::string scope_;
};

// ---------------------------------------------------------------------------------------
// Tests that need a store shared by several processes, run once per store.

struct StoreCase {
  std::string name;
  // The store URL for a test whose temporary directory is the argument.
  std::function<std::string(const TempDir&)> url;
};

// Names the store in test output instead of dumping the object's bytes.
inline void PrintTo(const StoreCase& c, std::ostream* os) { *os << c.name; }

// SQLite, then each server store this build includes whose server the test script started
// (support/server_stores.h: with IDEM_REQUIRE_SERVERS=1 a missing one fails the run), and
// in the build with the server stores' own suites (IDEM_CLI_TEST_POOLERS) PostgreSQL behind
// PgBouncer in transaction pooling too.
inline std::vector<StoreCase> shared_stores() {
  std::vector<StoreCase> out;
  // The ctest entry idem_cli_test_redis_topology (tests/cli/CMakeLists.txt) runs these
  // cases again on Redis Cluster and over TLS, and on those only.
  if (const char* topology = std::getenv("IDEM_CLI_TEST_REDIS_TOPOLOGY");
      topology != nullptr && *topology == '1') {
    for (auto& [name, url] : idem::testing::redis_topology_urls()) {
      out.push_back({name, [u = url](const TempDir&) { return u; }});
    }
    return out;
  }
  out.push_back({"sqlite", [](const TempDir& d) { return "sqlite://" + (d / "idem.db"); }});
  for (auto& [name, url] : idem::testing::server_store_urls(IDEM_CLI_TEST_POOLERS != 0)) {
    out.push_back({name, [u = url](const TempDir&) { return u; }});
  }
  return out;
}

class CliStoreTest : public CliTest, public ::testing::WithParamInterface<StoreCase> {
 protected:
  CliStoreTest() : store_(GetParam().url(dir_)) {}

  // `idem SUBCOMMAND --store URL --scope SCOPE --key KEY ARGS...`
  std::vector<std::string> keyed(const std::string& subcommand, const std::string& key,
                                 std::vector<std::string> args = {}) {
    std::vector<std::string> out = {subcommand, "--store", store_, "--scope", scope_, "--key", key};
    out.insert(out.end(), args.begin(), args.end());
    return out;
  }
  // `idem run ... --key KEY OPTIONS... -- sh -c SCRIPT`
  ProcessResult run_sh(const std::string& key, const std::string& script,
                       std::vector<std::string> options = {}) {
    options.insert(options.end(), {"--", "sh", "-c", script});
    return idem(keyed("run", key, options));
  }
  std::unique_ptr<Process> start_sh(const std::string& key, const std::string& script,
                                    std::vector<std::string> options = {}) {
    options.insert(options.end(), {"--", "sh", "-c", script});
    return start_idem(keyed("run", key, options));
  }
  Json show(const std::string& key, int expected_status = 0) {
    ProcessResult r = idem(keyed("show", key));
    EXPECT_EQ(r.status, expected_status) << r.err;
    return Json::parse(r.out);
  }
  std::string state(const std::string& key) {
    ProcessResult r = idem(keyed("show", key));
    return Json::parse(r.out).value("state", "");
  }
  // The record as `idem show` prints it, whatever the exit status.
  Json record(const std::string& key) { return Json::parse(idem(keyed("show", key)).out); }
  // `"$IDEM" SUBCOMMAND --store URL --scope SCOPE --key KEY`, quoted for sh.
  std::string keyed_sh(const std::string& subcommand, const std::string& key) const {
    return "\"$IDEM\" " + subcommand + " --store " + quote(store_) + " --scope " + quote(scope_) +
           " --key " + quote(key);
  }
  // A command (for sh -c) that starts a grandchild and waits for it. The grandchild ignores
  // SIGTERM (and, as a background job of sh, SIGINT and SIGQUIT), writes its pid to the
  // file "grandchild", then appends a tick (microseconds since the epoch) to "ticks" every
  // 10 ms for as long as it lives.
  std::string with_grandchild() const {
    const std::string script = "trap '' TERM; echo $$ > " + quote(dir_ / "grandchild.tmp") +
                               " && mv " + quote(dir_ / "grandchild.tmp") + " " +
                               quote(dir_ / "grandchild") + "; while [ -d " + quote(dir_.path()) +
                               " ]; do echo " + "\"${EPOCHREALTIME/./}\" >> " +
                               quote(dir_ / "ticks") + "; sleep 0.01; done";
    return "bash -c " + quote(script) + " & wait";
  }
  // A command that prints "alone" when process `pid` is not running, else "alive".
  static std::string alone_check(pid_t pid) {
    const std::string stat = "/proc/" + std::to_string(pid) + "/stat";
    return "s=$(sed -e 's/.*) //' " + stat +
           " 2>/dev/null | cut -c1); "
           "if [ -n \"$s\" ] && [ \"$s\" != Z ]; then echo alive; else echo alone; fi";
  }
  // The last tick the grandchild of with_grandchild() wrote, in microseconds.
  std::int64_t last_tick() const {
    std::istringstream in(read_file(dir_.path() / "ticks"));
    std::int64_t tick = 0;
    std::int64_t last = 0;
    while (in >> tick) last = tick;
    return last;
  }
  bool is_sqlite() const { return GetParam().name == "sqlite"; }
  // Any Redis setup (standalone, Cluster, TLS): records expire natively.
  bool is_redis() const { return GetParam().name.rfind("redis", 0) == 0; }
  std::string sqlite_path() const { return dir_ / "idem.db"; }

  std::string store_;
};

#ifdef IDEM_CLI_TEST_SQLITE
// Holds the SQLite file's write lock (as another process's long transaction would) until
// unlock() or destruction: idem's writes then fail once their busy timeout ends.
class SqliteLock {
 public:
  explicit SqliteLock(const std::string& path) {
    sqlite3* raw = nullptr;
    if (sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << "cannot open " << path;
    }
    db_.reset(raw);
    sqlite3_busy_timeout(raw, 30'000);
    locked_ = exec("BEGIN EXCLUSIVE");
  }
  void unlock() {
    if (locked_) exec("ROLLBACK");
    locked_ = false;
  }
  ~SqliteLock() { unlock(); }
  SqliteLock(const SqliteLock&) = delete;
  SqliteLock& operator=(const SqliteLock&) = delete;

 private:
  bool exec(const char* sql) {
    char* error = nullptr;
    const int rc = sqlite3_exec(db_.get(), sql, nullptr, nullptr, &error);
    if (rc != SQLITE_OK) ADD_FAILURE() << sql << ": " << (error != nullptr ? error : "?");
    sqlite3_free(error);
    return rc == SQLITE_OK;
  }
  struct Closer {
    void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
  };
  std::unique_ptr<sqlite3, Closer> db_;
  bool locked_ = false;
};

// Counts the records in the SQLite file, whatever their scope.
inline std::int64_t count_records(const std::string& path) {
  sqlite3* raw = nullptr;
  if (sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close_v2(raw);
    return -1;
  }
  std::unique_ptr<sqlite3, decltype(&sqlite3_close_v2)> db(raw, &sqlite3_close_v2);
  sqlite3_busy_timeout(raw, 30'000);
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(raw, "SELECT count(*) FROM idem_records", -1, &stmt, nullptr) !=
      SQLITE_OK) {
    return -1;
  }
  std::int64_t n = sqlite3_step(stmt) == SQLITE_ROW ? sqlite3_column_int64(stmt, 0) : -1;
  sqlite3_finalize(stmt);
  return n;
}
#endif

}  // namespace idem::cli::test
