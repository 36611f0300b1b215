// Unit tests of the pieces of the `idem` tool that need no store: durations, sizes, the
// payload format, times, where the default store lives, the JSON of a record, and the child
// process runner.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>

#include "child.h"
#include "common.h"
#include "idem/open_store.h"
#include "json_output.h"
#include "payload.h"

namespace idem::cli {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// Sets an environment variable for the life of the object, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::filesystem::path make_temp_dir() {
  std::string pattern = "/tmp/idem-cli-unit-XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

// --- durations and sizes ---

TEST(Durations, AcceptEveryUnit) {
  EXPECT_EQ(parse_duration("250ms"), Duration{250});
  EXPECT_EQ(parse_duration("30s"), Duration{30'000});
  EXPECT_EQ(parse_duration("5m"), Duration{300'000});
  EXPECT_EQ(parse_duration("24h"), Duration{86'400'000});
  EXPECT_EQ(parse_duration("7d"), Duration{7 * 86'400'000LL});
  EXPECT_EQ(parse_duration("0s"), Duration{0});
}

TEST(Durations, AcceptABareZeroAndDecimals) {
  EXPECT_EQ(parse_duration("0"), Duration{0});
  EXPECT_EQ(parse_duration("1.5s"), Duration{1'500});
  EXPECT_EQ(parse_duration("0.25s"), Duration{250});
  EXPECT_EQ(parse_duration("1.5h"), Duration{5'400'000});
  EXPECT_EQ(parse_duration("0.001s"), Duration{1});
  EXPECT_EQ(parse_duration("2.50m"), Duration{150'000});
  EXPECT_EQ(parse_duration("1h0.5m"), Duration{3'630'000});
  // SPEC §6: millisecond resolution; anything finer is refused, not rounded.
  std::string why;
  EXPECT_EQ(parse_duration("1.5ms", &why), std::nullopt);
  EXPECT_THAT(why, HasSubstr("millisecond"));
  EXPECT_EQ(parse_duration("0.0001s", &why), std::nullopt);
  // A bare number other than 0 still needs its unit.
  EXPECT_EQ(parse_duration("30", &why), std::nullopt);
  EXPECT_THAT(why, HasSubstr("missing unit"));
}

TEST(Durations, AcceptSums) {
  EXPECT_EQ(parse_duration("1h30m"), Duration{5'400'000});
  EXPECT_EQ(parse_duration("1s500ms"), Duration{1'500});
}

TEST(Durations, RejectGarbageSayingWhy) {
  for (const char* text : {"", "30", "5x", "-1s", "s", " 1s", "1s ", "1 s", "ms", "00", "0.0",
                           "1.s", ".5s", "1.5", "1.0000000001s"}) {
    std::string why;
    EXPECT_EQ(parse_duration(text, &why), std::nullopt) << text;
    EXPECT_FALSE(why.empty()) << text;
  }
  std::string why;
  EXPECT_EQ(parse_duration("99999999999999999999d", &why), std::nullopt);
  EXPECT_EQ(parse_duration("9999999999999d", &why), std::nullopt);
  EXPECT_THAT(why, HasSubstr("too large"));
}

TEST(Durations, OptionErrorsNameTheOption) {
  try {
    (void)duration_option("--ttl", "5x", false);
    FAIL() << "no exception";
  } catch (const UsageError& e) {
    EXPECT_EQ(e.option(), "--ttl");
    EXPECT_THAT(e.what(), HasSubstr("5x"));
  }
  EXPECT_THROW((void)duration_option("--lease", "0ms", false), UsageError);
  EXPECT_EQ(duration_option("--wait", "0s", true), Duration{0});
  EXPECT_EQ(duration_option("--wait", "0", true), Duration{0});
  EXPECT_THROW((void)duration_option("--lease", "0", false), UsageError);
  // SPEC §10: at most 365 days.
  EXPECT_EQ(duration_option("--ttl", "365d", false), kMaxDuration);
  EXPECT_THROW((void)duration_option("--ttl", "366d", false), UsageError);
}

TEST(Sizes, AcceptBytesKibAndMib) {
  EXPECT_EQ(parse_size("1048576"), 1048576u);
  EXPECT_EQ(parse_size("512KiB"), 512u * 1024);
  EXPECT_EQ(parse_size("4MiB"), 4u << 20);
  EXPECT_EQ(parse_size("4M"), 4u << 20);
  EXPECT_EQ(parse_size("0"), 0u);
  for (const char* text : {"", "x", "4GB", "-1", "1.5MiB", "MiB"}) {
    EXPECT_EQ(parse_size(text), std::nullopt) << text;
  }
}

// --- payload format ---

TEST(Payload, HeaderIsVersionedAndOutputFollowsByteForByte) {
  CommandResult r;
  r.output = std::string("a\0b\xff", 4);
  std::string bytes = encode_payload(r);
  EXPECT_EQ(bytes, std::string("IDEM\x01\x00\x00\x00"
                               "a\0b\xff",
                               12));
  std::optional<CommandResult> back = decode_payload(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->output, r.output);
  EXPECT_FALSE(back->status_only);
  EXPECT_EQ(back->exit_status, 0);
}

TEST(Payload, StatusOnlyCarriesNoOutput) {
  CommandResult r;
  r.status_only = true;
  r.output = "ignored";
  std::string bytes = encode_payload(r);
  EXPECT_EQ(bytes, std::string("IDEM\x01\x01\x00\x00", 8));
  std::optional<CommandResult> back = decode_payload(bytes);
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->status_only);
  EXPECT_TRUE(back->output.empty());
}

TEST(Payload, RejectsWhatIdemRunDidNotWrite) {
  std::string why;
  EXPECT_EQ(decode_payload("", &why), std::nullopt);
  EXPECT_EQ(decode_payload("plain library result", &why), std::nullopt);
  EXPECT_THAT(why, HasSubstr("not written by"));
  EXPECT_EQ(decode_payload(std::string("IDEM\x02\x00\x00\x00", 8), &why), std::nullopt);
  EXPECT_THAT(why, HasSubstr("version 2"));
  EXPECT_EQ(decode_payload(std::string("IDEM\x01\x04\x00\x00", 8), &why), std::nullopt);
  EXPECT_EQ(decode_payload(std::string("IDEM\x01\x01\x00\x00x", 9), &why), std::nullopt);
}

// --- times ---

TEST(Times, Iso8601IsUtcWithMilliseconds) {
  EXPECT_EQ(iso8601(Timestamp{Duration{0}}), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(iso8601(Timestamp{Duration{1'700'000'000'123}}), "2023-11-14T22:13:20.123Z");
  EXPECT_EQ(iso8601(Timestamp{Duration{951'782'400'000}}), "2000-02-29T00:00:00.000Z");
}

TEST(Times, HumanDurations) {
  EXPECT_EQ(human_duration(Duration{850}), "850 ms");
  EXPECT_EQ(human_duration(Duration{12'500}), "12.5 s");
  EXPECT_EQ(human_duration(Duration{200'000}), "3 min 20 s");
  EXPECT_EQ(human_duration(Duration{7'500'000}), "2 h 5 min");
  EXPECT_EQ(human_duration(Duration{3 * 86'400'000LL}), "3 d 0 h");
}

TEST(Times, ExtremeCountsAreShownWithoutOverflow) {
  // Found by fuzz/fuzz_duration (docs/RELIABILITY.md): negating the most negative count
  // was undefined behaviour, and a store can report any count.
  constexpr auto kMin = std::numeric_limits<std::int64_t>::min();
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(human_duration(Duration{-1500}), "-1.5 s");
  EXPECT_EQ(human_duration(Duration{kMin}), "-" + human_duration(Duration{kMax}));
  EXPECT_EQ(iso8601(Timestamp{Duration{-1}}), "1969-12-31T23:59:59.999Z");
  EXPECT_THAT(iso8601(Timestamp{Duration{kMin}}), ::testing::EndsWith(".192Z"));
  EXPECT_THAT(iso8601(Timestamp{Duration{kMax}}), ::testing::EndsWith(".807Z"));
}

// --- where the store lives ---

TEST(StoreLocation, XdgStateHomeFirstThenHome) {
  {
    ScopedEnv xdg("XDG_STATE_HOME", "/x/state");
    ScopedEnv home("HOME", "/h");
    EXPECT_EQ(default_store_path(), "/x/state/idem/idem.db");
  }
  {
    // XDG Base Directory: a relative path is ignored.
    ScopedEnv xdg("XDG_STATE_HOME", "relative/state");
    ScopedEnv home("HOME", "/h");
    EXPECT_EQ(default_store_path(), "/h/.local/state/idem/idem.db");
  }
  {
    ScopedEnv xdg("XDG_STATE_HOME", std::nullopt);
    ScopedEnv home("HOME", "/h");
    EXPECT_EQ(default_store_path(), "/h/.local/state/idem/idem.db");
  }
}

TEST(StoreLocation, SqliteUrlSurvivesAwkwardPaths) {
  std::string path = "/tmp/a dir/50%?#x/é.db";
  std::string url = sqlite_store_url(path);
  EXPECT_EQ(url.find(' '), std::string::npos);
  Url parsed = parse_url(url);
  EXPECT_EQ(parsed.scheme, "sqlite");
  EXPECT_EQ(parsed.path, path);
}

TEST(StoreLocation, FlagThenEnvironmentThenDefault) {
  std::filesystem::path dir = make_temp_dir();
  ScopedEnv xdg("XDG_STATE_HOME", (dir / "state").string());
  {
    ScopedEnv store("IDEM_STORE", "memory:");
    EXPECT_EQ(store_url("sqlite:///flag.db"), "sqlite:///flag.db");
    EXPECT_EQ(store_url(""), "memory:");
  }
  ScopedEnv store("IDEM_STORE", std::nullopt);
  EXPECT_EQ(store_url(""), "sqlite://" + (dir / "state/idem/idem.db").string());
  std::filesystem::remove_all(dir);
}

TEST(StoreLocation, OnlyACommandThatCreatesTheStoreCreatesTheDefaultDirectory) {
  std::filesystem::path dir = make_temp_dir();
  ScopedEnv xdg("XDG_STATE_HOME", (dir / "state").string());
  ScopedEnv store("IDEM_STORE", std::nullopt);
  // The default store does not exist yet: a reader or an operator's command finds no store
  // (no records) and creates nothing.
  EXPECT_EQ(open_cli_store("", StoreAccess::kReadOnly), nullptr);
  EXPECT_EQ(open_cli_store("", StoreAccess::kExisting), nullptr);
  EXPECT_FALSE(std::filesystem::exists(dir / "state"));
  EXPECT_NE(open_cli_store("", StoreAccess::kCreate), nullptr);
  struct stat st {};
  ASSERT_EQ(::stat((dir / "state/idem").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_TRUE(std::filesystem::exists(dir / "state/idem/idem.db"));
  EXPECT_NE(open_cli_store("", StoreAccess::kReadOnly), nullptr);
  std::filesystem::remove_all(dir);
}

TEST(StoreLocation, ANamedStoreThatIsMissingIsRefusedUnlessCreated) {
  std::filesystem::path dir = make_temp_dir();
  const std::string url = "sqlite://" + (dir / "typo.db").string();
  for (StoreAccess access : {StoreAccess::kReadOnly, StoreAccess::kExisting}) {
    try {
      (void)open_cli_store(url, access, "pass --create to create it");
      ADD_FAILURE() << "no exception";
    } catch (const NoStore& e) {
      EXPECT_THAT(e.what(), HasSubstr((dir / "typo.db").string()));
      EXPECT_THAT(e.what(), HasSubstr("does not exist"));
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "typo.db"));
  EXPECT_NE(open_cli_store(url, StoreAccess::kCreate), nullptr);
  EXPECT_NE(open_cli_store(url, StoreAccess::kReadOnly), nullptr);
  std::filesystem::remove_all(dir);
}

// --- JSON of a record ---

TEST(RecordJson, AbsentInProgressAndComplete) {
  nlohmann::ordered_json absent = record_json("memory:", "s", "k", std::nullopt);
  EXPECT_EQ(absent["state"], "ABSENT");

  Record in_progress;
  in_progress.state = RecordState::kInProgress;
  in_progress.token = 7;
  in_progress.attempt = 2;
  in_progress.now = Timestamp{Duration{10'000}};
  in_progress.acquired_at = Timestamp{Duration{9'000}};
  in_progress.lease_expires_at = Timestamp{Duration{12'500}};
  in_progress.expires_at = Timestamp{Duration{99'000}};
  nlohmann::ordered_json j = record_json("memory:", "s", "k", in_progress);
  EXPECT_EQ(j["state"], "IN_PROGRESS");
  EXPECT_EQ(j["token"], 7);
  EXPECT_EQ(j["attempt"], 2);
  EXPECT_EQ(j["lease_remaining_ms"], 2'500);
  EXPECT_EQ(j["lease_expired"], false);
  EXPECT_EQ(j["lease_expires_at"], "1970-01-01T00:00:12.500Z");
  EXPECT_EQ(j["lease_expires_at_ms"], 12'500);

  Record complete;
  complete.state = RecordState::kComplete;
  complete.token = 8;
  complete.now = Timestamp{Duration{10'000}};
  complete.completed_at = Timestamp{Duration{5'000}};
  complete.expires_at = Timestamp{Duration{10'000}};
  complete.payload = "written by a library caller";
  complete.fingerprint = "fp";
  j = record_json("memory:", "s", "k", complete);
  EXPECT_EQ(j["state"], "COMPLETE");
  EXPECT_EQ(j["expired"], true);  // SPEC §4: expires_at <= now is expired
  EXPECT_EQ(j["format"], nullptr);
  EXPECT_EQ(j["fingerprint"], "fp");
  EXPECT_EQ(j["payload_bytes"], complete.payload.size());
}

TEST(Printable, ShowsValidUtf8AsItIs) {
  EXPECT_EQ(printable("plain key"), "plain key");
  EXPECT_EQ(printable("ключ"), "ключ");
  EXPECT_EQ(printable("日本語 and 😀"), "日本語 and 😀");
}

TEST(Printable, EscapesControlsBackslashesAndInvalidBytes) {
  EXPECT_EQ(printable("a\\b"), "a\\\\b");
  EXPECT_EQ(printable("\x1b[31mred"), "\\x1b[31mred");
  EXPECT_EQ(printable(std::string("nul\0", 4)), "nul\\x00");
  EXPECT_EQ(printable("del\x7f"), "del\\x7f");
  // C1 controls are valid UTF-8 but steer terminals.
  EXPECT_EQ(printable("\xc2\x9b"), "\\xc2\\x9b");
  // Invalid UTF-8: a lone continuation byte, a truncated sequence, an overlong form, a
  // surrogate, a code point above U+10FFFF.
  EXPECT_EQ(printable("\x80"), "\\x80");
  EXPECT_EQ(printable("\xd0"), "\\xd0");
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");
  EXPECT_EQ(printable("k\xff\xd0\xba"), "k\\xffк");
}

TEST(RecordJson, BinaryKeysDumpWithoutThrowing) {
  std::string key("k\xff\xfe\0", 4);
  std::string text = dump_json(record_json("memory:", "s", key, std::nullopt));
  EXPECT_THAT(text, HasSubstr("\"state\": \"ABSENT\""));
}

// --- the child runner ---

class ChildTest : public ::testing::Test {
 protected:
  ChildOutcome run(const std::string& script, std::size_t capture_limit = 1 << 20,
                   std::stop_token stop = {}, Duration grace = 10s) {
    ChildOptions options;
    options.argv = {"sh", "-c", script};
    options.env = {{"IDEM_TEST_VAR", "value"}};
    options.pass_through_fd = -1;
    options.capture_limit = capture_limit;
    options.grace = grace;
    options.stop = stop;
    return run_child(options, signals_);
  }
  SignalRelay signals_;
};

TEST_F(ChildTest, CapturesOutputAndExitStatus) {
  ChildOutcome o = run("printf 'out\\000put'; echo err >&2; exit 3");
  EXPECT_EQ(o.exit_code, 3);
  EXPECT_EQ(o.term_signal, 0);
  EXPECT_EQ(o.status(), 3);
  EXPECT_EQ(o.output, std::string("out\0put", 7));
  EXPECT_EQ(o.output_bytes, 7u);
}

TEST_F(ChildTest, PassesOutputThroughAsItArrives) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ChildOptions options;
  options.argv = {"printf", "through"};
  options.pass_through_fd = fds[1];
  options.capture_limit = 100;
  ChildOutcome o = run_child(options, signals_);
  ::close(fds[1]);
  char buffer[64] = {};
  ssize_t n = ::read(fds[0], buffer, sizeof buffer);
  ::close(fds[0]);
  EXPECT_EQ(std::string(buffer, static_cast<std::size_t>(n)), "through");
  EXPECT_EQ(o.output, "through");
}

TEST_F(ChildTest, CaptureStopsAtTheLimitButCountsEverything) {
  ChildOutcome o = run("head -c 300000 /dev/zero", 1000);
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_EQ(o.output.size(), 1000u);
  EXPECT_EQ(o.output_bytes, 300000u);
}

TEST_F(ChildTest, SeesTheEnvironmentItIsGiven) {
  ScopedEnv inherited("IDEM_TEST_INHERITED", "yes");
  ScopedEnv replaced("IDEM_TEST_VAR", "old");
  ChildOutcome o = run("echo \"$IDEM_TEST_VAR $IDEM_TEST_INHERITED\"");
  EXPECT_EQ(o.output, "value yes\n");
}

TEST_F(ChildTest, DeathBySignalReports128PlusSignal) {
  ChildOutcome o = run("kill -TERM $$");
  EXPECT_EQ(o.term_signal, SIGTERM);
  EXPECT_EQ(o.status(), 128 + SIGTERM);
}

TEST_F(ChildTest, MissingCommandIsASpawnErrorWithStatus127) {
  ChildOptions options;
  options.argv = {"/nonexistent/idem-test-command"};
  try {
    (void)run_child(options, signals_);
    FAIL() << "no exception";
  } catch (const SpawnError& e) {
    EXPECT_EQ(e.status(), 127);
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/idem-test-command"));
  }
}

TEST_F(ChildTest, StopRequestTerminatesTheChild) {
  std::stop_source stop;
  std::filesystem::path dir = make_temp_dir();
  std::string started = (dir / "started").string();
  std::jthread requester([&] {
    while (!std::filesystem::exists(started)) std::this_thread::sleep_for(5ms);
    stop.request_stop();
  });
  ChildOutcome o =
      run("touch " + started + "; while :; do sleep 0.01; done", 100, stop.get_token());
  EXPECT_EQ(o.stopped, StopReason::kLeaseLost);
  EXPECT_EQ(o.term_signal, SIGTERM);
  std::filesystem::remove_all(dir);
}

TEST_F(ChildTest, StopRequestKillsAChildThatIgnoresSigterm) {
  std::stop_source stop;
  std::filesystem::path dir = make_temp_dir();
  std::string started = (dir / "started").string();
  std::jthread requester([&] {
    while (!std::filesystem::exists(started)) std::this_thread::sleep_for(5ms);
    stop.request_stop();
  });
  ChildOutcome o = run("trap '' TERM; touch " + started + "; while :; do sleep 0.01; done", 100,
                       stop.get_token(), 100ms);
  EXPECT_EQ(o.stopped, StopReason::kLeaseLost);
  EXPECT_EQ(o.term_signal, SIGKILL);
  std::filesystem::remove_all(dir);
}

TEST_F(ChildTest, SignalsToIdemArePassedToTheChild) {
  signals_.hold();
  std::filesystem::path dir = make_temp_dir();
  std::string started = (dir / "started").string();
  std::jthread sender([&] {
    while (!std::filesystem::exists(started)) std::this_thread::sleep_for(5ms);
    ::kill(::getpid(), SIGTERM);
  });
  ChildOutcome o =
      run("trap 'echo got TERM; exit 5' TERM; touch " + started + "; while :; do sleep 0.01; done");
  EXPECT_EQ(o.interrupted_by, SIGTERM);
  EXPECT_EQ(o.exit_code, 5);
  EXPECT_EQ(o.output, "got TERM\n");
  std::filesystem::remove_all(dir);
}

TEST_F(ChildTest, DoesNotWaitForProcessesTheChildLeftBehind) {
  // The background process keeps the output pipe open long after the child exited; the
  // child's own output is complete when it exits.
  ChildOutcome o = run("echo mine; (sleep 1; echo late) 2>/dev/null &");
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_EQ(o.output, "mine\n");
}

bool process_running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const std::size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

TEST_F(ChildTest, WhatTheCommandLeftInItsGroupIsKilledWhenItExits) {
  std::filesystem::path dir = make_temp_dir();
  const std::string pid_file = (dir / "pid").string();
  ChildOutcome o = run("sleep 30 & echo $! > " + pid_file + "; echo mine");
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_EQ(o.output, "mine\n");
  std::ifstream in(pid_file);
  pid_t left = 0;
  ASSERT_TRUE(in >> left);
  // run_child returns only once nothing of the group runs any more.
  EXPECT_FALSE(process_running(left));
  std::filesystem::remove_all(dir);
}

TEST_F(ChildTest, ALeaseRunningOutTerminatesTheGroupByItsDeadline) {
  // Once the command ignores SIGTERM, the deadline comes near: SIGTERM first, then SIGKILL
  // when the deadline is reached.
  std::filesystem::path dir = make_temp_dir();
  const std::string ready = (dir / "ready").string();
  ChildOptions options;
  options.argv = {"sh", "-c", "trap '' TERM; touch " + ready + "; while :; do sleep 0.01; done"};
  options.pass_through_fd = -1;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  options.dead_by = [&] {
    if (!deadline && std::filesystem::exists(ready)) {
      deadline = std::chrono::steady_clock::now() + 200ms;
    }
    return deadline.value_or(std::chrono::steady_clock::now() + 1h);
  };
  options.deadline_grace = 100ms;
  ChildOutcome o = run_child(options, signals_);
  EXPECT_EQ(o.stopped, StopReason::kLeaseRunningOut);
  EXPECT_EQ(o.term_signal, SIGKILL);
  std::filesystem::remove_all(dir);
}

TEST_F(ChildTest, OutputThatCannotBePassedOnEndsTheCommandAsItWouldWithoutIdem) {
  // As in idem (main.cpp): a reader that goes away is EPIPE for idem, SIGPIPE for the
  // command (which gets the default back).
  struct IgnoreSigpipe {
    void (*previous)(int) = ::signal(SIGPIPE, SIG_IGN);
    ~IgnoreSigpipe() { ::signal(SIGPIPE, previous); }
  } ignore_sigpipe;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);  // the reader went away
  ChildOptions options;
  options.argv = {"yes"};
  options.pass_through_fd = fds[1];
  options.capture_limit = 100;
  ChildOutcome o = run_child(options, signals_);
  ::close(fds[1]);
  EXPECT_EQ(o.output_error, EPIPE);
  EXPECT_EQ(o.term_signal, SIGPIPE);
}

TEST_F(ChildTest, AFileWithoutAShebangLineRunsWithSh) {
  std::filesystem::path dir = make_temp_dir();
  const std::filesystem::path script = dir / "script";
  std::ofstream(script) << "echo \"args: $*\"\n";
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  ChildOptions options;
  options.argv = {script.string(), "one", "two"};
  options.pass_through_fd = -1;
  options.capture_limit = 100;
  ChildOutcome o = run_child(options, signals_);
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_EQ(o.output, "args: one two\n");
  std::filesystem::remove_all(dir);
}

TEST(SpawnErrors, StatusesAreAShellsAndOutOfProcessesIsRetryLater) {
  EXPECT_EQ(SpawnError("x", ENOENT).status(), 127);
  EXPECT_EQ(SpawnError("x", EACCES).status(), 126);
  EXPECT_EQ(SpawnError("x", EAGAIN).status(), 71);
  EXPECT_EQ(SpawnError("x", ENOMEM).status(), 71);
  EXPECT_THAT(SpawnError("x", EAGAIN).what(), HasSubstr("try again later"));
}

}  // namespace
}  // namespace idem::cli
