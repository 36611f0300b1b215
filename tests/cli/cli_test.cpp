// End-to-end tests of the `idem` tool: each test runs the built binary as a user's shell
// would, with HOME and XDG_STATE_HOME pointed at a temporary directory. Tests that need a
// store shared between processes are parameterised on a list of store URLs: SQLite always,
// plus PostgreSQL and Redis when IDEM_TEST_POSTGRES_URL / IDEM_TEST_REDIS_URL are set. Every
// such test works in a scope of its own, so a shared server needs no cleaning between tests.
//
// No assertion depends on timing: tests wait for conditions (a file appearing, a process
// ending) with generous bounds, and commands that must stay in progress wait on a gate file.
//
// This file: arguments, the default store and the in-process store. Per store:
// cli_store_test.cpp.

#include "cli_test.h"

namespace idem::cli::test {
namespace {

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
  EXPECT_THAT(r.err, AllOf(HasSubstr("idem: a command is required"), HasSubstr("run, show")));
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
  EXPECT_EQ(idem({"bench", "--store", "memory:", "--ops", "ten"}).status, 64);
  EXPECT_EQ(idem({"bench", "--store", "memory:", "--mode", "sideways"}).status, 64);
  EXPECT_EQ(idem({"bench", "--store", "memory:", "--ops", "0"}).status, 64);
}

// Issue 12 items 10 to 16: processes, durations, stores that must not be created, bench,
// messages.

TEST_F(CliTest, OutOfProcessesExits71) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root to run as a user of its own, whose process count is known";
  }
  // One process of its own (idem, after exec) and one thread: nothing more may start.
  EnvChanges env = env_;
  env["ASAN_OPTIONS"] = "detect_leaks=0";  // LeakSanitizer starts a thread at exit
  const std::string uid = std::to_string(kUnprivilegedUid + 1);
  ProcessResult r = run_process(
      {"/usr/bin/setpriv", "--reuid=" + uid, "--regid=" + uid, "--clear-groups", "/bin/bash", "-c",
       "ulimit -u 2 && exec \"$IDEM\" run --store memory: --key k -- sh -c 'echo must not run'"},
      env);
  EXPECT_EQ(r.status, 71) << r.err;
  EXPECT_THAT(r.err, AllOf(HasSubstr("Resource temporarily unavailable"), HasSubstr("try again")));
  EXPECT_THAT(r.out, IsEmpty());
}

TEST_F(CliTest, AnExecutableWithoutAShebangLineRunsWithSh) {
  // As execvp does (and a shell): a script without "#!" is run by /bin/sh.
  const fs::path script = dir_.path() / "bin" / "no-shebang";
  fs::create_directories(script.parent_path());
  std::ofstream(script) << "echo \"from sh: $1 $2\"\n";
  fs::permissions(script, fs::perms::owner_all);
  ProcessResult direct =
      idem({"run", "--store", "memory:", "--key", "k", "--", script.string(), "a", "b c"});
  EXPECT_EQ(direct.status, 0) << direct.err;
  EXPECT_EQ(direct.out, "from sh: a b c\n");
  env_["PATH"] = script.parent_path().string() + ":" + std::getenv("PATH");
  ProcessResult found = idem({"run", "--store", "memory:", "--key", "k", "--", "no-shebang", "x"});
  EXPECT_EQ(found.status, 0) << found.err;
  EXPECT_EQ(found.out, "from sh: x \n");
}

