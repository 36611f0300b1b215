// End-to-end tests of the `idem` tool: each test runs the built binary as a user's shell
// would, with HOME and XDG_STATE_HOME pointed at a temporary directory. Tests that need a
// store shared between processes are parameterised on a list of store URLs: SQLite always,
// plus PostgreSQL and Redis when IDEM_TEST_POSTGRES_URL / IDEM_TEST_REDIS_URL are set. Every
// such test works in a scope of its own, so a shared server needs no cleaning between tests.
//
// No assertion depends on timing: tests wait for conditions (a file appearing, a process
// ending) with generous bounds, and commands that must stay in progress wait on a gate file.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "idem/open_store.h"
#include "idem/store.h"
#include "process.h"

#ifndef IDEM_BINARY
#error "IDEM_BINARY is set by tests/cli/CMakeLists.txt"
#endif

namespace idem::cli::test {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;
using ::testing::Not;

using Json = nlohmann::json;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

int count_lines(const fs::path& path) {
  std::string text = read_file(path);
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

std::string quote(const std::string& s) {
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
    fs::create_directories(dir_.path() / "state");
    env_["HOME"] = dir_ / "home";
    env_["XDG_STATE_HOME"] = dir_ / "state";
    env_["IDEM_STORE"] = std::nullopt;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    scope_ = std::string("cli-test-") + std::to_string(::getpid()) + "-" + info->name();
  }

  ~CliTest() override {
    // Commands left behind by a failing test wait on a gate; open it so they end.
    std::ofstream(dir_ / "go").put('\n');
  }

  ProcessResult idem(std::vector<std::string> args) { return run_process(argv(args), env_); }
  std::unique_ptr<Process> start_idem(std::vector<std::string> args) {
    return std::make_unique<Process>(argv(args), env_);
  }
  std::vector<std::string> argv(std::vector<std::string> args) {
    args.insert(args.begin(), IDEM_BINARY);
    return args;
  }

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
void PrintTo(const StoreCase& c, std::ostream* os) { *os << c.name; }

// A server store runs when this build includes it and the test script started its server
// (IDEM_TEST_<STORE>_URL); with IDEM_REQUIRE_SERVERS=1 a built store whose server is missing
// fails the run instead of leaving its cases out.
void add_server_store(std::vector<StoreCase>& out, const std::string& name,
                      const std::string& scheme, const char* env) {
  const auto schemes = idem::available_schemes();
  if (std::find(schemes.begin(), schemes.end(), scheme) == schemes.end()) return;
  const char* url = std::getenv(env);
  if (url == nullptr || *url == '\0') {
    const char* required = std::getenv("IDEM_REQUIRE_SERVERS");
    if (required != nullptr && std::string(required) == "1") {
      throw std::runtime_error(std::string("IDEM_REQUIRE_SERVERS=1 but ") + env + " is not set");
    }
    return;
  }
  out.push_back({name, [u = std::string(url)](const TempDir&) { return u; }});
}

std::vector<StoreCase> shared_stores() {
  std::vector<StoreCase> out;
  out.push_back({"sqlite", [](const TempDir& d) { return "sqlite://" + (d / "idem.db"); }});
  add_server_store(out, "postgres", "postgresql", "IDEM_TEST_POSTGRES_URL");
  add_server_store(out, "redis", "redis", "IDEM_TEST_REDIS_URL");
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

  std::string store_;
};

TEST_P(CliStoreTest, FirstRunRecordsOutputAndReplayIsByteIdentical) {
  // Binary output with NUL bytes, a 0xff byte and no final newline.
  ProcessResult first = run_sh("k", counting("printf 'a\\000b\\377\\000\\nend'"));
  ASSERT_EQ(first.status, 0) << first.err;
  EXPECT_EQ(first.out, std::string("a\0b\xff\0\nend", 9));

  ProcessResult replay = run_sh("k", counting("echo must not run; exit 9"));
  EXPECT_EQ(replay.status, 0) << replay.err;
  EXPECT_EQ(replay.out, first.out);
  EXPECT_EQ(runs(), 1);
}

TEST_P(CliStoreTest, NonZeroExitReleasesTheRecordAndALaterRunRetries) {
  ProcessResult failed = run_sh("k", counting("echo partial; exit 3"));
  EXPECT_EQ(failed.status, 3);
  EXPECT_EQ(failed.out, "partial\n");  // shown live even though it is not recorded
  EXPECT_EQ(state("k"), "ABSENT");

  ProcessResult retry = run_sh("k", counting("echo ok"));
  EXPECT_EQ(retry.status, 0) << retry.err;
  EXPECT_EQ(retry.out, "ok\n");
  EXPECT_EQ(runs(), 2);
  EXPECT_EQ(state("k"), "COMPLETE");
}

TEST_P(CliStoreTest, ChildKilledBySignalExitsWith128PlusSignalAndReleases) {
  ProcessResult killed = run_sh("k", counting("kill -KILL $$"));
  EXPECT_EQ(killed.status, 128 + SIGKILL);
  EXPECT_EQ(state("k"), "ABSENT");

  ProcessResult retry = run_sh("k", counting("echo again"));
  EXPECT_EQ(retry.status, 0) << retry.err;
  EXPECT_EQ(runs(), 2);
}

TEST_P(CliStoreTest, CommandNotFoundExits127AndReleases) {
  ProcessResult r = idem(keyed("run", "k", {"--", "/nonexistent/idem-no-such-command"}));
  EXPECT_EQ(r.status, 127);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/idem-no-such-command"));
  EXPECT_EQ(state("k"), "ABSENT");
}

TEST_P(CliStoreTest, DuplicateWhileInProgressExits75SayingWhenTheLeaseEnds) {
  auto owner = start_sh("k", gated("owner's output"));
  ASSERT_TRUE(eventually([&] { return started(); }));

  ProcessResult dup = run_sh("k", counting("echo must not run"));
  EXPECT_EQ(dup.status, 75);
  EXPECT_THAT(dup.err, AllOf(HasSubstr("lease ends at"), HasSubstr("--wait")));
  EXPECT_THAT(dup.out, IsEmpty());

  Json record = show("k");
  EXPECT_EQ(record["state"], "IN_PROGRESS");
  EXPECT_EQ(record["attempt"], 1);

  open_gate();
  ProcessResult done = owner->finish();
  EXPECT_EQ(done.status, 0) << done.err;
  EXPECT_EQ(done.out, "owner's output");
  EXPECT_EQ(runs(), 1);
}

TEST_P(CliStoreTest, DuplicateWithWaitReplaysTheOwnersResult) {
  auto owner = start_sh("k", gated("owner's output"));
  ASSERT_TRUE(eventually([&] { return started(); }));
  auto waiter = start_sh("k", counting("echo must not run"), {"--wait", "60s"});
  // Give the waiter a moment to find the key busy; the outcome is the same either way.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  open_gate();

  ProcessResult o = owner->finish();
  ProcessResult w = waiter->finish();
  EXPECT_EQ(o.status, 0) << o.err;
  EXPECT_EQ(w.status, 0) << w.err;
  EXPECT_EQ(w.out, "owner's output");
  EXPECT_EQ(runs(), 1);
}

TEST_P(CliStoreTest, TwoRunsStartedTogetherRunTheCommandOnce) {
  // Both start at once: one runs, the other waits and replays.
  std::string script = counting("echo once");
  auto a = start_sh("k", script, {"--wait", "60s"});
  auto b = start_sh("k", script, {"--wait", "60s"});
  ProcessResult ra = a->finish();
  ProcessResult rb = b->finish();
  EXPECT_EQ(ra.status, 0) << ra.err;
  EXPECT_EQ(rb.status, 0) << rb.err;
  EXPECT_EQ(ra.out, "once\n");
  EXPECT_EQ(rb.out, "once\n");
  EXPECT_EQ(runs(), 1);
}

TEST_P(CliStoreTest, KilledIdemIsTakenOverAfterItsLeaseExpires) {
  auto crashed = start_sh("k", gated("never"), {"--lease", "300ms"});
  ASSERT_TRUE(eventually([&] { return started(); }));
  crashed->kill(SIGKILL);
  EXPECT_EQ(crashed->finish().status, 128 + SIGKILL);
  // The orphaned command would otherwise wait on its gate until the test ends.
  ::kill(std::stoi(read_file(dir_.path() / "started")), SIGKILL);
  EXPECT_EQ(state("k"), "IN_PROGRESS");

  ProcessResult next = run_sh("k", "echo \"stolen=$IDEM_STOLEN attempt=$IDEM_ATTEMPT\"",
                              {"--lease", "300ms", "--wait", "60s"});
  EXPECT_EQ(next.status, 0) << next.err;
  EXPECT_EQ(next.out, "stolen=1 attempt=2\n");
}

TEST_P(CliStoreTest, SigtermIsPassedToTheCommandAndTheRecordReleased) {
  // The command catches SIGTERM and exits 0: the run still does not count, and idem does
  // not report success.
  std::string trap = "trap 'echo trapped > " + quote(dir_ / "trapped") + "; exit 0' TERM; ";
  auto run = start_sh("k", trap + gated("never"));
  ASSERT_TRUE(eventually([&] { return started(); }));
  run->kill(SIGTERM);
  ProcessResult r = run->finish();
  EXPECT_EQ(r.status, 128 + SIGTERM) << r.err;
  EXPECT_EQ(read_file(dir_.path() / "trapped"), "trapped\n");
  EXPECT_EQ(state("k"), "ABSENT");
}

TEST_P(CliStoreTest, SigintEndsTheCommandWithItsStatusAndReleases) {
  auto run = start_sh("k", gated("never"));
  ASSERT_TRUE(eventually([&] { return started(); }));
  run->kill(SIGINT);
  ProcessResult r = run->finish();
  EXPECT_EQ(r.status, 128 + SIGINT) << r.err;
  EXPECT_EQ(state("k"), "ABSENT");
}

TEST_P(CliStoreTest, LostLeaseStopsTheCommandAndExits70) {
  std::string trap = "trap 'echo terminated > " + quote(dir_ / "terminated") + "; exit 0' TERM; ";
  auto run = start_sh("k", trap + gated("never"), {"--lease", "300ms"});
  ASSERT_TRUE(eventually([&] { return started(); }));
  // An operator forgets the record; the heartbeat's next extend is fenced.
  ProcessResult forget = idem(keyed("forget", "k"));
  ASSERT_EQ(forget.status, 0) << forget.err;
  ProcessResult r = run->finish();
  EXPECT_EQ(r.status, 70) << r.err;
  EXPECT_THAT(r.err, HasSubstr("lease"));
  EXPECT_EQ(read_file(dir_.path() / "terminated"), "terminated\n");
  EXPECT_EQ(state("k"), "ABSENT");
}

TEST_P(CliStoreTest, OutputOverTheLimitIsRefusedAndTheRecordReleased) {
  ProcessResult r = run_sh("k", "head -c 2000000 /dev/zero");
  EXPECT_EQ(r.status, 73);
  EXPECT_EQ(r.out.size(), 2000000u);  // shown live; it stays shown
  EXPECT_THAT(r.err, AllOf(HasSubstr("2000000 bytes"), HasSubstr("1048576 bytes"),
                           HasSubstr("--max-output"), HasSubstr("--status-only")));
  EXPECT_EQ(state("k"), "ABSENT");
}

TEST_P(CliStoreTest, StatusOnlyRecordsTheStatusAndReplaysNothing) {
  ProcessResult r = run_sh("k", "head -c 2000000 /dev/zero", {"--status-only"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.size(), 2000000u);

  ProcessResult replay = run_sh("k", counting("echo must not run"));
  EXPECT_EQ(replay.status, 0) << replay.err;
  EXPECT_THAT(replay.out, IsEmpty());
  EXPECT_EQ(runs(), 0);
  Json record = show("k");
  EXPECT_EQ(record["status_only"], true);
  EXPECT_EQ(record["payload_bytes"], 8);
}

TEST_P(CliStoreTest, LargerMaxOutputRecordsMegabytesByteForByte) {
  // Pseudo-random bytes, every value present, written by the shell through od-free means.
  ProcessResult r = run_sh("k", "head -c 3000000 /dev/urandom", {"--max-output", "4MiB"});
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(r.out.size(), 3000000u);
  ProcessResult replay = run_sh("k", "echo must not run");
  EXPECT_EQ(replay.status, 0) << replay.err;
  EXPECT_TRUE(replay.out == r.out) << "replayed output differs";
  ProcessResult payload = idem(keyed("show", "k", {"--payload"}));
  EXPECT_TRUE(payload.out == r.out) << "show --payload differs";
}

TEST_P(CliStoreTest, CommandSeesItsLeaseInTheEnvironment) {
  ProcessResult r =
      run_sh("the key", "echo \"$IDEM_SCOPE|$IDEM_KEY|$IDEM_TOKEN|$IDEM_ATTEMPT|$IDEM_STOLEN\"");
  ASSERT_EQ(r.status, 0) << r.err;
  Json record = show("the key");
  std::string token = std::to_string(record["token"].get<std::uint64_t>());
  EXPECT_EQ(r.out, scope_ + "|the key|" + token + "|1|0\n");
}

TEST_P(CliStoreTest, VerboseSaysWhetherTheCommandRanOrWasReplayed) {
  ProcessResult ran = run_sh("k", "echo out", {"-v"});
  EXPECT_EQ(ran.status, 0) << ran.err;
  EXPECT_THAT(ran.err, AllOf(HasSubstr("running"), HasSubstr("attempt 1"), HasSubstr("recorded")));
  ProcessResult replayed = run_sh("k", "echo out", {"--verbose"});
  EXPECT_EQ(replayed.out, "out\n");
  EXPECT_THAT(replayed.err, HasSubstr("did not run"));
  ProcessResult failed = run_sh("other", "exit 4", {"-v"});
  EXPECT_EQ(failed.status, 4);
  EXPECT_THAT(failed.err, AllOf(HasSubstr("status 4"), HasSubstr("released")));
  // Without -v, idem itself says nothing.
  EXPECT_THAT(run_sh("k", "echo out").err, IsEmpty());
}

TEST_P(CliStoreTest, RecordWrittenByALibraryCallerIsNotReplayedAsOutput) {
  // A library caller completed the key under the same scope with its own bytes.
  std::shared_ptr<Store> store = open_store(store_);
  AcquireResult acquired =
      store->acquire(scope_, "k", std::chrono::seconds(30), std::chrono::hours(1));
  ASSERT_TRUE(std::holds_alternative<Acquired>(acquired));
  ASSERT_EQ(store->complete(scope_, "k", std::get<Acquired>(acquired).lease.token, "library bytes",
                            std::chrono::hours(1)),
            WriteResult::kDone);

  ProcessResult r = run_sh("k", counting("echo must not run"));
  EXPECT_EQ(r.status, 65);
  EXPECT_THAT(r.err, HasSubstr("not written by `idem run`"));
  EXPECT_THAT(r.out, IsEmpty());
  EXPECT_EQ(runs(), 0);
  Json record = show("k");
  EXPECT_EQ(record["format"], nullptr);
  EXPECT_EQ(idem(keyed("show", "k", {"--payload"})).out, "library bytes");
}

TEST_P(CliStoreTest, FingerprintMismatchExits65WithoutRunning) {
  ASSERT_EQ(run_sh("k", counting("echo a"), {"--fingerprint", "request-a"}).status, 0);
  ProcessResult other = run_sh("k", counting("echo b"), {"--fingerprint", "request-b"});
  EXPECT_EQ(other.status, 65);
  EXPECT_THAT(other.err,
              AllOf(HasSubstr("fingerprint"), HasSubstr("request-a"), HasSubstr("request-b")));
  ProcessResult same = run_sh("k", counting("echo a"), {"--fingerprint", "request-a"});
  EXPECT_EQ(same.status, 0);
  EXPECT_EQ(same.out, "a\n");
  EXPECT_EQ(runs(), 1);
}

TEST_P(CliStoreTest, ShowPrintsACompleteRecordAsJson) {
  ASSERT_EQ(run_sh("k", "printf hello").status, 0);
  Json r = show("k");
  EXPECT_EQ(r["state"], "COMPLETE");
  EXPECT_EQ(r["scope"], scope_);
  EXPECT_EQ(r["key"], "k");
  EXPECT_GT(r["token"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(r["output_bytes"], 5);
  EXPECT_EQ(r["payload_bytes"], 13);
  EXPECT_EQ(r["format"], "idem-run/1");
  EXPECT_EQ(r["exit_status"], 0);
  EXPECT_EQ(r["expired"], false);
  EXPECT_THAT(r["completed_at"].get<std::string>(),
              MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z"));
  // The TTL is 24 h by default.
  EXPECT_EQ(r["expires_at_ms"].get<std::int64_t>() - r["completed_at_ms"].get<std::int64_t>(),
            24 * 3600 * 1000);

  ProcessResult payload = idem(keyed("show", "k", {"--payload"}));
  EXPECT_EQ(payload.status, 0);
  EXPECT_EQ(payload.out, "hello");
}

TEST_P(CliStoreTest, ShowPrintsARecordInProgress) {
  auto owner = start_sh("k", gated("x"));
  ASSERT_TRUE(eventually([&] { return started(); }));
  Json r = show("k");
  EXPECT_EQ(r["state"], "IN_PROGRESS");
  EXPECT_EQ(r["attempt"], 1);
  EXPECT_EQ(r["lease_expired"], false);
  EXPECT_GT(r["lease_remaining_ms"].get<std::int64_t>(), 0);
  EXPECT_TRUE(r.contains("lease_expires_at"));
  EXPECT_TRUE(r.contains("acquired_at_ms"));
  ProcessResult payload = idem(keyed("show", "k", {"--payload"}));
  EXPECT_EQ(payload.status, 1);
  EXPECT_THAT(payload.err, HasSubstr("in progress"));
  open_gate();
  EXPECT_EQ(owner->finish().status, 0);
}

TEST_P(CliStoreTest, ShowOfAnAbsentKeyExits1) {
  Json r = show("nothing here", 1);
  EXPECT_EQ(r["state"], "ABSENT");
  ProcessResult payload = idem(keyed("show", "nothing here", {"--payload"}));
  EXPECT_EQ(payload.status, 1);
  EXPECT_THAT(payload.err, HasSubstr("no record"));
}

TEST_P(CliStoreTest, ForgetDeletesARecordAndSaysWhatItWas) {
  ASSERT_EQ(run_sh("k", counting("echo one")).status, 0);
  ProcessResult f = idem(keyed("forget", "k"));
  EXPECT_EQ(f.status, 0) << f.err;
  EXPECT_THAT(f.out, AllOf(HasSubstr("forgot"), HasSubstr("\"k\""), HasSubstr("COMPLETE")));
  EXPECT_EQ(run_sh("k", counting("echo two")).out, "two\n");
  EXPECT_EQ(runs(), 2);

  ProcessResult absent = idem(keyed("forget", "never used"));
  EXPECT_EQ(absent.status, 1);
  EXPECT_THAT(absent.err, HasSubstr("no record"));
}

TEST_P(CliStoreTest, PurgeDeletesExpiredRecords) {
  ASSERT_EQ(run_sh("k", "echo short-lived", {"--ttl", "100ms"}).status, 0);
  ASSERT_EQ(run_sh("kept", "echo long-lived").status, 0);
  // Stores with native expiry (Redis) drop the record themselves and purge reports 0.
  bool native_expiry = GetParam().name == "redis";
  bool gone = eventually([&] {
    ProcessResult p = idem({"purge", "--store", store_});
    EXPECT_EQ(p.status, 0) << p.err;
    EXPECT_THAT(p.out, HasSubstr("purged"));
    if (!native_expiry && p.out.rfind("purged 0 ", 0) == 0) return false;
    return state("k") == "ABSENT";
  });
  EXPECT_TRUE(gone);
  EXPECT_EQ(state("kept"), "COMPLETE");
}

TEST_P(CliStoreTest, PurgeHonoursItsLimit) {
  ASSERT_EQ(run_sh("a", "true", {"--ttl", "100ms"}).status, 0);
  ASSERT_EQ(run_sh("b", "true", {"--ttl", "100ms"}).status, 0);
  if (GetParam().name == "redis") GTEST_SKIP() << "Redis expires records natively";
  // Wait until both expired (show reports it by the store's clock), then purge one.
  ASSERT_TRUE(
      eventually([&] { return show("a")["expired"] == true && show("b")["expired"] == true; }));
  ProcessResult one = idem({"purge", "--store", store_, "--limit", "1"});
  EXPECT_EQ(one.status, 0) << one.err;
  EXPECT_THAT(one.out, HasSubstr("purged 1 expired record "));
  // A shared server may hold other expired records, so only the end state is certain.
  ProcessResult rest = idem({"purge", "--store", store_});
  EXPECT_EQ(rest.status, 0) << rest.err;
  EXPECT_EQ(state("a"), "ABSENT");
  EXPECT_EQ(state("b"), "ABSENT");
}

TEST_P(CliStoreTest, BenchMeasuresTheStore) {
  for (std::string mode : {"fresh", "replay", "mixed"}) {
    ProcessResult r = idem({"bench", "--store", store_, "--ops", "200", "--concurrency", "2",
                            "--mode", mode, "--json"});
    ASSERT_EQ(r.status, 0) << mode << ": " << r.err;
    Json j = Json::parse(r.out);
    EXPECT_EQ(j["mode"], mode);
    EXPECT_EQ(j["measured"], 200);
    EXPECT_EQ(j["errors"], 0);
    const Json& l = j["latency_us"];
    EXPECT_LE(l["p50"].get<double>(), l["p99"].get<double>());
    EXPECT_LE(l["p99"].get<double>(), l["p999"].get<double>());
    EXPECT_LE(l["p999"].get<double>(), l["max"].get<double>());
    EXPECT_GT(j["ops_per_s"].get<double>(), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, CliStoreTest, ::testing::ValuesIn(shared_stores()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------
// Arguments, the default store and the in-process store.

TEST_F(CliTest, VersionPrintsTheVersion) {
  ProcessResult r = idem({"--version"});
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, MatchesRegex("idem [0-9]+\\.[0-9]+\\.[0-9]+\n"));
}

TEST_F(CliTest, EveryCommandHasHelp) {
  for (std::string command : {"run", "show", "purge", "forget", "bench"}) {
    ProcessResult r = idem({command, "--help"});
    EXPECT_EQ(r.status, 0) << command;
    EXPECT_THAT(r.out, HasSubstr("--store")) << command;
  }
  ProcessResult top = idem({"--help"});
  EXPECT_EQ(top.status, 0);
  EXPECT_THAT(top.out, AllOf(HasSubstr("run"), HasSubstr("bench")));
}

TEST_F(CliTest, NoCommandIsAUsageError) {
  ProcessResult r = idem({});
  EXPECT_EQ(r.status, 64);
  EXPECT_THAT(r.err, HasSubstr("subcommand"));
}

TEST_F(CliTest, BadDurationsExit64NamingTheOption) {
  struct Case {
    std::string option, value;
  };
  for (const Case& c : {Case{"--ttl", "5x"}, Case{"--lease", "0s"}, Case{"--wait", "soon"},
                        Case{"--ttl", "30"}, Case{"--lease", "400d"}, Case{"--grace", "-1s"}}) {
    ProcessResult r =
        idem({"run", "--store", "memory:", "--key", "k", c.option, c.value, "--", "true"});
    EXPECT_EQ(r.status, 64) << c.option << " " << c.value;
    EXPECT_THAT(r.err, HasSubstr(c.option)) << c.value;
  }
}

TEST_F(CliTest, AcceptedDurationsRun) {
  ProcessResult r = idem({"run", "--store", "memory:", "--key", "k", "--ttl", "7d", "--lease",
                          "250ms", "--wait", "1h30m", "--", "echo", "ok"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "ok\n");
}

TEST_F(CliTest, MissingKeyExits64NamingIt) {
  ProcessResult r = idem({"run", "--store", "memory:", "--", "true"});
  EXPECT_EQ(r.status, 64);
  EXPECT_THAT(r.err, HasSubstr("--key"));
  EXPECT_EQ(idem({"show", "--store", "memory:"}).status, 64);
  EXPECT_EQ(idem({"forget", "--store", "memory:"}).status, 64);
}

TEST_F(CliTest, MissingCommandExits64) {
  ProcessResult r = idem({"run", "--store", "memory:", "--key", "k"});
  EXPECT_EQ(r.status, 64);
  EXPECT_THAT(r.err, AllOf(HasSubstr("command"), HasSubstr("--")));
  ProcessResult dashes = idem({"run", "--store", "memory:", "--key", "k", "--"});
  EXPECT_EQ(dashes.status, 64);
}

TEST_F(CliTest, OversizedKeyExits64NamingIt) {
  ProcessResult r =
      idem({"run", "--store", "memory:", "--key", std::string(1025, 'k'), "--", "true"});
  EXPECT_EQ(r.status, 64);
  EXPECT_THAT(r.err, AllOf(HasSubstr("--key"), HasSubstr("1024")));
}

TEST_F(CliTest, BadMaxOutputExits64NamingIt) {
  for (std::string value : {"lots", "65MiB"}) {
    ProcessResult r =
        idem({"run", "--store", "memory:", "--key", "k", "--max-output", value, "--", "true"});
    EXPECT_EQ(r.status, 64) << value;
    EXPECT_THAT(r.err, HasSubstr("--max-output")) << value;
  }
}

TEST_F(CliTest, CommandArgumentsAreNotTakenAsOptions) {
  // Without "--", everything from the command on still belongs to the command.
  ProcessResult r = idem({"run", "--store", "memory:", "--key", "k", "echo", "-n", "--key"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "--key");
}

TEST_F(CliTest, UnknownStoreSchemeExits64) {
  ProcessResult r = idem({"run", "--store", "nosuch://host/db", "--key", "k", "--", "true"});
  EXPECT_EQ(r.status, 64);
  EXPECT_THAT(r.err, AllOf(HasSubstr("store URL"), HasSubstr("nosuch")));
  EXPECT_EQ(idem({"show", "--store", "not a url", "--key", "k"}).status, 64);
}

TEST_F(CliTest, UnreachableStoreExits69) {
  // A database "inside" a regular file can never be opened.
  std::ofstream(dir_ / "file").put('x');
  std::string url = "sqlite://" + (dir_ / "file") + "/idem.db";
  ProcessResult r =
      idem({"run", "--store", url, "--key", "k", "--", "sh", "-c", counting("echo must not run")});
  EXPECT_EQ(r.status, 69);
  EXPECT_THAT(r.err, HasSubstr("idem.db"));
  EXPECT_EQ(runs(), 0);
  EXPECT_EQ(idem({"show", "--store", url, "--key", "k"}).status, 69);
  EXPECT_EQ(idem({"purge", "--store", url}).status, 69);
}

TEST_F(CliTest, DefaultStoreLivesUnderXdgStateHome) {
  ProcessResult first = idem({"run", "--key", "k", "--", "sh", "-c", counting("echo hi")});
  ASSERT_EQ(first.status, 0) << first.err;
  EXPECT_TRUE(fs::exists(dir_.path() / "state" / "idem" / "idem.db"));
  ProcessResult replay = idem({"run", "--key", "k", "--", "sh", "-c", counting("echo hi")});
  EXPECT_EQ(replay.out, "hi\n");
  EXPECT_EQ(runs(), 1);
}

TEST_F(CliTest, DefaultStoreFallsBackToHomeWithoutXdgStateHome) {
  env_["XDG_STATE_HOME"] = std::nullopt;
  ProcessResult r = idem({"run", "--key", "k", "--", "true"});
  ASSERT_EQ(r.status, 0) << r.err;
  fs::path db = dir_.path() / "home" / ".local" / "state" / "idem" / "idem.db";
  EXPECT_TRUE(fs::exists(db));
  // The directory is private to the user.
  EXPECT_EQ(fs::status(db.parent_path()).permissions() & fs::perms::all, fs::perms::owner_all);
}

TEST_F(CliTest, IdemStoreEnvironmentVariableChoosesTheStore) {
  env_["IDEM_STORE"] = "sqlite://" + (dir_ / "from-env.db");
  ASSERT_EQ(idem({"run", "--key", "k", "--", "true"}).status, 0);
  EXPECT_TRUE(fs::exists(dir_.path() / "from-env.db"));
  EXPECT_FALSE(fs::exists(dir_.path() / "state" / "idem"));
  // --store wins over the variable.
  ASSERT_EQ(
      idem({"run", "--store", "sqlite://" + (dir_ / "flag.db"), "--key", "k", "--", "true"}).status,
      0);
  EXPECT_TRUE(fs::exists(dir_.path() / "flag.db"));
}

TEST_F(CliTest, BenchRunsOnTheMemoryStore) {
  ProcessResult r = idem({"bench", "--store", "memory:", "--ops", "1000", "--concurrency", "4",
                          "--mode", "mixed", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  Json j = Json::parse(r.out);
  EXPECT_EQ(j["store"], "memory:");
  EXPECT_EQ(j["measured"], 1000);
  EXPECT_EQ(j["errors"], 0);
  ProcessResult text = idem({"bench", "--store", "memory:", "--ops", "100"});
  EXPECT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, AllOf(HasSubstr("ops/s"), HasSubstr("p50"), HasSubstr("p99.9")));
}

TEST_F(CliTest, BenchRejectsBadArguments) {
  EXPECT_EQ(idem({"bench", "--ops", "10"}).status, 64);  // --store is required
  EXPECT_EQ(idem({"bench", "--store", "memory:", "--mode", "sideways"}).status, 64);
  EXPECT_EQ(idem({"bench", "--store", "memory:", "--ops", "0"}).status, 64);
}

}  // namespace
}  // namespace idem::cli::test
