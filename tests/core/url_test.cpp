// Store URLs (SPEC §9, §10): parse_url splits them, Url::redacted never shows a password,
// and open_store turns every bad URL into an error naming what is wrong, never a crash.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "idem/error.h"
#include "idem/open_store.h"

namespace idem {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

// Expects parse_url(text) to throw InvalidArgument for the store URL, with a message that
// contains `why` and none of `secrets`.
void expect_bad_url(const std::string& text, const std::string& why,
                    const std::vector<std::string>& secrets = {}) {
  SCOPED_TRACE(text);
  try {
    const Url url = parse_url(text);
    ADD_FAILURE() << "parsed, scheme '" << url.scheme << "', host '" << url.host << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "store URL");
    EXPECT_THAT(e.what(), HasSubstr(why));
    for (const std::string& secret : secrets) EXPECT_THAT(e.what(), Not(HasSubstr(secret)));
  }
}

// ---- what parses, and into what ----

TEST(ParseUrl, SchemeOnly) {
  const Url url = parse_url("memory:");
  EXPECT_EQ(url.scheme, "memory");
  EXPECT_FALSE(url.has_authority);
  EXPECT_EQ(url.host, "");
  EXPECT_EQ(url.path, "");
  EXPECT_EQ(url.port, 0);
  EXPECT_TRUE(url.query.empty());
}

TEST(ParseUrl, SchemeIsLowercased) {
  EXPECT_EQ(parse_url("SQLite:x.db").scheme, "sqlite");
  EXPECT_EQ(parse_url("Redis://h").scheme, "redis");
}

TEST(ParseUrl, SchemeMayHoldDigitsPlusDotAndDash) {
  EXPECT_EQ(parse_url("a1+b.c-d:x").scheme, "a1+b.c-d");
}

TEST(ParseUrl, RelativePathWithoutAuthority) {
  const Url url = parse_url("sqlite:data/idem.db");
  EXPECT_EQ(url.scheme, "sqlite");
  EXPECT_FALSE(url.has_authority);
  EXPECT_EQ(url.path, "data/idem.db");
}

TEST(ParseUrl, AbsolutePathWithEmptyAuthority) {
  const Url url = parse_url("sqlite:///var/lib/idem.db?synchronous=full");
  EXPECT_EQ(url.scheme, "sqlite");
  EXPECT_TRUE(url.has_authority);
  EXPECT_EQ(url.host, "");
  EXPECT_EQ(url.path, "/var/lib/idem.db");
  EXPECT_THAT(url.query, ElementsAre(Pair("synchronous", "full")));
  EXPECT_EQ(url.param("synchronous"), "full");
}

TEST(ParseUrl, EveryPartOfAFullUrl) {
  const Url url = parse_url(
      "postgresql://app:s3cret@db.example.com:5433/idem?sslmode=require&connect_timeout=5");
  EXPECT_EQ(url.scheme, "postgresql");
  EXPECT_TRUE(url.has_authority);
  EXPECT_EQ(url.user, "app");
  EXPECT_EQ(url.password, "s3cret");
  EXPECT_EQ(url.host, "db.example.com");
  EXPECT_EQ(url.port, 5433);
  EXPECT_EQ(url.path, "/idem");
  EXPECT_THAT(url.query, ElementsAre(Pair("sslmode", "require"), Pair("connect_timeout", "5")));
}

TEST(ParseUrl, UserWithoutPasswordAndNoPort) {
  const Url url = parse_url("postgresql://app@db/idem");
  EXPECT_EQ(url.user, "app");
  EXPECT_EQ(url.password, "");
  EXPECT_EQ(url.host, "db");
  EXPECT_EQ(url.port, 0);
  EXPECT_EQ(url.path, "/idem");
}

TEST(ParseUrl, HostWithoutPath) {
  const Url url = parse_url("redis://cache:6379");
  EXPECT_EQ(url.host, "cache");
  EXPECT_EQ(url.port, 6379);
  EXPECT_EQ(url.path, "");
}

TEST(ParseUrl, QueryRightAfterHost) {
  const Url url = parse_url("redis://cache?db=2");
  EXPECT_EQ(url.host, "cache");
  EXPECT_EQ(url.path, "");
  EXPECT_EQ(url.param("db"), "2");
}

TEST(ParseUrl, BracketedIpv6HostWithPort) {
  const Url url = parse_url("redis://[::1]:6380/2");
  EXPECT_EQ(url.host, "::1");
  EXPECT_EQ(url.port, 6380);
  EXPECT_EQ(url.path, "/2");
}

TEST(ParseUrl, BracketedIpv6HostWithoutPort) {
  const Url url = parse_url("postgresql://u@[2001:db8::7]/idem");
  EXPECT_EQ(url.user, "u");
  EXPECT_EQ(url.host, "2001:db8::7");
  EXPECT_EQ(url.port, 0);
  EXPECT_EQ(url.path, "/idem");
}

