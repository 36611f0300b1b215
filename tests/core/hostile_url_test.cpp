// Malformed and over-long store URLs for every scheme this build opens (SPEC §10;
// docs/RELIABILITY.md, "Hostile input"): open_store gives InvalidArgument or
// StoreUnavailable with a one-line message and never shows a password, never crashes, and
// a NUL byte never makes a store open something other than what the URL names. Server URLs
// point at a closed loopback port or at names no resolver is asked about, so nothing here
// needs a server.

#include <gmock/gmock.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"

namespace idem {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Opens `url`; a failure must be a clean idem error that does not show `secret`.
void expect_clean(const std::string& url, const std::string& secret = "hunter2") {
  SCOPED_TRACE(url.size() > 200
                   ? url.substr(0, 200) + "... (" + std::to_string(url.size()) + " bytes)"
                   : url);
  try {
    (void)open_store(url);
  } catch (const Error& e) {
    EXPECT_THAT(e.code(), AnyOf(ErrorCode::kInvalidArgument, ErrorCode::kStoreUnavailable))
        << e.what();
    const std::string what = e.what();
    EXPECT_THAT(what, Not(HasSubstr(secret)));
    EXPECT_THAT(what, Not(HasSubstr("\n")));
    EXPECT_FALSE(what.empty());
  }
}

std::vector<std::string> schemes() { return available_schemes(); }

TEST(HostileUrl, OverLongPartsFailCleanly) {
  const std::string huge(100'000, 'h');
  for (const std::string& scheme : schemes()) {
    SCOPED_TRACE(scheme);
    expect_clean(scheme + "://" + huge + ":1/0");                     // host
    expect_clean(scheme + ":///" + huge);                             // path
    expect_clean(scheme + "://u:hunter2" + huge + "@127.0.0.1:1/0");  // password
    expect_clean(scheme + "://" + huge + "@127.0.0.1:1/0");           // user
    expect_clean(scheme + "://127.0.0.1:1/0?" + huge + "=" + huge);   // query
    std::string many = scheme + "://127.0.0.1:1/0?timeout=1";
    for (int i = 0; i < 10'000; ++i) many += "&p" + std::to_string(i) + "=v";
    expect_clean(many);
    expect_clean(scheme + ":" + huge);
    expect_clean(scheme + "://127.0.0.1:" + std::string(1000, '9') + "/0");  // port
  }
}

TEST(HostileUrl, MalformedUrlsFailCleanly) {
  // Hosts are loopback addresses with closed ports or no port at all, so no resolver is
  // asked and nothing connects.
  const std::vector<std::string> rests = {"",
                                          "//",
                                          "///",
                                          "//:",
                                          "//@",
                                          "//[",
                                          "//[]",
                                          "//[::1",
                                          "//[::1]x",
                                          "//127.0.0.1:0",
                                          "//127.0.0.1:-1",
                                          "//127.0.0.1:65536",
                                          "//127.0.0.1:1x",
                                          "//127.0.0.1:+1",
                                          "//::1:6379",
                                          "//127.0.0.1:1/%",
                                          "//127.0.0.1:1/%4",
                                          "//127.0.0.1:1/%zz",
                                          "//127.0.0.1:1?=v",
                                          "//127.0.0.1:1?&&&",
                                          "//127.0.0.1:1#frag",
                                          "//u:p:q@127.0.0.1:1",
                                          "//%ff%fe:1",
                                          "//%0a:1",
                                          "//127.0.0.1%00.example:1",
                                          "///%00",
                                          "//127.0.0.1:1/%00",
                                          "//127.0.0.1:1/0?%00=1",
                                          "//127.0.0.1:1/0?timeout=%00"};
  for (const std::string& scheme : schemes()) {
    for (const std::string& rest : rests) expect_clean(scheme + ":" + rest);
  }
  for (const std::string& url :
       {std::string(""), std::string(":"), std::string("://"), std::string("1sqlite:x"),
        std::string("sq lite:x"), std::string("\0sqlite:x", 9), std::string("\xff:x")}) {
    expect_clean(url);
  }
}

TEST(HostileUrl, ANulByteNeverOpensAnotherFile) {
  // "sqlite:DIR/a%00b.db" names a file called "a\0b.db", which no file system can hold; a
  // store that passed the path on as a C string would open DIR/a instead.
  const std::vector<std::string> built = schemes();
  if (std::find(built.begin(), built.end(), "sqlite") == built.end()) {
    GTEST_SKIP() << "built without SQLite";
  }
  std::string dir = (std::filesystem::temp_directory_path() / "idem-url-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  for (const std::string& url : {"sqlite:" + dir + "/a%00b.db", "sqlite://" + dir + "/a%00b.db",
                                 "sqlite:" + dir + "/a%00"}) {
    SCOPED_TRACE(url);
    try {
      (void)open_store(url);
      ADD_FAILURE() << "opened a path with a NUL byte";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), "store URL");
    }
    EXPECT_FALSE(std::filesystem::exists(dir + "/a")) << "a NUL byte cut the path short";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace idem
