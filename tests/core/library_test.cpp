// The library's version, and opening the default store as the `idem` tool does.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "idem/open_store.h"
#include "idem/version.h"

namespace {

TEST(Version, TheLibraryMatchesItsHeaders) {
  EXPECT_STREQ(idem::version(), IDEM_VERSION_STRING);
  EXPECT_EQ(std::to_string(IDEM_VERSION_MAJOR) + "." + std::to_string(IDEM_VERSION_MINOR) + "." +
                std::to_string(IDEM_VERSION_PATCH),
            IDEM_VERSION_STRING);
  static_assert(IDEM_VERSION ==
                IDEM_VERSION_MAJOR * 10000 + IDEM_VERSION_MINOR * 100 + IDEM_VERSION_PATCH);
}

// Sets environment variables for one test and puts them back after it.
class ScopedEnv {
 public:
  ~ScopedEnv() {
    for (auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  void set(const std::string& name, const char* value) {
    const char* old = std::getenv(name.c_str());
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (value) {
      ::setenv(name.c_str(), value, 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(DefaultStore, IdemStoreNamesIt) {
  ScopedEnv env;
  env.set("IDEM_STORE", "memory:");
  EXPECT_EQ(idem::default_store_url(), "memory:");
  EXPECT_EQ(idem::open_default_store()->describe(), "memory:");
}

TEST(DefaultStore, WithoutIdemStoreItIsAnSqliteFileInTheStateDirectory) {
  const std::filesystem::path state =
      std::filesystem::temp_directory_path() / ("idem-state-" + std::to_string(::getpid()));
  std::filesystem::remove_all(state);
  ScopedEnv env;
  env.set("IDEM_STORE", nullptr);
  env.set("XDG_STATE_HOME", state.c_str());
  EXPECT_EQ(idem::default_store_url(), "sqlite://" + (state / "idem/idem.db").string());
  auto store = idem::open_default_store();
  EXPECT_TRUE(std::filesystem::exists(state / "idem/idem.db"));
  // A relative XDG_STATE_HOME is ignored (XDG Base Directory), HOME is used instead.
  env.set("XDG_STATE_HOME", "relative/dir");
  env.set("HOME", state.c_str());
  EXPECT_EQ(idem::default_store_url(),
            "sqlite://" + (state / ".local/state/idem/idem.db").string());
  store.reset();
  std::filesystem::remove_all(state);
}

}  // namespace