TEST(ParseUrl, PercentEscapesAreDecodedEverywhere) {
  const Url url =
      parse_url("postgresql://us%40er:p%3Aw%2Fd%25@h%2Dost/my%20db?app%20name=a%26b&x=%3D");
  EXPECT_EQ(url.user, "us@er");
  EXPECT_EQ(url.password, "p:w/d%");
  EXPECT_EQ(url.host, "h-ost");
  EXPECT_EQ(url.path, "/my db");
  EXPECT_THAT(url.query, ElementsAre(Pair("app name", "a&b"), Pair("x", "=")));
}

TEST(ParseUrl, PercentEscapesAcceptBothCases) {
  EXPECT_EQ(parse_url("sqlite:%2f%2F").path, "//");
  EXPECT_EQ(parse_url("sqlite:%e2%82%ac").path, "\xe2\x82\xac");
}

TEST(ParseUrl, PercentEscapeCanMakeANulByte) {
  EXPECT_EQ(parse_url("sqlite:a%00b").path, std::string("a\0b", 3));
}

TEST(ParseUrl, PasswordMayHoldAnUnescapedAt) {
  // The last '@' ends the user information, so a password with '@' still parses.
  const Url url = parse_url("redis://u:p@ss@host:1/0");
  EXPECT_EQ(url.user, "u");
  EXPECT_EQ(url.password, "p@ss");
  EXPECT_EQ(url.host, "host");
}

TEST(ParseUrl, EmptyQueryPairsAreSkippedAndBareNamesHaveEmptyValues) {
  const Url url = parse_url("sqlite:x.db?&a=1&&flag&b=");
  EXPECT_THAT(url.query, ElementsAre(Pair("a", "1"), Pair("flag", ""), Pair("b", "")));
}

TEST(ParseUrl, ValueMayHoldAnEqualsSign) {
  EXPECT_EQ(parse_url("sqlite:x?k=a=b").param("k"), "a=b");
}

TEST(ParseUrl, PortBoundsAreInclusive) {
  EXPECT_EQ(parse_url("redis://h:1").port, 1);
  EXPECT_EQ(parse_url("redis://h:65535").port, 65535);
}

TEST(UrlParam, ReturnsTheFirstValueOrTheFallback) {
  const Url url = parse_url("sqlite:x.db?a=1&a=2");
  EXPECT_EQ(url.param("a"), "1");
  EXPECT_EQ(url.param("missing"), "");
  EXPECT_EQ(url.param("missing", "dflt"), "dflt");
}

// ---- what does not parse, and what the error says ----

TEST(ParseUrl, MissingSchemeIsNamed) {
  expect_bad_url("", "no scheme");
  expect_bad_url("/var/lib/idem.db", "no scheme");
  expect_bad_url(":memory", "no scheme");
}

TEST(ParseUrl, BadSchemeCharacterIsNamed) {
  expect_bad_url("1sqlite:x", "bad character in scheme");
  expect_bad_url("my store:x", "bad character in scheme");
  expect_bad_url("+a:x", "bad character in scheme");
}

TEST(ParseUrl, BadPortIsNamed) {
  for (const char* port : {"0", "65536", "99999999999", "-1", "+5", "abc", "12ab", " 1"}) {
    expect_bad_url(std::string("redis://host:") + port + "/0",
                   std::string("bad port '") + port + "'");
  }
  expect_bad_url("redis://[::1]:x/0", "bad port 'x'");
}

TEST(ParseUrl, BadPercentEscapeIsNamed) {
  expect_bad_url("sqlite:a%zzb", "bad %-escape");
  expect_bad_url("sqlite:a%4", "truncated %-escape");
  expect_bad_url("sqlite:a%", "truncated %-escape");
  expect_bad_url("sqlite:a?k=%g1", "bad %-escape");
  expect_bad_url("redis://ho%st/0", "bad %-escape");
}

TEST(ParseUrl, BadIpv6BracketsAreNamed) {
  expect_bad_url("redis://[::1/0", "unclosed '['");
  expect_bad_url("redis://[::1]x:1/0", "after ']'");
}

TEST(ParseUrl, UnbracketedIpv6HostIsRejected) {
  // Without brackets, "::1" cannot be told apart from a host and a port.
  expect_bad_url("redis://::1/0", "IPv6");
  expect_bad_url("redis://fe80::1:6379/0", "IPv6");
}

TEST(ParseUrl, AListOfServersIsKeptWholeInTheHost) {
  // Redis Sentinel and Cluster URLs: the store splits the list.
  const Url u = parse_url("redis+cluster://app:pw@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002/x?a=b");
  EXPECT_EQ(u.scheme, "redis+cluster");
  EXPECT_EQ(u.user, "app");
  EXPECT_EQ(u.password, "pw");
  EXPECT_EQ(u.host, "10.0.0.1:7000,10.0.0.2:7001,[::1]:7002");
  EXPECT_EQ(u.port, 0);
  EXPECT_EQ(u.path, "/x");
  EXPECT_EQ(u.param("a"), "b");
}

