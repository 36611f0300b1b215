// Unit tests of the pieces of `idem proxy` that need no network: the Idempotency-Key header,
// scope and fingerprint, the record format, header handling and option parsing.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "identity.h"
#include "messages.h"
#include "options.h"
#include "record.h"

namespace idem::proxy {
namespace {

namespace http = boost::beast::http;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::StartsWith;

Request post(const std::string& target, const std::string& body = {}) {
  Request r{http::verb::post, target, 11};
  r.body() = body;
  return r;
}

Request with_key(const std::string& value) {
  Request r = post("/pay");
  r.set(kKeyHeader, value);
  return r;
}

// ---- the key header ----

TEST(ReadKey, AbsentWhenThereIsNoHeader) {
  EXPECT_EQ(read_key(post("/pay")).kind, KeyHeader::Kind::kAbsent);
}

TEST(ReadKey, StructuredFieldStringIsUnquotedAndUnescaped) {
  KeyHeader k = read_key(with_key(R"( "a \"b\" \\ c" )"));
  ASSERT_EQ(k.kind, KeyHeader::Kind::kValid) << k.why;
  EXPECT_EQ(k.key, R"(a "b" \ c)");
}

TEST(ReadKey, BareTokenIsTakenAsIs) {
  KeyHeader k = read_key(with_key("8e03978e-40d5-43e8-bc93-6894a57f9324"));
  ASSERT_EQ(k.kind, KeyHeader::Kind::kValid);
  EXPECT_EQ(k.key, "8e03978e-40d5-43e8-bc93-6894a57f9324");
}

TEST(ReadKey, MalformedValuesAreRefusedWithAReason) {
  for (const char* bad : {"\"\"", "\"open", "\"a\"b", "\"a\\nb\"", "two words", "\"tab\there\""}) {
    KeyHeader k = read_key(with_key(bad));
    EXPECT_EQ(k.kind, KeyHeader::Kind::kMalformed) << bad;
    EXPECT_FALSE(k.why.empty()) << bad;
  }
}

TEST(ReadKey, LengthLimitIsSpecTenLimit) {
  EXPECT_EQ(read_key(with_key(std::string(1024, 'k'))).kind, KeyHeader::Kind::kValid);
  KeyHeader k = read_key(with_key("\"" + std::string(1025, 'k') + "\""));
  EXPECT_EQ(k.kind, KeyHeader::Kind::kMalformed);
  EXPECT_THAT(k.why, HasSubstr("1025 bytes"));
}

TEST(ReadKey, AnotherHeaderNameAndTheUuidFormat) {
  Request r = post("/pay");
  r.set("PayPal-Request-Id", "8E03978E-40d5-43e8-bc93-6894a57f9324");
  EXPECT_EQ(read_key(r).kind, KeyHeader::Kind::kAbsent);
  KeyHeader k = read_key(r, "paypal-request-id", KeyFormat::kUuid);
  ASSERT_EQ(k.kind, KeyHeader::Kind::kValid) << k.why;
  r.set("PayPal-Request-Id", "order-7");
  EXPECT_EQ(read_key(r, "PayPal-Request-Id", KeyFormat::kAny).kind, KeyHeader::Kind::kValid);
  EXPECT_EQ(read_key(r, "PayPal-Request-Id", KeyFormat::kUuid).kind, KeyHeader::Kind::kMalformed);
  r.set("PayPal-Request-Id", "8e03978e+40d5-43e8-bc93-6894a57f9324");
  EXPECT_EQ(read_key(r, "PayPal-Request-Id", KeyFormat::kUuid).kind, KeyHeader::Kind::kMalformed);
}

TEST(ReadKey, TwoHeadersAreRefused) {
  Request r = with_key("a");
  r.insert(kKeyHeader, "b");
  EXPECT_EQ(read_key(r).kind, KeyHeader::Kind::kMalformed);
}

// ---- scope and fingerprint ----

TEST(Scope, MethodAndPathWithoutTheQuery) {
  ProxyOptions o;
  EXPECT_EQ(scope_of(post("/orders/7?x=1"), o), "POST /orders/7");
}

TEST(Scope, CredentialsAreDigestedIntoTheScope) {
  ProxyOptions o;
  Request alice = post("/pay");
  alice.set(http::field::authorization, "Bearer alice");
  Request bob = post("/pay");
  bob.set(http::field::authorization, "Bearer bob");
  const std::string a = scope_of(alice, o);
  EXPECT_THAT(a, StartsWith("c:"));
  EXPECT_THAT(a, testing::EndsWith(" POST /pay"));
  EXPECT_THAT(a, testing::Not(HasSubstr("alice")));
  EXPECT_NE(a, scope_of(bob, o));
  o.credential_scope = false;
  EXPECT_EQ(scope_of(alice, o), "POST /pay");
}

TEST(Scope, NamedCookiesStandInForAMissingAuthorization) {
  ProxyOptions o;
  o.credential_cookies = {"sid"};
  Request one = post("/pay");
  one.set(http::field::cookie, "theme=dark; sid=123");
  Request same = post("/pay");
  same.set(http::field::cookie, "sid=123");
  Request other = post("/pay");
  other.set(http::field::cookie, "sid=456; theme=dark");
  Request unnamed = post("/pay");
  unnamed.set(http::field::cookie, "theme=dark");
  EXPECT_EQ(scope_of(one, o), scope_of(same, o));
  EXPECT_NE(scope_of(one, o), scope_of(other, o));
  EXPECT_EQ(scope_of(unnamed, o), "POST /pay");
}

TEST(Scope, HeaderValueIsLengthPrefixedSoPartsCannotRunTogether) {
  ProxyOptions o;
  o.scope_header = "X-Tenant";
  o.policy.fixed_scope = "payments";
  Request r = post("/pay");
  r.set("X-Tenant", "acme corp");
  EXPECT_EQ(scope_of(r, o), "t9:acme corp payments");
  EXPECT_EQ(scope_of(post("/pay"), o), "payments");
}

TEST(Scope, HostIsInTheScopeLowerCasedAndLengthPrefixed) {
  ProxyOptions o;
  Request a = post("/pay");
  a.set(http::field::host, "Shop.Example:8080");
  EXPECT_EQ(scope_of(a, o), "h17:shop.example:8080 POST /pay");
  Request b = post("/pay");
  b.set(http::field::host, "other.example");
  EXPECT_NE(scope_of(a, o), scope_of(b, o));
  o.host_scope = false;
  EXPECT_EQ(scope_of(a, o), "POST /pay");
}

TEST(Scope, CredentialsAreReportedOnlyWhenTheScopeHoldsThem) {
  ProxyOptions o;
  Request cookie_only = post("/pay");
  cookie_only.set(http::field::cookie, "session=1");
  EXPECT_FALSE(has_credentials(cookie_only, o));
  o.credential_cookies = {"session"};
  EXPECT_TRUE(has_credentials(cookie_only, o));
  Request bearer = post("/pay");
  bearer.set(http::field::authorization, "Bearer x");
  EXPECT_TRUE(has_credentials(bearer, o));
  o.credential_scope = false;
  EXPECT_FALSE(has_credentials(bearer, o));
}

TEST(Scope, LongScopeBecomesADigestWithinTheLimit) {
  ProxyOptions o;
  const std::string long_path = "/" + std::string(400, 'p');
  std::string scope = scope_of(post(long_path), o);
  EXPECT_THAT(scope, StartsWith("sha256:"));
  EXPECT_LE(scope.size(), kMaxScopeBytes);
  EXPECT_NE(scope, scope_of(post(long_path + "q"), o));
}

TEST(Fingerprint, CoversMethodTargetBodyAndChosenHeaders) {
  ProxyOptions o;
  const std::string base = fingerprint_of(post("/pay", "a"), o);
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(base, fingerprint_of(post("/pay", "a"), o));
  EXPECT_NE(base, fingerprint_of(post("/pay", "b"), o));
  EXPECT_NE(base, fingerprint_of(post("/pay?x", "a"), o));
  // Length prefixes: moving a byte between target and body changes the fingerprint.
  EXPECT_NE(fingerprint_of(post("/pa", "ya"), o), fingerprint_of(post("/pay", "a"), o));
  Request with_header = post("/pay", "a");
  with_header.set("X-Amount", "10");
  EXPECT_EQ(base, fingerprint_of(with_header, o));
  o.fingerprint_headers = {"X-Amount"};
  EXPECT_NE(fingerprint_of(with_header, o), fingerprint_of(post("/pay", "a"), o));
}

TEST(Sha256, KnownAnswer) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// ---- the record format ----

TEST(Record, RoundTripsEveryField) {
  RecordedResponse r;
  r.status = 201;
  r.reason = "Created";
  r.headers = {{"Content-Type", "application/octet-stream"},
               {"X-Empty", ""},
               {"Set-Cookie", "a=1"},
               {"Set-Cookie", "b=2"}};
  r.body = std::string("\0\xff\x01binary\0", 10);
  std::string bytes = encode_record(r);
  EXPECT_EQ(bytes.size(), encoded_size(r));
  EXPECT_EQ(bytes.substr(0, 5), std::string("IDMH\x01", 5));
  std::optional<RecordedResponse> back = decode_record(bytes);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->status, 201u);
  EXPECT_EQ(back->reason, "Created");
  EXPECT_EQ(back->headers, r.headers);
  EXPECT_EQ(back->body, r.body);
}

TEST(Record, RefusesOtherFormatsVersionsAndTruncation) {
  RecordedResponse r;
  r.headers = {{"A", "b"}};
  r.body = "body";
  const std::string good = encode_record(r);
  std::string why;
  EXPECT_FALSE(decode_record("IDEM\x01\0\0\0out", &why));
  EXPECT_THAT(why, HasSubstr("not an HTTP answer"));
  std::string newer = good;
  newer[4] = 2;
  EXPECT_FALSE(decode_record(newer, &why));
  EXPECT_THAT(why, HasSubstr("version 2"));
  std::string flagged = good;
  flagged[5] = 2;
  EXPECT_FALSE(decode_record(flagged, &why));
  EXPECT_THAT(why, HasSubstr("unknown flags"));
  // Cut inside the header list: refused, never read past the end.
  for (std::size_t cut = 12; cut < good.size() - r.body.size(); ++cut) {
    EXPECT_FALSE(decode_record(good.substr(0, cut))) << cut;
  }
  // A header count that no payload of this size could hold.
  std::string lying = good;
  lying[11] = '\x7f';
  EXPECT_FALSE(decode_record(lying, &why));
}

TEST(Record, MarkerOfATooLargeAnswerKeepsStatusHeadersAndSizeButNoBody) {
  RecordedResponse r;
  r.status = 201;
  r.headers = {{"Location", "/orders/7"}};
  r.body_omitted = true;
  r.body_size = 123456789;
  const std::string bytes = encode_record(r);
  EXPECT_EQ(bytes.size(), encoded_size(r));
  EXPECT_EQ(static_cast<unsigned char>(bytes[5]), kFlagBodyOmitted);
  std::optional<RecordedResponse> back = decode_record(bytes);
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(back->body_omitted);
  EXPECT_EQ(back->body_size, 123456789u);
  EXPECT_EQ(back->status, 201u);
  EXPECT_EQ(back->headers, r.headers);
  EXPECT_TRUE(back->body.empty());
  // A marker with bytes after its size is not one this proxy wrote.
  EXPECT_FALSE(decode_record(bytes + "x"));
  EXPECT_FALSE(decode_record(bytes.substr(0, bytes.size() - 1)));
}

// ---- headers ----

TEST(Messages, HopByHopHeadersAndTheHeadersConnectionNamesAreRemoved) {
  Response res;
  res.set(http::field::connection, "keep-alive, X-Secret");
  res.set("X-Secret", "1");
  res.set(http::field::keep_alive, "timeout=5");
  res.set(http::field::transfer_encoding, "chunked");
  res.set(http::field::upgrade, "h2c");
  res.set("X-Kept", "yes");
  strip_hop_by_hop(res);
  std::vector<std::string> names;
  for (const auto& f : res) names.emplace_back(f.name_string());
  EXPECT_THAT(names, ElementsAre("X-Kept"));
}

TEST(Messages, UpstreamRequestDropsExpectAndForgedFencingHeaders) {
  Request client = post("/pay", "body");
  client.set(http::field::expect, "100-continue");
  client.set(kTokenHeader, "1");
  client.set(http::field::connection, "close");
  client.keep_alive(false);
  client.version(10);
  RequestHeader up = upstream_header(client, {});
  EXPECT_EQ(up.count(http::field::expect), 0u);
  EXPECT_EQ(up.count(kTokenHeader), 0u);
  EXPECT_EQ(up.version(), 11u);
  EXPECT_TRUE(keep_alive_of(up));
  add_fencing(up, 42, 2, true);
  EXPECT_EQ(up[kTokenHeader], "42");
  EXPECT_EQ(up[kAttemptHeader], "2");
  EXPECT_EQ(up[kStolenHeader], "true");
}

TEST(Messages, RecordKeepsEndToEndHeadersInOrderAndReplayMarksIt) {
  Response up{http::status::created, 11};
  up.set("X-B", "2");
  up.insert("X-A", "1");
  up.set(http::field::connection, "keep-alive");
  up.set(http::field::content_length, "4");
  RecordedResponse r = to_record(up);
  r.body = "body";
  EXPECT_THAT(r.headers, ElementsAre(Pair("X-B", "2"), Pair("X-A", "1")));
  Response replay = from_record(r, true);
  EXPECT_EQ(replay.result_int(), 201u);
  EXPECT_EQ(replay[kReplayedHeader], "true");
  EXPECT_EQ(replay.body(), "body");
}

TEST(Messages, UpstreamHeaderTellsWhoAskedAndThroughWhat) {
  Request client = post("/pay");
  client.set("X-Forwarded-For", "203.0.113.7");
  client.set(http::field::via, "1.1 lb");
  RequestHeader up = upstream_header(client, ClientInfo{"10.0.0.2", 5555, "req-1"});
  EXPECT_EQ(up["X-Forwarded-For"], "203.0.113.7, 10.0.0.2");
  EXPECT_EQ(up[http::field::forwarded], "for=10.0.0.2");
  EXPECT_EQ(up[http::field::via], "1.1 lb, 1.1 idem");
  EXPECT_EQ(up[kRequestIdHeader], "req-1");
  RequestHeader v6 = upstream_header(post("/pay"), ClientInfo{"::1", 1, "r"});
  EXPECT_EQ(v6[http::field::forwarded], "for=\"[::1]\"");
}

TEST(Messages, RequestIdsFromClientsAreCheckedAndNewOnesAreRandomHex) {
  EXPECT_EQ(usable_request_id("abc-123"), std::optional<std::string>("abc-123"));
  EXPECT_FALSE(usable_request_id(""));
  EXPECT_FALSE(usable_request_id("has space"));
  EXPECT_FALSE(usable_request_id(std::string(129, 'a')));
  EXPECT_FALSE(usable_request_id("quote\""));
  const std::string id = new_request_id();
  EXPECT_EQ(id.size(), 32u);
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(id, new_request_id());
}

// Each thread draws ids from a generator of its own, seeded on its own: threads started
// together (the proxy's I/O and store threads) never hand out the same ids.
TEST(Messages, NewRequestIdsDoNotRepeatAcrossThreads) {
  constexpr int kThreads = 4;
  constexpr int kEach = 2000;
  std::vector<std::vector<std::string>> drawn(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&drawn, t] {
      for (int i = 0; i < kEach; ++i)
        drawn[static_cast<std::size_t>(t)].push_back(new_request_id());
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<std::string> all;
  for (const auto& ids : drawn) all.insert(ids.begin(), ids.end());
  EXPECT_EQ(all.size(), static_cast<std::size_t>(kThreads * kEach));
}

TEST(Messages, HttpDateIsImfFixdate) {
  EXPECT_EQ(http_date(std::chrono::system_clock::time_point(std::chrono::seconds(784111777))),
            "Sun, 06 Nov 1994 08:49:37 GMT");
}

TEST(Messages, SetCookieIsFoundInARecordWhateverItsCase) {
  RecordedResponse r;
  r.headers = {{"Content-Type", "text/plain"}};
  EXPECT_FALSE(sets_cookie(r));
  r.headers.emplace_back("set-cookie", "a=1");
  EXPECT_TRUE(sets_cookie(r));
}

TEST(Messages, ProblemIsProblemJson) {
  Response p = problem(409, "in-progress", "busy \xff");
  EXPECT_EQ(p[http::field::content_type], "application/problem+json");
  EXPECT_THAT(p.body(), HasSubstr("\"status\":409"));
  EXPECT_THAT(p.body(), HasSubstr("\"code\":\"in-progress\""));
  EXPECT_THAT(p.body(), HasSubstr("\"title\":\"Conflict\""));
  EXPECT_THAT(p.body(), HasSubstr("\"type\":\"about:blank\""));
  EXPECT_FALSE(p[http::field::date].empty());
  Response named = problem(409, "in-progress", "busy",
                           ProblemContext{"req-9", "https://api.example/problems/", {{"n", 7}}});
  EXPECT_THAT(named.body(), HasSubstr("\"type\":\"https://api.example/problems/in-progress\""));
  EXPECT_THAT(named.body(), HasSubstr("\"request_id\":\"req-9\""));
  EXPECT_THAT(named.body(), HasSubstr("\"n\":7"));
  EXPECT_EQ(named[kRequestIdHeader], "req-9");
}

TEST(Messages, RetryAfterRoundsUpToWholeSecondsAndIsAtLeastOne) {
  EXPECT_EQ(retry_after(std::chrono::milliseconds(0)), "1");
  EXPECT_EQ(retry_after(std::chrono::milliseconds(1001)), "2");
  EXPECT_EQ(retry_after(std::chrono::milliseconds(30000)), "30");
}

TEST(Messages, ReleaseStatusesDefaultToServerErrorsTooManyRequestsAndRequestTimeout) {
  ProxyOptions o;
  for (unsigned status : {500u, 503u, 599u, 429u, 408u})
    EXPECT_TRUE(releases(status, o.policy)) << status;
  for (unsigned status : {200u, 201u, 400u, 404u, 409u, 422u}) {
    EXPECT_FALSE(releases(status, o.policy)) << status;
  }
}

// ---- options ----

TEST(Options, ListenAndUpstreamAddresses) {
  ProxyOptions o;
  parse_listen("0.0.0.0:8080", o);
  EXPECT_EQ(o.listen_address, "0.0.0.0");
  EXPECT_EQ(o.listen_port, 8080);
  parse_listen("[::1]:0", o);
  EXPECT_EQ(o.listen_address, "::1");
  parse_upstream("http://localhost:3000/", o);
  EXPECT_EQ(o.upstream_host, "localhost");
  EXPECT_EQ(o.upstream_port, 3000);
  for (const char* bad : {"8080", "127.0.0.1:99999", ":80", "localhost:80"}) {
    EXPECT_THROW(parse_listen(bad, o), std::invalid_argument) << bad;
  }
  for (const char* bad : {"https://x:1", "x:1", "http://x:1/path", "http://x", "http://x:0"}) {
    EXPECT_THROW(parse_upstream(bad, o), std::invalid_argument) << bad;
  }
}

TEST(Routes, GlobsMatchWithinASegmentOrAcrossSegments) {
  EXPECT_TRUE(path_matches("/orders", "/orders"));
  EXPECT_FALSE(path_matches("/orders", "/orders/7"));
  EXPECT_TRUE(path_matches("/orders/*", "/orders/7"));
  EXPECT_FALSE(path_matches("/orders/*", "/orders/7/items"));
  EXPECT_TRUE(path_matches("/orders/*/items", "/orders/7/items"));
  EXPECT_TRUE(path_matches("/orders/**", "/orders/7/items/3"));
  EXPECT_TRUE(path_matches("/orders/**", "/orders"));
  EXPECT_TRUE(path_matches("/**/refunds", "/v1/payments/7/refunds"));
  EXPECT_FALSE(path_matches("/**/refunds", "/v1/payments/7/refund"));
  EXPECT_TRUE(path_matches("/v*/pay", "/v2/pay"));
  EXPECT_FALSE(path_matches("/v*/pay", "/pay"));
  // Many stars stay linear: no backtracking blow-up on a long path.
  EXPECT_FALSE(path_matches("/**/*a*a*a*a*a*b", "/" + std::string(10000, 'a')));
}

TEST(Routes, TheFirstMatchingRouteWinsElseTheFlagsPolicy) {
  ProxyOptions o;
  o.policy.require_key = false;
  Route strict{"/pay/**", o.policy};
  strict.policy.require_key = true;
  Route open{"/**", o.policy};
  open.policy.protect = false;
  o.routes = {strict, open};
  EXPECT_TRUE(policy_for(o, "/pay/eu").require_key);
  EXPECT_FALSE(policy_for(o, "/other").protect);
  o.routes.pop_back();
  EXPECT_EQ(&policy_for(o, "/other"), &o.policy);
}

TEST(Options, MethodsAndStatusLists) {
  EXPECT_THAT(parse_methods("post, Patch,PUT"), ElementsAre("POST", "PATCH", "PUT"));
  EXPECT_THROW(parse_methods("POST,,PUT"), std::invalid_argument);
  auto statuses = parse_statuses("5xx, 429,400-403");
  ASSERT_EQ(statuses.size(), 3u);
  EXPECT_TRUE(statuses[0].contains(503));
  EXPECT_TRUE(statuses[1].contains(429));
  EXPECT_TRUE(statuses[2].contains(401));
  EXPECT_FALSE(statuses[2].contains(404));
  EXPECT_TRUE(parse_statuses("none").empty());
  for (const char* bad : {"5x", "600-500", "42", "abc"}) {
    EXPECT_THROW(parse_statuses(bad), std::invalid_argument) << bad;
  }
}

}  // namespace
}  // namespace idem::proxy
