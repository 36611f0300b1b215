// The Redis store over TLS (rediss://) on the TLS server scripts/servers.sh starts
// (idem_start_redis_tls, IDEM_TEST_REDIS_TLS_URL): the shared store suite unchanged, and what
// the certificate checks refuse, each with a message that says which check failed.

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "idem/open_store.h"
#include "idem/stores/redis_store.h"
#include "idem/testing/store_conformance.h"
#include "stores/redis/redis_test_util.h"

namespace idem::testing {
namespace {

::testing::Environment* const kTlsEnvironment =
    ::testing::AddGlobalTestEnvironment(new ServerEnvironment(
        "IDEM_TEST_REDIS_TLS_URL", "source scripts/servers.sh and run idem_start_redis_tls"));

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string tls_url() { return env("IDEM_TEST_REDIS_TLS_URL"); }
std::string cert(const std::string& file) { return env("IDEM_TEST_REDIS_TLS_DIR") + "/" + file; }
std::string tls_port() { return env("IDEM_TEST_REDIS_TLS_PORT"); }

// rediss:// to the TLS server with `query` (no CA unless it gives one) and a fresh prefix.
std::string tls_url_with(const std::string& host, const std::string& query) {
  return "rediss://" + host + ":" + tls_port() + "/0?prefix=" + fresh_prefix("tls") +
         (query.empty() ? "" : "&" + query);
}

IDEM_INSTANTIATE_STORE_CONFORMANCE(
    RedisTls,
    StoreTestContext{.name = "redis_tls",
                     .make = [](std::shared_ptr<ManualClock>) -> std::shared_ptr<Store> {
                       return open_store(with_param(tls_url(), "prefix", fresh_prefix("tls")));
                     },
                     .fake_clock = false,
                     .tick = Duration{200},
                     .native_expiry = true,
                     .store_wide_tokens = true});

void works(const std::shared_ptr<Store>& store) {
  const AcquireResult r = store->acquire("s", "k", Duration{10000}, Duration{60000});
  ASSERT_TRUE(std::holds_alternative<Acquired>(r));
  const Token token = std::get<Acquired>(r).lease.token;
  EXPECT_EQ(store->complete("s", "k", token, "done", Duration{60000}), WriteResult::kDone);
  EXPECT_TRUE(
      std::holds_alternative<Replay>(store->acquire("s", "k", Duration{10000}, Duration{60000})));
}

// SPEC §7: the subscriber's connection speaks TLS like the pool's.
TEST(RedisTls, AWatchWakesWhenAnotherStoreCompletes) {
  expect_watch_wakes_on_complete(with_param(tls_url(), "prefix", fresh_prefix("tls-wake")));
}

TEST(RedisTls, ChecksTheCertificateAgainstTheGivenCa) {
  works(open_store(tls_url_with("127.0.0.1", "tls_ca=" + cert("ca.crt"))));
}

TEST(RedisTls, ByHostNameSendsItAsSniAndChecksIt) {
  works(open_store(tls_url_with("localhost", "tls_ca=" + cert("ca.crt"))));
}

TEST(RedisTls, CaDirectory) {
  // OpenSSL looks CAs up in a directory by subject hash: link the CA under its hash.
  const std::string dir = env("IDEM_TEST_REDIS_TLS_DIR") + "/ca-dir";
  ASSERT_EQ(
      std::system(("mkdir -p " + dir + " && cp " + cert("ca.crt") + " " + dir +
                   "/ && openssl rehash " + dir + " 2>/dev/null || c_rehash " + dir + " >/dev/null")
                      .c_str()),
      0);
  works(open_store(tls_url_with("127.0.0.1", "tls_ca_dir=" + dir)));
}

TEST(RedisTls, ClientCertificate) {
  works(open_store(tls_url_with("127.0.0.1", "tls_ca=" + cert("ca.crt") +
                                                 "&tls_cert=" + cert("client.crt") +
                                                 "&tls_key=" + cert("client.key"))));
}

TEST(RedisTls, AWrongCaIsRefusedSayingSo) {
  expect_unavailable(
      [] { (void)open_store(tls_url_with("127.0.0.1", "tls_ca=" + cert("wrong-ca.crt"))); },
      {"not signed by a trusted CA", "tls_ca="});
}

TEST(RedisTls, WithoutACaTheSystemCasRefuseAPrivateCa) {
  expect_unavailable([] { (void)open_store(tls_url_with("127.0.0.1", "")); },
                     {"not signed by a trusted CA"});
}

TEST(RedisTls, AWrongServerNameIsRefusedSayingSo) {
  expect_unavailable(
      [] {
        (void)open_store(tls_url_with(
            "127.0.0.1", "tls_ca=" + cert("ca.crt") + "&tls_server_name=wrong.example"));
      },
      {"not for \"wrong.example\"", "wrong host name"});
}

TEST(RedisTls, AnExpiredCertificateIsRefusedSayingSo) {
  // A server of the test's own, with the certificate that expired in 2020.
  const int port = unused_port();
  PrivateRedis server({"--tls-port", std::to_string(port), "--tls-cert-file", cert("expired.crt"),
                       "--tls-key-file", cert("expired.key"), "--tls-ca-cert-file", cert("ca.crt"),
                       "--tls-auth-clients", "no"});
  ASSERT_TRUE(server.ok());
  const std::string url =
      "rediss://127.0.0.1:" + std::to_string(port) + "/0?tls_ca=" + cert("ca.crt");
  expect_unavailable([&] { (void)open_store(url); }, {"the server's certificate has expired"});
  // The same server without the check: the certificate's dates are not looked at.
  works(open_store(url + "&tls_verify=off&prefix=" + fresh_prefix("expired")));
}

TEST(RedisTls, VerifyOffAcceptsAnyCertificateAndSaysSo) {
  auto store =
      open_store(tls_url_with("127.0.0.1", "tls_ca=" + cert("wrong-ca.crt") + "&tls_verify=off"));
  works(store);
  EXPECT_EQ(store->describe(), "rediss://127.0.0.1:" + tls_port() + "/0?tls_verify=off");
}

TEST(RedisTls, DescribeNamesNoSecret) {
  RedisStoreOptions o;
  o.port = std::stoi(tls_port());
  o.tls = true;
  o.tls_verify = false;
  o.user = "someone";
  o.password = "secret";
  // AUTH fails (the server has no such user): the error names the store without the password.
  const auto e = expect_unavailable([&] { RedisStore store(o); }, {"rediss://someone:***@"});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(std::string(e->what()).find("secret"), std::string::npos);
}

TEST(RedisTls, TlsToAPlainPortFailsSayingSo) {
  const std::string url = "rediss://127.0.0.1:" + env("IDEM_TEST_REDIS_TLS_PLAIN_PORT") +
                          "/0?connect_timeout=2000&timeout=2000";
  expect_unavailable([&] { (void)open_store(url); }, {"is the server speaking TLS"});
}

// The reverse: a plain redis:// URL on the TLS port. The server resets a client that sends
// no TLS handshake; the error names that likely cause and the way out.
TEST(RedisTls, PlainToATlsPortFailsNamingTlsAndRediss) {
  const std::string url =
      "redis://127.0.0.1:" + tls_port() + "/0?connect_timeout=2000&timeout=2000";
  expect_unavailable([&] { (void)open_store(url); },
                     {"the server may expect TLS on this port", "rediss://"});
}

TEST(RedisTls, TlsOptionsNeedRediss) {
  EXPECT_THROW((void)open_store("redis://127.0.0.1:" + tls_port() + "/0?tls_verify=off"),
               InvalidArgument);
  EXPECT_THROW((void)open_store("rediss://127.0.0.1:" + tls_port() + "/0?tls_verify=maybe"),
               InvalidArgument);
  EXPECT_THROW(
      (void)open_store("rediss://127.0.0.1:" + tls_port() + "/0?tls_cert=" + cert("client.crt")),
      InvalidArgument);
}

}  // namespace
}  // namespace idem::testing
