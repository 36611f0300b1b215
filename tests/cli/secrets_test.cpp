// Secrets (issue 9): a password in a store URL never appears in an error message, in a
// store's describe(), in what the `idem` tool prints (show's output, any command's standard
// error) or in the proxy's log. The test puts an unmistakable password into every URL form
// that can carry one and greps everything the library and the tool say about them.
//
// Without servers, refused ports and malformed URLs reach every error path that parses or
// connects. With the test servers (IDEM_TEST_POSTGRES_URL, IDEM_TEST_REDIS_URL; required
// under IDEM_REQUIRE_SERVERS=1) the password also goes to a live server: PostgreSQL's test
// server trusts loopback, so the store opens and show's output names it; the Redis test
// server has no password, so AUTH with a password alone fails with the server's own error,
// while AUTH as the default user (nopass) opens.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "idem/error.h"
#include "idem/executor.h"
#include "idem/open_store.h"
#include "idem/store.h"
#include "process.h"
#include "support/server_stores.h"

#ifndef IDEM_BINARY
#error "IDEM_BINARY is set by tests/cli/CMakeLists.txt"
#endif

namespace idem::cli::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Unmistakable, and with a character that URLs percent-encode.
constexpr const char* kSecret = "Pw5ecret!Zq";
constexpr const char* kSecretEncoded = "Pw5ecret%21Zq";

// Every form the password could leak in: as decoded, as written in the URL, and the part
// before the encoded character (a message that cut the URL there).
const std::vector<std::string>& secret_forms() {
  static const std::vector<std::string> forms = {kSecret, kSecretEncoded, "Pw5ecret"};
  return forms;
}

::testing::AssertionResult no_secret(const std::string& text, const std::string& where) {
  for (const std::string& form : secret_forms()) {
    if (text.find(form) != std::string::npos) {
      return ::testing::AssertionFailure() << where << " shows the password (" << form << "):\n"
                                           << text;
    }
  }
  return ::testing::AssertionSuccess();
}

// URLs that carry the password and fail: refused ports (nothing listens on port 1), bad
// ports and databases, unknown parameters, malformed text. Each is a password in the
// authority or in a query parameter.
std::vector<std::string> failing_urls() {
  const std::string s = kSecretEncoded;
  return {
      "postgresql://user:" + s + "@127.0.0.1:1/db?connect_timeout=2",
      "postgresql://user@127.0.0.1:1/db?password=" + s + "&connect_timeout=2",
      "postgresql://user:" + s + "@127.0.0.1:notaport/db",
      "postgresql://user:" + s + "@127.0.0.1:1/db?no_such_option=1",
      "postgresql://user:" + s + "@[::1/db",
      "postgresql://user:" + s + "@127.0.0.1:99999/db",
      "redis://:" + s + "@127.0.0.1:1/0",
      "redis://user:" + s + "@127.0.0.1:1/0",
      "redis://:" + s + "@127.0.0.1:1/notadb",
      "redis://127.0.0.1:1/0?password=" + s,
      "redis://:" + s + "@127.0.0.1:1/0?no_such_option=1",
      "frob://user:" + s + "@127.0.0.1/x",
      "user:" + s + "@127.0.0.1/x",
      "redis//:" + s + "@127.0.0.1/0",
      "redis:user:" + s + "@127.0.0.1/0",
      "postgresql:/user:" + s + "@127.0.0.1/db",
      "postgresql://user:" + s + "@127.0.0.1:1/db%zz",
      "postgresql://user:" + s + "%@127.0.0.1:1/db",
  };
}

// The test servers' URLs with the password added, and the forms that fail there.
struct ServerUrls {
  std::vector<std::string> opening;  // the store opens
  std::vector<std::string> failing;  // the server refuses
};

ServerUrls server_urls() {
  ServerUrls out;
  for (const auto& [name, url] : idem::testing::server_store_urls()) {
    const Url u = parse_url(url);
    const std::string authority = u.host + ":" + std::to_string(u.port);
    if (name == "postgres") {
      // Trust authentication: the password is sent and ignored, the store opens.
      out.opening.push_back("postgresql://" + u.user + ":" + kSecretEncoded + "@" + authority +
                            u.path);
      out.failing.push_back("postgresql://" + u.user + ":" + kSecretEncoded + "@" + authority +
                            "/no_such_database_xyz");
    } else if (name == "redis") {
      // No password is configured: AUTH with a password alone is refused, while the
      // default user (nopass) accepts any password, so that form opens.
      out.failing.push_back("redis://:" + std::string(kSecretEncoded) + "@" + authority + u.path);
      out.opening.push_back("redis://default:" + std::string(kSecretEncoded) + "@" + authority +
                            u.path);
    }
  }
  return out;
}