TEST(ParseUrl, EmptyQueryNameIsNamed) {
  expect_bad_url("sqlite:x.db?=v", "empty query parameter name");
}

TEST(ParseUrl, ErrorsNeverShowThePassword) {
  expect_bad_url("postgresql://app:hunter2@db:99999/idem", "bad port", {"hunter2"});
  expect_bad_url("postgresql://app:hunter2@db/idem%zz", "bad %-escape", {"hunter2"});
  expect_bad_url("postgresql://app:hun%zzter2@db/idem", "bad %-escape", {"hun", "ter2"});
  expect_bad_url("postgresql://db/idem?password=hunter2&x=%zz", "bad %-escape", {"hunter2"});
  expect_bad_url("sqlite:x.db?password=hunter2&x=%zz", "bad %-escape", {"hunter2"});
  // Credentials with a mistyped "://" (issue 9, found by the secrets test).
  expect_bad_url("redis//:hunter2@db/0", "bad character in scheme", {"hunter2"});
  expect_bad_url("my redis:hunter2@db/0", "bad character in scheme", {"hunter2"});
}

// ---- redacted() ----

TEST(UrlRedacted, ReplacesThePasswordOnly) {
  const Url url = parse_url("postgresql://app:s3cret@db.example.com:5433/idem?sslmode=require");
  const std::string text = url.redacted();
  EXPECT_EQ(text, "postgresql://app:***@db.example.com:5433/idem?sslmode=require");
}

TEST(UrlRedacted, HidesAPasswordQueryParameter) {
  const std::string text = parse_url("postgresql://db/idem?user=u&password=pw1&x=1").redacted();
  EXPECT_THAT(text, Not(HasSubstr("pw1")));
  EXPECT_EQ(text, "postgresql://db/idem?user=u&password=***&x=1");
}

TEST(UrlRedacted, EmptyUserWithPassword) {
  EXPECT_EQ(parse_url("redis://:pw2@cache:6379/0").redacted(), "redis://:***@cache:6379/0");
}

TEST(UrlRedacted, WithoutCredentialsIsUnchanged) {
  EXPECT_EQ(parse_url("memory:").redacted(), "memory:");
  EXPECT_EQ(parse_url("sqlite:///var/lib/idem.db").redacted(), "sqlite:///var/lib/idem.db");
  EXPECT_EQ(parse_url("sqlite:rel.db").redacted(), "sqlite:rel.db");
  EXPECT_EQ(parse_url("postgresql://app@db/idem").redacted(), "postgresql://app@db/idem");
}

TEST(UrlRedacted, KeepsIpv6HostsBracketed) {
  EXPECT_EQ(parse_url("redis://:pw@[::1]:6380/2").redacted(), "redis://:***@[::1]:6380/2");
  EXPECT_EQ(parse_url("redis://[fe80::1]/0").redacted(), "redis://[fe80::1]/0");
}

// ---- open_store ----

// Expects open_store(text) to throw InvalidArgument for the store URL whose message holds
// every one of `parts` and none of `secrets`.
void expect_open_fails(const std::string& text, const std::vector<std::string>& parts,
                       const std::vector<std::string>& secrets = {}) {
  SCOPED_TRACE(text);
  try {
    open_store(text);
    ADD_FAILURE() << "opened";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "store URL");
    for (const std::string& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
    for (const std::string& secret : secrets) EXPECT_THAT(e.what(), Not(HasSubstr(secret)));
  }
}

TEST(OpenStore, UnknownSchemeNamesItAndTheKnownOnes) {
  expect_open_fails("mongodb://u:topsecret@host/db", {"'mongodb'", "memory"}, {"topsecret"});
  expect_open_fails("file:/tmp/x", {"'file'", "memory"});
}

TEST(OpenStore, MalformedUrlSaysWhy) {
  expect_open_fails("", {"no scheme"});
  expect_open_fails("not a url", {"no scheme"});
  expect_open_fails("redis://h:70000/0", {"bad port"});
  expect_open_fails("sqlite:%zz", {"bad %-escape"});
}

TEST(OpenStore, AvailableSchemesIncludeMemory) {
  EXPECT_THAT(available_schemes(), ::testing::Contains("memory"));
}

TEST(OpenStore, EveryAvailableSchemeIsOpenableOrFailsCleanly) {
  // open_store never crashes on a scheme it lists, even with an unusable rest of the URL.
  for (const std::string& scheme : available_schemes()) {
    SCOPED_TRACE(scheme);
    try {
      open_store(scheme + "://[::1]:1/no/such/dir/x?bogus=1");
    } catch (const Error& e) {
      EXPECT_THAT(e.code(),
                  ::testing::AnyOf(ErrorCode::kInvalidArgument, ErrorCode::kStoreUnavailable));
      EXPECT_THAT(std::string(e.what()), AllOf(Not(HasSubstr("\n")), Not(::testing::IsEmpty())));
    }
  }
}

}  // namespace
}  // namespace idem