TEST_F(CliTest, ABareZeroAndDecimalDurationsAreAccepted) {
  ProcessResult r = idem({"run", "--store", "memory:", "--key", "k", "--wait", "0", "--ttl", "1.5s",
                          "--lease", "2.5s", "--grace", "0.5s", "--", "echo", "ok"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "ok\n");
  for (std::string bad : {"0", "1.5ms", "30"}) {
    ProcessResult refused =
        idem({"run", "--store", "memory:", "--key", "k", "--ttl", bad, "--", "true"});
    EXPECT_EQ(refused.status, 64) << bad;
    EXPECT_THAT(refused.err, HasSubstr("idem run: --ttl")) << bad;
  }
}

TEST_F(CliTest, ShowForgetAndPurgeNeverCreateAStore) {
  const std::string missing = "sqlite://" + (dir_ / "typo.db");
  ProcessResult show = idem({"show", "--store", missing, "--key", "k"});
  EXPECT_EQ(show.status, 66);
  EXPECT_THAT(show.err,
              AllOf(HasSubstr("idem show:"), HasSubstr("typo.db"), HasSubstr("does not exist")));
  for (std::string command : {"forget", "purge"}) {
    std::vector<std::string> args = {command, "--store", missing};
    if (command == "forget") args.insert(args.end(), {"--key", "k"});
    ProcessResult r = idem(args);
    EXPECT_EQ(r.status, 66) << command;
    EXPECT_THAT(r.err, AllOf(HasSubstr("does not exist"), HasSubstr("--create"))) << command;
  }
  EXPECT_FALSE(exists("typo.db"));
  // The default store that was never used yet has no records; it is not created either.
  ProcessResult default_show = idem({"show", "--key", "k"});
  EXPECT_EQ(default_show.status, 1);
  EXPECT_EQ(Json::parse(default_show.out)["state"], "ABSENT");
  EXPECT_EQ(idem({"forget", "--key", "k"}).status, 1);
  ProcessResult purge = idem({"purge"});
  EXPECT_EQ(purge.status, 0) << purge.err;
  EXPECT_THAT(purge.out, HasSubstr("purged 0"));
  EXPECT_FALSE(exists("state"));
  // Asked to, they create it.
  EXPECT_EQ(idem({"purge", "--store", missing, "--create"}).status, 0);
  EXPECT_TRUE(exists("typo.db"));
  EXPECT_EQ(idem({"forget", "--store", missing, "--key", "k"}).status, 1);
}

TEST_F(CliTest, BenchUsesTheStoreEveryCommandUses) {
  env_["IDEM_STORE"] = "sqlite://" + (dir_ / "bench.db");
  ProcessResult r = idem({"bench", "--ops", "50", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Json::parse(r.out)["store"], "sqlite://" + (dir_ / "bench.db"));
  ProcessResult help = idem({"bench", "--help"});
  EXPECT_THAT(help.out, Not(HasSubstr("REQUIRED")));
}

TEST_F(CliTest, ArgumentErrorsNameTheCommandAndTheArgument) {
  ProcessResult unknown = idem({"frob"});
  EXPECT_EQ(unknown.status, 64);
  EXPECT_THAT(unknown.err, AllOf(HasSubstr("unknown command 'frob'"), HasSubstr("run, show")));
  ProcessResult extra = idem({"purge", "--store", "memory:", "--key", "x"});
  EXPECT_EQ(extra.status, 64);
  EXPECT_THAT(extra.err, HasSubstr("idem purge: unexpected arguments '--key' 'x'"));
  ProcessResult zero = idem({"purge", "--store", "memory:", "--limit", "0"});
  EXPECT_EQ(zero.status, 64);
  EXPECT_THAT(zero.err, HasSubstr("idem purge: --limit: must be 1 or more"));
  EXPECT_LT(zero.err.size(), 200u);
  ProcessResult required = idem({"show", "--store", "memory:"});
  EXPECT_EQ(required.status, 64);
  EXPECT_THAT(required.err, HasSubstr("idem show: --key is required"));
  ProcessResult conversion = idem({"bench", "--store", "memory:", "--ops", "ten"});
  EXPECT_THAT(conversion.err, HasSubstr("idem bench: "));
}

TEST_F(CliTest, Utf8KeysArePrintedAsTheyAre) {
  ProcessResult r = idem(
      {"run", "-v", "--store", "memory:", "--scope", "заказы", "--key", "ключ-1", "--", "true"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("key \"ключ-1\" in scope \"заказы\""));
  ProcessResult binary =
      idem({"run", "-v", "--store", "memory:", "--key", "k\xff\x1b[1m", "--", "true"});
  EXPECT_THAT(binary.err, HasSubstr("key \"k\\xff\\x1b[1m\""));
}

TEST_F(CliTest, TheCommandCanReadTheTerminal) {
  // The command runs in a process group of its own; when it reads the terminal, idem hands
  // the terminal over as a shell hands it to a foreground job. `script` gives the run a
  // terminal.
  if (::access("/usr/bin/script", X_OK) != 0) GTEST_SKIP() << "util-linux's script is missing";
  ProcessResult r =
      sh("printf 'hello\\n' | script -qec " +
             quote("\"$IDEM\" run --store memory: --key k -- sh -c 'read x; echo got:$x'") +
             " /dev/null",
         30s);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("got:hello"));
}

}  // namespace
}  // namespace idem::cli::test