// What the library says about a URL that does not open.
void expect_open_error_clean(const std::string& url) {
  SCOPED_TRACE(url);
  try {
    auto store = open_store(url);
    ADD_FAILURE() << "opened: " << store->describe();
  } catch (const StoreUnavailable& e) {
    EXPECT_TRUE(no_secret(e.what(), "StoreUnavailable::what()"));
    EXPECT_TRUE(no_secret(e.store(), "StoreUnavailable::store()"));
    EXPECT_TRUE(no_secret(e.reason(), "StoreUnavailable::reason()"));
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(no_secret(e.what(), "InvalidArgument::what()"));
    EXPECT_TRUE(no_secret(e.argument(), "InvalidArgument::argument()"));
  } catch (const std::exception& e) {
    EXPECT_TRUE(no_secret(e.what(), "an exception's what()"));
    ADD_FAILURE() << "not an idem::Error: " << e.what();
  }
}

class SecretsTest : public ::testing::Test {
 protected:
  SecretsTest() {
    char pattern[] = "/tmp/idem-secrets.XXXXXX";
    const char* made = mkdtemp(pattern);
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = made;
  }
  ~SecretsTest() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Runs the tool with HOME in the test's directory and no IDEM_STORE unless given.
  ProcessResult idem(std::vector<std::string> args, const EnvChanges& extra = {}) {
    args.insert(args.begin(), IDEM_BINARY);
    EnvChanges env = {
        {"HOME", dir_.string()}, {"XDG_STATE_HOME", std::nullopt}, {"IDEM_STORE", std::nullopt}};
    for (const auto& [k, v] : extra) env[k] = v;
    return run_process(args, env, std::chrono::seconds(120));
  }

  // The commands that open a store read-only (show) and to write (run); with `every`, also
  // forget, purge, show with the URL in IDEM_STORE, and the proxy. Every command opens its
  // store through the same code, so the full set runs for a few URLs only (each process
  // costs about half a second under the sanitizers). Returns how many outputs were checked.
  int expect_tool_clean(const std::string& url, bool opens, bool every = true) {
    SCOPED_TRACE(url);
    std::vector<std::vector<std::string>> commands = {
        {"show", "--scope", "secrets", "--key", key_, "--store", url},
        {"run", "--scope", "secrets", "--key", key_, "--store", url, "--", "sh", "-c", "echo ran"},
    };
    if (every) {
      commands.push_back({"forget", "--scope", "secrets", "--key", key_, "--store", url});
      commands.push_back({"purge", "--store", url});
    }
    int checked = 0;
    for (const auto& args : commands) {
      const ProcessResult r = idem(args);
      EXPECT_TRUE(no_secret(r.out, "idem " + args[0] + " standard output"));
      EXPECT_TRUE(no_secret(r.err, "idem " + args[0] + " standard error"));
      if (!opens) {
        EXPECT_NE(r.status, 0) << "idem " << args[0] << " succeeded";
        EXPECT_FALSE(r.err.empty()) << "idem " << args[0] << " failed without a word";
      }
      ++checked;
    }
    if (!every) return checked;
    const ProcessResult env_show =
        idem({"show", "--scope", "secrets", "--key", key_}, {{"IDEM_STORE", url}});
    EXPECT_TRUE(no_secret(env_show.out + env_show.err, "IDEM_STORE=... idem show"));
    ++checked;
    if (!opens) {
      // The proxy's log is its standard error; it opens the store before it listens.
      const ProcessResult proxy = idem(
          {"proxy", "--store", url, "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9"});
      EXPECT_NE(proxy.status, 0);
      EXPECT_TRUE(no_secret(proxy.out + proxy.err, "idem proxy log"));
      ++checked;
    }
    return checked;
  }

  fs::path dir_;
  // A key of this process alone, on a server shared with other tests.
  const std::string key_ = "k" + std::to_string(::getpid());
};

TEST(SecretsSelfTest, TheGrepFindsThePassword) {
  // The check itself must be able to fail, in every form it looks for.
  for (const std::string& form : secret_forms()) {
    EXPECT_FALSE(no_secret("x" + form + "y", "test"));
  }
  EXPECT_TRUE(no_secret("postgresql://user:***@127.0.0.1:1/db", "test"));
}

TEST(SecretsLibraryTest, ParsedUrlRedactsThePasswordWhereverItIs) {
  for (const std::string& url : failing_urls()) {
    SCOPED_TRACE(url);
    try {
      // A URL with an authority ("scheme://user:password@host") has its password redacted;
      // the "scheme:rest" forms (sqlite:path) carry no password field to redact.
      const Url u = parse_url(url);
      if (u.has_authority) {
        EXPECT_TRUE(no_secret(u.redacted(), "Url::redacted()"));
      }
    } catch (const Error& e) {
      EXPECT_TRUE(no_secret(e.what(), "parse_url's error"));
    }
  }
}

TEST(SecretsLibraryTest, OpenErrorsNeverShowThePassword) {
  for (const std::string& url : failing_urls()) expect_open_error_clean(url);
}

TEST(SecretsLibraryTest, ServerErrorsAndDescribeNeverShowThePassword) {
  const ServerUrls urls = server_urls();
  if (urls.opening.empty() && urls.failing.empty()) {
    GTEST_SKIP() << "no test server (IDEM_TEST_POSTGRES_URL, IDEM_TEST_REDIS_URL)";
  }
  for (const std::string& url : urls.failing) expect_open_error_clean(url);
  for (const std::string& url : urls.opening) {
    SCOPED_TRACE(url);
    auto store = open_store(url);
    EXPECT_TRUE(no_secret(store->describe(), "describe()"));
    // It still names the store (the password is redacted or left out).
    EXPECT_THAT(store->describe(), ::testing::HasSubstr("127.0.0.1"));
    // An executor's errors name the store by describe(): a busy key and a lost lease.
    Executor exec(store);
    const std::string key = "k" + std::to_string(::getpid());
    auto held = exec.begin("secrets", key);
    ASSERT_NE(held.handle(), nullptr);
    try {
      (void)exec.run("secrets", key, [](const Attempt&) { return std::string("x"); });
      ADD_FAILURE() << "ran while the key was held";
    } catch (const Error& e) {
      EXPECT_TRUE(no_secret(e.what(), "InProgress"));
    }
    EXPECT_TRUE(store->forget("secrets", key));
    try {
      (void)held.handle()->complete("late");
      ADD_FAILURE() << "completed a forgotten record";
    } catch (const Error& e) {
      EXPECT_TRUE(no_secret(e.what(), "LeaseLost"));
    }
  }
}

TEST_F(SecretsTest, ToolOutputAndErrorsNeverShowThePassword) {
  int checked = 0;
  const std::vector<std::string> urls = failing_urls();
  // Every command for the first PostgreSQL and Redis forms and a mistyped one.
  const std::set<std::size_t> every = {0, 6, 13};
  for (std::size_t i = 0; i < urls.size(); ++i) {
    checked += expect_tool_clean(urls[i], false, every.count(i) != 0);
  }
  EXPECT_GT(checked, 0);
}

TEST_F(SecretsTest, ToolOnTestServersNeverShowsThePassword) {
  const ServerUrls urls = server_urls();
  if (urls.opening.empty() && urls.failing.empty()) {
    GTEST_SKIP() << "no test server (IDEM_TEST_POSTGRES_URL, IDEM_TEST_REDIS_URL)";
  }
  for (const std::string& url : urls.failing) expect_tool_clean(url, false);
  for (const std::string& url : urls.opening) {
    expect_tool_clean(url, true);
    // show's output of a record names the store, redacted.
    const std::string key = "shown" + std::to_string(::getpid());
    const ProcessResult ran =
        idem({"run", "--scope", "secrets", "--key", key, "--store", url, "--", "true"});
    EXPECT_EQ(ran.status, 0) << ran.err;
    EXPECT_TRUE(no_secret(ran.out + ran.err, "idem run"));
    const ProcessResult r = idem({"show", "--scope", "secrets", "--key", key, "--store", url});
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.out, ::testing::HasSubstr("127.0.0.1"));
    EXPECT_TRUE(no_secret(r.out + r.err, "idem show of a record"));
  }
}

}  // namespace
}  // namespace idem::cli::test
