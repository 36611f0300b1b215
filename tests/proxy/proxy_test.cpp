// End-to-end tests of `idem proxy` (SPEC §13, docs/proxy.md): the built `idem` binary runs as
// a proxy process between real clients (Beast's client, curl) and a real upstream process
// (idem_test_upstream) that logs every request it executes. Tests that need a store shared
// by several processes run once per store: SQLite always, PostgreSQL and Redis when this
// build includes them and IDEM_TEST_POSTGRES_URL / IDEM_TEST_REDIS_URL are set (with
// IDEM_REQUIRE_SERVERS=1 a missing URL fails the run). Every key is unique to its test, so a
// shared server needs no cleaning between tests.
//
// No assertion depends on timing: requests that must stay in flight wait on a gate in the
// upstream, and the tests wait for conditions (a request reaching the upstream, a line in
// the proxy's log, a process ending).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "idem/open_store.h"
#include "idem/store.h"
#include "support/server_stores.h"

namespace idem::proxy::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Optional;

constexpr const char* kProblemJson = "application/problem+json";

class ProxyTest : public ::testing::Test {
 protected:
  ProxyTest() : upstream_(dir_.path()) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    prefix_ = std::to_string(::getpid()) + "-" + info->name() + "-";
    for (char& c : prefix_) {
      if (c == '/') c = '.';
    }
  }

  ~ProxyTest() override {
    // A failing test shows what the proxies and the upstream said (a sanitizer's report
    // included) before their directory goes.
    if (!HasFailure()) return;
    for (const auto& entry : fs::directory_iterator(dir_.path())) {
      if (entry.path().extension() == ".err") {
        std::cerr << "---- " << entry.path().filename().string() << "\n" << read_file(entry.path());
      }
    }
  }

  virtual std::string store_url() { return "sqlite://" + (dir_ / "idem.db").string(); }

  std::unique_ptr<ProxyProcess> start_proxy(const std::vector<std::string>& options = {},
                                            const std::string& name = "proxy",
                                            const std::vector<std::string>& wrapper = {}) {
    return std::make_unique<ProxyProcess>(dir_.path(), name, upstream_.url(), store_url(), options,
                                          wrapper);
  }

  // A key no other test (or run, on a shared server) uses.
  std::string key(const std::string& name) const { return prefix_ + name; }

  // Sends POST /pay with key `k` from a thread of its own, held in the upstream on the gate
  // named `k`; returns once the upstream has it. `out` gets the answer when the gate opens
  // (or whatever else ends the request).
  std::thread send_gated(std::uint16_t port, const std::string& k, Reply& out) {
    std::thread client([port, k, &out] {
      out = request(port, "POST", "/pay", {{"Idempotency-Key", k}, {"X-Test-Gate", k}});
    });
    if (!upstream_.wait_for(k, 1)) ADD_FAILURE() << "the request did not reach the upstream";
    return client;
  }

  // The record of key `k` in the proxy's default scope for `method_path` ("POST /pay") and
  // `host`: SPEC §13 puts the host in it.
  std::optional<Record> record(const std::string& method_path, const std::string& k,
                               const std::string& host = "127.0.0.1") {
    return open_store(store_url())->get(hosted(method_path, host), k);
  }

  static std::string hosted(const std::string& method_path, const std::string& host = "127.0.0.1") {
    return "h" + std::to_string(host.size()) + ":" + host + " " + method_path;
  }

  // Sends the request again every 50 ms while it is answered 409 (a key held by a lease
  // that has not run out yet); returns the first other answer.
  Reply retry_while_busy(std::uint16_t port, const Headers& headers, const std::string& body = {}) {
    Reply r;
    (void)eventually(
        [&] {
          r = request(port, "POST", "/pay", headers, body);
          if (r.status != 409) return true;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          return false;
        },
        std::chrono::seconds(30));
    return r;
  }

  bool in_progress(const std::string& scope, const std::string& k) {
    std::optional<Record> r = record(scope, k);
    return r && r->state == RecordState::kInProgress;
  }

  ScratchDir dir_;
  Upstream upstream_;
  std::string prefix_;
};

// ---------------------------------------------------------------------------------------
// On every store.

struct StoreCase {
  std::string name;
  std::string url;  // empty: an SQLite file in the test's directory
};

void PrintTo(const StoreCase& c, std::ostream* os) { *os << c.name; }

std::vector<StoreCase> stores() {
  std::vector<StoreCase> out = {{"sqlite", ""}};
  for (const auto& [name, url] : idem::testing::server_store_urls()) out.push_back({name, url});
  return out;
}

class ProxyStoreTest : public ProxyTest, public ::testing::WithParamInterface<StoreCase> {
 protected:
  std::string store_url() override {
    return GetParam().url.empty() ? ProxyTest::store_url() : GetParam().url;
  }
};

TEST_P(ProxyStoreTest, FirstRequestIsForwardedWithFencingHeadersAndItsAnswerIsReplayed) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  // A client cannot forge the fencing headers: the proxy replaces them.
  Headers headers = {
      {"Idempotency-Key", k}, {"Idempotency-Token", "999999"}, {"Idempotency-Attempt", "7"}};
  Reply first = request(proxy->port(), "POST", "/pay", headers, "amount=10");
  ASSERT_EQ(first.status, 200u) << first.error << first.body;
  EXPECT_FALSE(first.replayed());
  EXPECT_EQ(first.count("Idempotent-Replayed"), 0);

  std::optional<Record> stored = record("POST /pay", k);
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->state, RecordState::kComplete);
  const std::string token = std::to_string(stored->token);
  EXPECT_THAT(first.body, AllOf(HasSubstr("token=" + token + " "), HasSubstr("attempt=1 "),
                                HasSubstr("stolen=false ")));

  Reply replay = request(proxy->port(), "POST", "/pay", headers, "amount=10");
  ASSERT_EQ(replay.status, 200u) << replay.error;
  EXPECT_TRUE(replay.replayed());
  EXPECT_EQ(replay.body, first.body);
  EXPECT_EQ(replay.header("X-Execution"), first.header("X-Execution"));
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

TEST_P(ProxyStoreTest, ServerErrorReleasesTheKeyAndARetryRunsAgain) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  Reply failed =
      request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}, {"X-Test-Status", "503"}});
  EXPECT_EQ(failed.status, 503u) << failed.error;
  EXPECT_FALSE(failed.replayed());
  EXPECT_FALSE(record("POST /pay", k).has_value());

  Reply retry = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}});
  EXPECT_EQ(retry.status, 200u) << retry.error;
  EXPECT_FALSE(retry.replayed());
  EXPECT_EQ(upstream_.executions_of(k), 2);
  Reply replay = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}});
  EXPECT_TRUE(replay.replayed());
  EXPECT_EQ(replay.body, retry.body);
}

TEST_P(ProxyStoreTest, DuplicateInFlightGets409WithRetryAfter) {
  auto proxy = start_proxy({"--lease", "20s"});
  const std::string k = key("k");
  Reply first;
  std::thread owner = send_gated(proxy->port(), k, first);

  Reply dup = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}});
  EXPECT_EQ(dup.status, 409u) << dup.error;
  EXPECT_THAT(dup.header("Content-Type"), Optional(std::string(kProblemJson)));
  EXPECT_THAT(dup.body, HasSubstr("\"code\":\"in-progress\""));
  ASSERT_TRUE(dup.header("Retry-After").has_value());
  const int retry_after = std::stoi(*dup.header("Retry-After"));
  EXPECT_GE(retry_after, 1);
  EXPECT_LE(retry_after, 20);

  upstream_.open_gate(k);
  owner.join();
  EXPECT_EQ(first.status, 200u) << first.error;
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

TEST_P(ProxyStoreTest, TwoProxiesOnOneStoreRaceOneKeyAndItRunsOnce) {
  auto a = start_proxy({"--wait", "60s"}, "a");
  auto b = start_proxy({"--wait", "60s"}, "b");
  const std::string k = key("k");
  constexpr int kClients = 10;
  std::vector<Reply> replies(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    const std::uint16_t port = i % 2 == 0 ? a->port() : b->port();
    clients.emplace_back([&, i, port] {
      replies[static_cast<std::size_t>(i)] =
          request(port, "POST", "/pay", {{"Idempotency-Key", k}, {"X-Test-Gate", k}}, "same body");
    });
  }
  ASSERT_TRUE(upstream_.wait_for(k, 1));
  upstream_.open_gate(k);
  for (auto& t : clients) t.join();

  EXPECT_EQ(upstream_.executions_of(k), 1);
  int originals = 0;
  for (const Reply& r : replies) {
    EXPECT_EQ(r.status, 200u) << r.error << r.body;
    EXPECT_EQ(r.body, replies[0].body);
    originals += r.replayed() ? 0 : 1;
  }
  EXPECT_EQ(originals, 1);
}

TEST_P(ProxyStoreTest, UpstreamTimeoutHoldsTheKeyForEveryProxyAndTheLateAnswerIsReplayed) {
  auto a = start_proxy({"--upstream-timeout", "300ms"}, "a");
  auto b = start_proxy({}, "b");
  const std::string k = key("k");
  Reply slow = request(a->port(), "POST", "/pay", {{"Idempotency-Key", k}, {"X-Test-Gate", k}});
  EXPECT_EQ(slow.status, 504u) << slow.error;
  Reply elsewhere = request(b->port(), "POST", "/pay", {{"Idempotency-Key", k}});
  EXPECT_EQ(elsewhere.status, 409u) << elsewhere.error << elsewhere.body;
  upstream_.open_gate(k);
  Reply replay;
  ASSERT_TRUE(eventually([&] {
    replay = request(b->port(), "POST", "/pay", {{"Idempotency-Key", k}});
    return replay.status != 409;
  }));
  EXPECT_EQ(replay.status, 200u) << replay.error;
  EXPECT_TRUE(replay.replayed());
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

INSTANTIATE_TEST_SUITE_P(Stores, ProxyStoreTest, ::testing::ValuesIn(stores()),
                         [](const ::testing::TestParamInfo<StoreCase>& info) {
                           return info.param.name;
                         });

// ---------------------------------------------------------------------------------------
// Concurrency, on SQLite.

TEST_F(ProxyTest, FiftyConcurrentClientsWithOneKeyRunItOnceAndTheOthersGet409) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  constexpr int kClients = 50;
  std::vector<Reply> replies(kClients);
  std::atomic<int> answered{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      replies[static_cast<std::size_t>(i)] =
          request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}, {"X-Test-Gate", k}});
      ++answered;
    });
  }
  // Every client but the one whose request holds the key is answered while the gate is shut.
  ASSERT_TRUE(eventually([&] { return answered.load() == kClients - 1; }));
  upstream_.open_gate(k);
  for (auto& t : clients) t.join();

  int ok = 0, conflicts = 0;
  for (const Reply& r : replies) {
    if (r.status == 200) {
      ++ok;
      EXPECT_FALSE(r.replayed());
    } else {
      EXPECT_EQ(r.status, 409u) << r.error << r.body;
      EXPECT_TRUE(r.header("Retry-After").has_value());
      ++conflicts;
    }
  }
  EXPECT_EQ(ok, 1);
  EXPECT_EQ(conflicts, kClients - 1);
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

TEST_F(ProxyTest, FiftyConcurrentClientsWithWaitAllGetTheRecordedAnswer) {
  auto proxy = start_proxy({"--wait", "60s"});
  const std::string k = key("k");
  constexpr int kClients = 50;
  std::vector<Reply> replies(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      replies[static_cast<std::size_t>(i)] =
          request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}, {"X-Test-Gate", k}});
    });
  }
  ASSERT_TRUE(upstream_.wait_for(k, 1));
  // Clients that arrive after the gate opens get a plain replay; the answers are the same
  // either way, so opening it early only makes the test weaker, never wrong.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  upstream_.open_gate(k);
  for (auto& t : clients) t.join();

  int originals = 0;
  for (const Reply& r : replies) {
    EXPECT_EQ(r.status, 200u) << r.error << r.body;
    EXPECT_EQ(r.body, replies[0].body);
    originals += r.replayed() ? 0 : 1;
  }
  EXPECT_EQ(originals, 1);
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

// ---------------------------------------------------------------------------------------
// What is recorded and replayed.

TEST_F(ProxyTest, ReplayOfABinaryBodyIsByteExactThroughCurl) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  std::vector<std::string> args = {"-X",
                                   "POST",
                                   "-H",
                                   "Idempotency-Key: \"" + k + "\"",
                                   "-H",
                                   "X-Test-Body-Size: 300000",
                                   "--data-binary",
                                   "payload",
                                   "-H",
                                   "Host: 127.0.0.1"};
  Reply first = curl(dir_.path(), proxy->url() + "/blob", args);
  ASSERT_EQ(first.status, 200u) << first.error;
  EXPECT_EQ(first.body, binary_body(300000));

  Reply replay = curl(dir_.path(), proxy->url() + "/blob", args);
  ASSERT_EQ(replay.status, 200u) << replay.error;
  EXPECT_TRUE(replay.replayed());
  EXPECT_EQ(replay.body.size(), first.body.size());
  EXPECT_TRUE(replay.body == first.body) << "the replayed body differs";
  EXPECT_EQ(replay.header("Content-Type"), std::string("application/octet-stream"));
  // The structured-field string's quotes are not part of the key.
  EXPECT_TRUE(record("POST /blob", k).has_value());
  EXPECT_EQ(upstream_.executions_of("\"" + k + "\""), 1);
}

TEST_F(ProxyTest, HopByHopHeadersAreNeitherPassedOnNorReplayed) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  Headers headers = {{"Idempotency-Key", k}, {"X-Test-Hop", "1"}};
  Reply first = request(proxy->port(), "POST", "/hop", headers);
  Reply replay = request(proxy->port(), "POST", "/hop", headers);
  for (const Reply* r : {&first, &replay}) {
    EXPECT_EQ(r->status, 200u) << r->error;
    EXPECT_EQ(r->header("X-End-To-End"), std::string("kept"));
    EXPECT_FALSE(r->header("X-Hop-Secret").has_value());
    EXPECT_FALSE(r->header("Keep-Alive").has_value());
  }
  EXPECT_TRUE(replay.replayed());
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

TEST_F(ProxyTest, ChunkedUpstreamAnswerIsRecordedAndReplayed) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  Headers headers = {{"Idempotency-Key", k}, {"X-Test-Chunked", "1"}};
  Reply first = request(proxy->port(), "POST", "/chunks", headers);
  ASSERT_EQ(first.status, 200u) << first.error;
  EXPECT_THAT(first.body, HasSubstr("execution="));
  Reply replay = request(proxy->port(), "POST", "/chunks", headers);
  EXPECT_TRUE(replay.replayed());
  EXPECT_EQ(replay.body, first.body);
  EXPECT_FALSE(replay.header("Transfer-Encoding").has_value());
  EXPECT_EQ(replay.header("Content-Length"), std::to_string(first.body.size()));
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

TEST_F(ProxyTest, AnswerLargerThanTheRecordLimitIsRecordedAsAMarkerAndNeverRunsAgain) {
  auto proxy = start_proxy({"--max-record", "64KiB"});
  const std::string k = key("k");
  Headers headers = {{"Idempotency-Key", k}, {"X-Test-Body-Size", "200000"}};
  Reply first = request(proxy->port(), "POST", "/big", headers);
  ASSERT_EQ(first.status, 200u) << first.error;
  EXPECT_EQ(first.body, binary_body(200000));
  EXPECT_EQ(first.header("Idempotency-Not-Recorded"), std::string("too-large"));
  std::optional<Record> stored = record("POST /big", k);
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->state, RecordState::kComplete);
  EXPECT_LT(stored->payload.size(), 1024u);

  // SPEC §13: the request ran; a duplicate is told so, and the upstream never sees it again.
  Reply again = request(proxy->port(), "POST", "/big", headers);
  EXPECT_EQ(again.status, 410u) << again.error;
  EXPECT_THAT(again.header("Content-Type"), Optional(std::string(kProblemJson)));
  EXPECT_THAT(again.body,
              AllOf(HasSubstr("\"code\":\"too-large-to-replay\""),
                    HasSubstr("\"recorded_status\":200"), HasSubstr("\"recorded_size\":200000")));
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

TEST_F(ProxyTest, AnswerOverTheResponseLimitRanAndIsNeverRunAgain) {
  auto proxy = start_proxy({"--max-response-body", "100KiB"});
  const std::string k = key("k");
  Headers headers = {{"Idempotency-Key", k}, {"X-Test-Body-Size", "300000"}};
  Reply first = request(proxy->port(), "POST", "/big", headers);
  EXPECT_EQ(first.status, 502u) << first.error;
  EXPECT_THAT(first.body, HasSubstr("\"code\":\"upstream-too-large\""));
  Reply again = request(proxy->port(), "POST", "/big", headers);
  EXPECT_EQ(again.status, 410u) << again.error << again.body;
  EXPECT_THAT(again.body, HasSubstr("\"code\":\"too-large-to-replay\""));
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

TEST_F(ProxyTest, TooManyRequestsAndRequestTimeoutReleaseTheKeyByDefault) {
  auto proxy = start_proxy();
  for (const char* status : {"429", "408"}) {
    const std::string k = key(status);
    Reply refused =
        request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}, {"X-Test-Status", status}});
    EXPECT_EQ(refused.status, static_cast<unsigned>(std::stoi(status))) << refused.error;
    EXPECT_FALSE(record("POST /pay", k).has_value()) << status;
    // A client that honours Retry-After gets through: the retry runs.
    Reply retry = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}});
    EXPECT_EQ(retry.status, 200u) << status;
    EXPECT_FALSE(retry.replayed());
    EXPECT_EQ(upstream_.executions_of(k), 2) << status;
  }
}

TEST_F(ProxyTest, ReleaseStatusesCanBeNarrowedSoA429IsRecorded) {
  auto proxy = start_proxy({"--release-status", "5xx"});
  const std::string k = key("k");
  Headers headers = {{"Idempotency-Key", k}, {"X-Test-Status", "429"}};
  EXPECT_EQ(request(proxy->port(), "POST", "/pay", headers).status, 429u);
  Reply replay = request(proxy->port(), "POST", "/pay", headers);
  EXPECT_EQ(replay.status, 429u);
  EXPECT_TRUE(replay.replayed());
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

// ---------------------------------------------------------------------------------------
// An outcome the proxy cannot know never releases the key (SPEC §13).

TEST_F(ProxyTest, UpstreamTimeoutKeepsTheKeyHeldAndRecordsTheLateAnswer) {
  auto proxy = start_proxy({"--upstream-timeout", "300ms"});
  const std::string k = key("k");
  Reply slow = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}, {"X-Test-Gate", k}});
  EXPECT_EQ(slow.status, 504u) << slow.error;
  EXPECT_THAT(slow.body, HasSubstr("\"code\":\"upstream-timeout\""));
  EXPECT_TRUE(in_progress("POST /pay", k));

  // A prompt retry does not reach the upstream while the first may still be running.
  Reply retry = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}});
  EXPECT_EQ(retry.status, 409u) << retry.error << retry.body;
  EXPECT_TRUE(retry.header("Retry-After").has_value());
  EXPECT_EQ(upstream_.executions_of(k), 1);

  // The answer comes late: the proxy was still reading, and records it.
  upstream_.open_gate(k);
  ASSERT_TRUE(eventually([&] {
    std::optional<Record> r = record("POST /pay", k);
    return r && r->state == RecordState::kComplete;
  }));
  Reply replay = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}});
  EXPECT_EQ(replay.status, 200u) << replay.error;
  EXPECT_TRUE(replay.replayed());
  EXPECT_THAT(replay.body, AllOf(HasSubstr("attempt=1 "), HasSubstr("stolen=false ")));
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

TEST_F(ProxyTest, UpstreamTimeoutWithoutALateAnswerIsTakenOverAfterTheLeaseAsAStolenAttempt) {
  auto proxy =
      start_proxy({"--upstream-timeout", "200ms", "--late-answer", "200ms", "--lease", "1s"});
  const std::string k = key("k");
  Reply slow = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}, {"X-Test-Gate", k}});
  EXPECT_EQ(slow.status, 504u) << slow.error;
  EXPECT_EQ(request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}}).status, 409u);

  Reply takeover = retry_while_busy(proxy->port(), {{"Idempotency-Key", k}});
  EXPECT_EQ(takeover.status, 200u) << takeover.error << takeover.body;
  EXPECT_THAT(takeover.body, AllOf(HasSubstr("attempt=2 "), HasSubstr("stolen=true ")));
  EXPECT_EQ(upstream_.executions_of(k), 2);
  upstream_.open_gate(k);
}

TEST_F(ProxyTest, UpstreamClosingMidAnswerKeepsTheKeyHeldUntilTheLeaseRunsOut) {
  auto proxy = start_proxy({"--lease", "1s"});
  // Dropped before a byte of the answer: the client gets 502. Cut off midway: the answer
  // was already streaming, and the client sees it cut off.
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"X-Test-Drop", "1"}, {"X-Test-Cut", "100000"}}) {
    const std::string k = key(name);
    Reply cut = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}, {name, value}});
    if (name == "X-Test-Drop") {
      EXPECT_EQ(cut.status, 502u) << name << cut.error;
      EXPECT_THAT(cut.body, HasSubstr("\"code\":\"upstream-broken\""));
    } else {
      EXPECT_THAT(cut.error, HasSubstr("partial message"));
    }
    EXPECT_TRUE(in_progress("POST /pay", k)) << name;
    EXPECT_EQ(request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}}).status, 409u);
    Reply takeover = retry_while_busy(proxy->port(), {{"Idempotency-Key", k}});
    EXPECT_EQ(takeover.status, 200u) << name << takeover.error;
    EXPECT_THAT(takeover.body, AllOf(HasSubstr("attempt=2 "), HasSubstr("stolen=true ")));
    EXPECT_EQ(upstream_.executions_of(k), 2) << name;
  }
}

TEST_F(ProxyTest, UpstreamKilledMidRequestKeepsTheKeyHeld) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  Reply first;
  std::thread client = send_gated(proxy->port(), k, first);
  upstream_.kill();
  client.join();
  EXPECT_EQ(first.status, 502u) << first.error;
  EXPECT_THAT(first.body, HasSubstr("\"code\":\"upstream-broken\""));
  EXPECT_TRUE(in_progress("POST /pay", k));
  upstream_.restart();
  Reply retry = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}});
  EXPECT_EQ(retry.status, 409u) << retry.error << retry.body;
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

TEST_F(ProxyTest, UpstreamDownAnswers502AndReleasesBecauseNothingRan) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  upstream_.kill();
  Reply down = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}});
  EXPECT_EQ(down.status, 502u) << down.error;
  EXPECT_THAT(down.body, HasSubstr("\"code\":\"upstream-unreachable\""));
  EXPECT_FALSE(record("POST /pay", k).has_value());
  upstream_.restart();
  Reply retry = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}});
  EXPECT_EQ(retry.status, 200u) << retry.error;
  EXPECT_THAT(retry.body, AllOf(HasSubstr("attempt=1 "), HasSubstr("stolen=false ")));
}

TEST_F(ProxyTest, ReleaseUncertainRestoresReleasingOnATimeout) {
  auto proxy = start_proxy({"--upstream-timeout", "300ms", "--release-uncertain"});
  const std::string k = key("k");
  Reply slow = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}, {"X-Test-Gate", k}});
  EXPECT_EQ(slow.status, 504u) << slow.error;
  EXPECT_FALSE(record("POST /pay", k).has_value());
  upstream_.open_gate(k);
  Reply retry = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}});
  EXPECT_EQ(retry.status, 200u) << retry.error;
  EXPECT_EQ(upstream_.executions_of(k), 2);
}

TEST_F(ProxyTest, LeaseLostWhileTheUpstreamWorksIsAnsweredUnrecorded) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  Reply first;
  std::thread client = send_gated(proxy->port(), k, first);
  // An operator forgets the record while the upstream works: the proxy's lease is gone.
  ASSERT_TRUE(open_store(store_url())->forget(hosted("POST /pay"), k));
  upstream_.open_gate(k);
  client.join();
  EXPECT_EQ(first.status, 200u) << first.error;
  EXPECT_EQ(first.header("Idempotency-Not-Recorded"), std::string("lease-lost"));
  EXPECT_FALSE(record("POST /pay", k).has_value());
}

TEST_F(ProxyTest, AProxyThatDiedLeavesItsKeyToBeTakenOverWithAStolenAttempt) {
  auto doomed = start_proxy({"--lease", "1s"}, "doomed");
  auto survivor = start_proxy({"--wait", "60s"}, "survivor");
  const std::string k = key("k");
  Reply lost;
  std::thread client = send_gated(doomed->port(), k, lost);
  doomed->signal(SIGKILL);
  client.join();
  EXPECT_NE(lost.error, "");  // the client saw its connection die

  // The retry waits out the dead proxy's lease, then takes the key over.
  Reply retry = request(survivor->port(), "POST", "/pay", {{"Idempotency-Key", k}});
  EXPECT_EQ(retry.status, 200u) << retry.error;
  EXPECT_THAT(retry.body, AllOf(HasSubstr("attempt=2 "), HasSubstr("stolen=true ")));
  std::optional<Record> stored = record("POST /pay", k);
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->state, RecordState::kComplete);
  EXPECT_THAT(retry.body, HasSubstr("token=" + std::to_string(stored->token) + " "));
  EXPECT_EQ(upstream_.executions_of(k), 2);
  upstream_.open_gate(k);
}

// ---------------------------------------------------------------------------------------
// Refusals.

TEST_F(ProxyTest, SameKeyWithADifferentBodyIs422) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  Reply first = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}}, "amount=10");
  ASSERT_EQ(first.status, 200u);
  Reply changed = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}}, "amount=99");
  EXPECT_EQ(changed.status, 422u);
  EXPECT_THAT(changed.header("Content-Type"), Optional(std::string(kProblemJson)));
  EXPECT_THAT(changed.body, HasSubstr("\"code\":\"key-reuse\""));
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

TEST_F(ProxyTest, MalformedKeysAre400) {
  auto proxy = start_proxy();
  Client client(proxy->port());
  const std::vector<Headers> bad = {
      {{"Idempotency-Key", "\"\""}},
      {{"Idempotency-Key", std::string(1025, 'k')}},
      {{"Idempotency-Key", "\"unterminated"}},
      {{"Idempotency-Key", "\"a\" junk"}},
      {{"Idempotency-Key", "\"bad\\escape\""}},
      {{"Idempotency-Key", "one"}, {"Idempotency-Key", "two"}},
  };
  for (const Headers& headers : bad) {
    Reply r = client.send("POST", "/pay", headers);
    EXPECT_EQ(r.status, 400u) << headers.back().second;
    EXPECT_THAT(r.body, HasSubstr("\"code\":\"bad-key\""));
  }
  // A key of exactly 1024 bytes is fine.
  Reply longest = client.send("POST", "/pay", {{"Idempotency-Key", std::string(1024, 'k')}});
  EXPECT_EQ(longest.status, 200u);
  EXPECT_EQ(upstream_.executions().size(), 1u);
}

TEST_F(ProxyTest, MissingKeyPassesThroughUnlessRequired) {
  auto open = start_proxy({}, "open");
  EXPECT_EQ(request(open->port(), "POST", "/pay").status, 200u);
  EXPECT_EQ(request(open->port(), "POST", "/pay").status, 200u);
  EXPECT_EQ(upstream_.executions().size(), 2u);

  auto strict = start_proxy({"--require-key"}, "strict");
  Reply refused = request(strict->port(), "POST", "/pay");
  EXPECT_EQ(refused.status, 400u);
  EXPECT_THAT(refused.body, HasSubstr("\"code\":\"missing-key\""));
  EXPECT_EQ(request(strict->port(), "GET", "/pay").status, 200u);
  EXPECT_EQ(upstream_.executions().size(), 3u);
}

TEST_F(ProxyTest, OtherMethodsPassThroughEvenWithAKey) {
  auto proxy = start_proxy({"--methods", "post"});
  const std::string k = key("k");
  for (const char* method : {"GET", "PUT", "PATCH", "PATCH"}) {
    Reply r = request(proxy->port(), method, "/thing", {{"Idempotency-Key", k}}, "x");
    EXPECT_EQ(r.status, 200u) << method;
    EXPECT_FALSE(r.replayed());
  }
  EXPECT_EQ(upstream_.executions_of(k), 4);
}

TEST_F(ProxyTest, RequestBodyOverTheLimitIs413) {
  auto proxy = start_proxy({"--max-request-body", "1KiB"});
  Reply r = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", key("k")}},
                    std::string(4096, 'x'));
  EXPECT_EQ(r.status, 413u) << r.error;
  EXPECT_TRUE(upstream_.executions().empty());
}

// An SQLite write lock held by another connection: the store cannot be written within its
// busy timeout, which the proxy must treat as the store being unavailable.
class SqliteWriteLock {
 public:
  explicit SqliteWriteLock(const std::string& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK ||
        sqlite3_exec(db_, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr) != SQLITE_OK) {
      throw std::runtime_error(std::string("cannot lock ") + path + ": " + sqlite3_errmsg(db_));
    }
  }
  ~SqliteWriteLock() {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close(db_);
  }

 private:
  sqlite3* db_ = nullptr;
};

class ProxyStoreDownTest : public ProxyTest {
 protected:
  std::string store_url() override {
    return "sqlite://" + (dir_ / "idem.db").string() + "?busy_timeout=100";
  }
};

TEST_F(ProxyStoreDownTest, StoreDownAnswers503WithoutCallingTheUpstream) {
  auto proxy = start_proxy();
  ASSERT_EQ(request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", key("warm")}}).status,
            200u);
  {
    SqliteWriteLock lock((dir_ / "idem.db").string());
    const std::string k = key("k");
    Reply r = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}});
    EXPECT_EQ(r.status, 503u) << r.error << r.body;
    EXPECT_THAT(r.body, HasSubstr("\"code\":\"store-unavailable\""));
    EXPECT_TRUE(r.header("Retry-After").has_value());
    EXPECT_EQ(upstream_.executions_of(k), 0);
    // Requests that need no store still pass.
    EXPECT_EQ(request(proxy->port(), "GET", "/health").status, 200u);
  }
  Reply after = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", key("k")}});
  EXPECT_EQ(after.status, 200u);
}

// ---------------------------------------------------------------------------------------
// Identity.

TEST_F(ProxyTest, CredentialsKeepClientsApart) {
  auto proxy = start_proxy({"--credential-cookie", "session"});
  const std::string k = key("k");
  auto as = [&](const Headers& who) {
    Headers h = who;
    h.emplace_back("Idempotency-Key", k);
    return request(proxy->port(), "POST", "/pay", h);
  };
  Reply alice = as({{"Authorization", "Bearer alice"}});
  Reply bob = as({{"Authorization", "Bearer bob"}});
  Reply cookie_c = as({{"Cookie", "theme=dark; session=carol"}});
  Reply anonymous = as({});
  for (const Reply* r : {&alice, &bob, &cookie_c, &anonymous}) {
    EXPECT_EQ(r->status, 200u);
    EXPECT_FALSE(r->replayed());
  }
  EXPECT_EQ(upstream_.executions_of(k), 4);
  EXPECT_TRUE(as({{"Authorization", "Bearer alice"}}).replayed());
  // The same session cookie is the same caller, whatever else the Cookie header holds.
  EXPECT_TRUE(as({{"Cookie", "session=carol; theme=light"}}).replayed());
  EXPECT_EQ(upstream_.executions_of(k), 4);
}

// ---------------------------------------------------------------------------------------
// Safe by default.

TEST_F(ProxyTest, RequestTrailersNeverBecomeHeaders) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  const std::string chunked =
      "POST /pay HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
      "X-Test-Echo: 1\r\nTrailer: Idempotency-Key, Authorization, Host\r\nConnection: close\r\n"
      "\r\n5\r\nhello\r\n0\r\nIdempotency-Key: " +
      k + "\r\nAuthorization: Bearer smuggled\r\nHost: evil.example\r\n\r\n";
  for (int i = 1; i <= 2; ++i) {
    Reply r = raw_request(proxy->port(), chunked);
    ASSERT_EQ(r.status, 200u) << r.error << r.body;
    EXPECT_FALSE(r.replayed());
    EXPECT_THAT(r.body, HasSubstr("body=5"));
    EXPECT_THAT(r.body, AllOf(Not(HasSubstr("smuggled")), Not(HasSubstr("evil.example")),
                              Not(HasSubstr(k))));
  }
  // The key in the trailer was no key: both ran, as requests without one.
  EXPECT_EQ(upstream_.executions_of(k), 0);
  EXPECT_EQ(upstream_.executions().size(), 2u);
  EXPECT_FALSE(record("POST /pay", k).has_value());
}

TEST_F(ProxyTest, TwoHostLinesAre400) {
  auto proxy = start_proxy();
  Reply r = request(proxy->port(), "POST", "/pay",
                    {{"Host", "a.example"}, {"Host", "b.example"}, {"Idempotency-Key", key("k")}});
  EXPECT_EQ(r.status, 400u) << r.error << r.body;
  EXPECT_THAT(r.body, HasSubstr("\"code\":\"bad-request\""));
  EXPECT_TRUE(upstream_.executions().empty());
}

TEST_F(ProxyTest, VirtualHostsNeverShareRecords) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  auto as = [&](const std::string& host) {
    return request(proxy->port(), "POST", "/pay", {{"Host", host}, {"Idempotency-Key", k}});
  };
  Reply a = as("a.example"), b = as("B.example");
  EXPECT_FALSE(a.replayed());
  EXPECT_FALSE(b.replayed());
  EXPECT_NE(a.header("X-Execution"), b.header("X-Execution"));
  EXPECT_EQ(upstream_.executions_of(k), 2);
  // Each host gets its own answer back; a host name's case does not matter.
  Reply a_again = as("A.EXAMPLE");
  EXPECT_TRUE(a_again.replayed());
  EXPECT_EQ(a_again.header("X-Execution"), a.header("X-Execution"));
  EXPECT_EQ(as("b.example").header("X-Execution"), b.header("X-Execution"));
  EXPECT_TRUE(record("POST /pay", k, "a.example").has_value());
  EXPECT_EQ(upstream_.executions_of(k), 2);
}

TEST_F(ProxyTest, AnAnswerThatSetsACookieIsNeverReplayedToARequestWithoutCredentials) {
  auto proxy = start_proxy({}, "plain");
  const std::string k = key("k");
  Reply alice = request(proxy->port(), "POST", "/login",
                        {{"Idempotency-Key", k},
                         {"Cookie", "session=alice"},
                         {"X-Test-Set-Cookie", "session=alice-2"}});
  ASSERT_EQ(alice.status, 200u) << alice.error;
  EXPECT_EQ(alice.header("Set-Cookie"), std::string("session=alice-2"));
  // Bob sends the same key with his own session: he must not get Alice's.
  Reply bob = request(proxy->port(), "POST", "/login",
                      {{"Idempotency-Key", k},
                       {"Cookie", "session=bob"},
                       {"X-Test-Set-Cookie", "session=alice-2"}});
  EXPECT_EQ(bob.status, 410u) << bob.error << bob.body;
  EXPECT_THAT(bob.body, HasSubstr("\"code\":\"cookie-not-replayed\""));
  EXPECT_FALSE(bob.header("Set-Cookie").has_value());
  EXPECT_EQ(upstream_.executions_of(k), 1);
  EXPECT_TRUE(proxy->logged("--credential-cookie"));

  // Named, the session cookie is a credential: each session gets its own answer.
  auto named = start_proxy({"--credential-cookie", "session"}, "named");
  const std::string k2 = key("k2");
  auto login = [&](const std::string& who) {
    return request(named->port(), "POST", "/login",
                   {{"Idempotency-Key", k2},
                    {"Cookie", "session=" + who},
                    {"X-Test-Set-Cookie", "session=" + who + "-2"}});
  };
  EXPECT_FALSE(login("alice").replayed());
  Reply again = login("alice");
  EXPECT_TRUE(again.replayed());
  EXPECT_EQ(again.header("Set-Cookie"), std::string("session=alice-2"));
  Reply other = login("bob");
  EXPECT_FALSE(other.replayed());
  EXPECT_EQ(other.header("Set-Cookie"), std::string("session=bob-2"));
}

TEST_F(ProxyStoreDownTest, ProblemAnswersShowNoInternalsButARequestIdTheLogExplains) {
  auto proxy = start_proxy();
  ASSERT_EQ(request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", key("warm")}}).status,
            200u);
  SqliteWriteLock lock((dir_ / "idem.db").string());
  Reply r = request(proxy->port(), "POST", "/pay",
                    {{"Idempotency-Key", key("k")},
                     {"Authorization", "Bearer secret-token"},
                     {"X-Request-Id", "req-7f3a"}});
  EXPECT_EQ(r.status, 503u) << r.error << r.body;
  for (const std::string& internal :
       {dir_.path().string(), std::string("sqlite"), std::string("idem.db"), std::string("c:"),
        std::string("secret-token")}) {
    EXPECT_THAT(r.body, Not(HasSubstr(internal)));
  }
  EXPECT_THAT(r.body, HasSubstr("\"request_id\":\"req-7f3a\""));
  EXPECT_EQ(r.header("X-Request-Id"), std::string("req-7f3a"));
  EXPECT_TRUE(r.header("Date").has_value());
  // The operator finds the cause under the same id.
  EXPECT_TRUE(eventually([&] { return proxy->logged("level=error"); }));
  std::string log = proxy->log();
  std::string line = log.substr(0, log.find("request_id=req-7f3a"));
  line = line.substr(line.rfind('\n') + 1);
  EXPECT_THAT(line, AllOf(HasSubstr("level=error"), HasSubstr("idem.db")));
}

// ---------------------------------------------------------------------------------------
// Streaming.

// A GET (or keyed POST) of `target` whose answer idem_test_upstream streams in `chunks`
// chunks, each after the gate "<gate>-<n>" opens.
std::string streamed_request(const std::string& method, const std::string& target, int chunks,
                             const std::string& gate, const std::string& more_headers = {}) {
  return method + " " + target +
         " HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Test-Stream: " + std::to_string(chunks) +
         "\r\nX-Test-Stream-Gate: " + gate + "\r\n" + more_headers +
         (method == "POST" ? "Content-Length: 0\r\n" : "") + "\r\n";
}

TEST_F(ProxyTest, AnswerWithoutAKeyStreamsToTheClientAsItArrives) {
  auto proxy = start_proxy();
  const std::string gate = key("g");
  RawConnection client(proxy->port());
  client.send(streamed_request("GET", "/events", 3, gate, "X-Test-Sse: 1\r\n"));
  // The first event arrives while the upstream still waits on the gate for the second.
  ASSERT_TRUE(client.read_until("data: chunk 1", std::chrono::seconds(10))) << client.received();
  EXPECT_THAT(client.received(), AllOf(HasSubstr("Content-Type: text/event-stream"),
                                       HasSubstr("Transfer-Encoding: chunked")));
  EXPECT_THAT(client.received(), Not(HasSubstr("chunk 2")));
  upstream_.open_gate(gate + "-2");
  EXPECT_TRUE(client.read_until("data: chunk 2")) << client.received();
  upstream_.open_gate(gate + "-3");
  EXPECT_TRUE(client.read_until("data: chunk 3")) << client.received();
  EXPECT_TRUE(client.read_until("\r\n0\r\n\r\n")) << client.received();
}

TEST_F(ProxyTest, HeadBodilessAnswersAndHttp10ClientsKeepTheirFraming) {
  auto proxy = start_proxy();
  Client client(proxy->port());
  Reply head = client.send("HEAD", "/blob", {{"X-Test-Body-Size", "1000"}});
  EXPECT_EQ(head.status, 200u) << head.error;
  EXPECT_EQ(head.header("Content-Length"), std::string("1000"));
  EXPECT_TRUE(head.body.empty());
  Reply none = client.send("DELETE", "/thing", {{"X-Test-Status", "204"}});
  EXPECT_EQ(none.status, 204u) << none.error;
  EXPECT_FALSE(none.header("Content-Length").has_value());
  EXPECT_FALSE(none.header("Transfer-Encoding").has_value());
  const std::string k = key("k");
  EXPECT_EQ(
      client.send("POST", "/thing", {{"Idempotency-Key", k}, {"X-Test-Status", "204"}}).status,
      204u);
  Reply replay = client.send("POST", "/thing", {{"Idempotency-Key", k}});
  EXPECT_EQ(replay.status, 204u);
  EXPECT_TRUE(replay.replayed());
  EXPECT_FALSE(client.closed());
  EXPECT_EQ(client.send("GET", "/after").status, 200u);
  // An HTTP/1.0 client cannot read chunks: an answer of unknown length ends with the
  // connection.
  RawConnection old(proxy->port());
  old.send("GET /chunks HTTP/1.0\r\nX-Test-Chunked: 1\r\n\r\n");
  EXPECT_FALSE(old.read_until("never", std::chrono::seconds(10)));  // it closes
  EXPECT_EQ(old.received().rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << old.received();
  EXPECT_THAT(old.received(), AllOf(Not(HasSubstr("Transfer-Encoding")), HasSubstr("execution=")));
}

TEST_F(ProxyTest, KeyedAnswerStreamsWhileItIsRecordedAndEndsOnceItIsRecorded) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  RawConnection client(proxy->port());
  client.send(streamed_request("POST", "/report", 3, k, "Idempotency-Key: " + k + "\r\n"));
  ASSERT_TRUE(client.read_until("chunk 1\n", std::chrono::seconds(10))) << client.received();
  // Streaming, and not recorded yet: a duplicate now is in progress.
  EXPECT_TRUE(in_progress("POST /report", k));
  upstream_.open_gate(k + "-2");
  upstream_.open_gate(k + "-3");
  ASSERT_TRUE(client.read_until("\r\n0\r\n\r\n")) << client.received();
  // The end of the answer came after the record: a client that saw it finds it.
  std::optional<Record> stored = record("POST /report", k);
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->state, RecordState::kComplete);
  Reply replay = request(proxy->port(), "POST", "/report", {{"Idempotency-Key", k}});
  EXPECT_TRUE(replay.replayed());
  EXPECT_EQ(replay.body, "chunk 1\nchunk 2\nchunk 3\n");
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

TEST_F(ProxyTest, LongAnswerIsNotCutOffWhileItsPiecesKeepComing) {
  auto proxy = start_proxy({"--upstream-timeout", "1s"});
  const std::string gate = key("g");
  constexpr int kChunks = 6;
  RawConnection client(proxy->port());
  client.send(streamed_request("GET", "/long", kChunks, gate));
  ASSERT_TRUE(client.read_until("chunk 1\n", std::chrono::seconds(10))) << client.received();
  // Each piece comes well within the upstream timeout; the whole takes longer than it.
  for (int i = 2; i <= kChunks; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    upstream_.open_gate(gate + "-" + std::to_string(i));
    ASSERT_TRUE(client.read_until("chunk " + std::to_string(i) + "\n")) << client.received();
  }
  EXPECT_TRUE(client.read_until("\r\n0\r\n\r\n")) << client.received();
  EXPECT_THAT(client.received(), Not(HasSubstr("upstream-timeout")));
}

TEST_F(ProxyTest, RequestBodyWithoutAKeyStreamsToTheUpstreamAsItArrives) {
  auto proxy = start_proxy({"--max-request-body", "1KiB"});
  RawConnection client(proxy->port());
  client.send(
      "POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
      "X-Test-Announce: 1\r\n\r\n400\r\n" +
      std::string(1024, 'a') + "\r\n");
  // The upstream has the header while the client has sent only part of the body.
  EXPECT_TRUE(eventually([&] { return upstream_.announced().find("/upload") != std::string::npos; },
                         std::chrono::seconds(10)));
  // The rest, well past --max-request-body (a limit for keyed requests only, which are read
  // whole).
  std::string rest;
  for (int i = 0; i < 99; ++i) rest += "400\r\n" + std::string(1024, 'b') + "\r\n";
  client.send(rest + "0\r\n\r\n");
  EXPECT_TRUE(client.read_until("body=102400")) << client.received();
}

TEST_F(ProxyTest, TimeToFirstByteThroughTheProxyAgainstDirect) {
  // A figure, not an assertion (docs/proxy.md, "Figures"): how soon the first chunk of a
  // streamed answer reaches the client, directly and through the proxy, while the upstream
  // holds the rest back. Each path runs its rounds on one kept-alive connection, so neither
  // pays for connecting.
  auto proxy = start_proxy();
  constexpr int kRounds = 40;
  auto first_byte_ms = [&](std::uint16_t port, const std::string& name) {
    std::vector<double> ms;
    RawConnection client(port);
    for (int i = 0; i < kRounds; ++i) {
      const std::string gate = key(name + std::to_string(i));
      client.forget();
      const auto sent = std::chrono::steady_clock::now();
      client.send(streamed_request("GET", "/ttfb", 2, gate));
      if (!client.read_until("chunk 1\n", std::chrono::seconds(10))) {
        ADD_FAILURE() << "the first chunk did not come through " << name;
        upstream_.open_gate(gate + "-2");
        return std::make_pair(0.0, 0.0);
      }
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - sent)
              .count());
      upstream_.open_gate(gate + "-2");
      EXPECT_TRUE(client.read_until("\r\n0\r\n\r\n"));
    }
    std::sort(ms.begin(), ms.end());
    return std::make_pair(ms[ms.size() / 2], ms[ms.size() * 9 / 10]);
  };
  const auto direct = first_byte_ms(upstream_.port(), "direct");
  const auto proxied = first_byte_ms(proxy->port(), "proxied");
  std::cout << "[ figure ] time to first byte of a streamed answer, " << kRounds
            << " rounds on a kept-alive connection: direct p50 " << direct.first << " ms p90 "
            << direct.second << " ms; through idem proxy p50 " << proxied.first << " ms p90 "
            << proxied.second << " ms (p50 ratio " << proxied.first / direct.first << ")\n";
}

// ---------------------------------------------------------------------------------------
// Routes, key header, environment.

constexpr const char* kUuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";

TEST_F(ProxyTest, RoutesFileSetsThePolicyOfEachPath) {
  const fs::path routes = dir_ / "routes.json";
  std::ofstream(routes) << R"({"routes": [
    {"path": "/payments/**", "methods": ["POST"], "require_key": true, "key_format": "uuid",
     "ttl": "1h"},
    {"path": "/uploads/*", "protect": false},
    {"path": "/reports", "release_status": "none", "scope": "reports"}
  ]})";
  auto proxy = start_proxy({"--routes", routes.string()});
  auto post = [&](const std::string& target, const Headers& headers) {
    return request(proxy->port(), "POST", target, headers);
  };
  // /payments/**: a key is required, and must be a UUID.
  EXPECT_THAT(post("/payments/eu/charge", {}).body, HasSubstr("\"code\":\"missing-key\""));
  EXPECT_THAT(post("/payments/eu/charge", {{"Idempotency-Key", "order-7"}}).body,
              HasSubstr("\"code\":\"bad-key\""));
  const std::string uuid = kUuid;
  EXPECT_FALSE(post("/payments/eu/charge", {{"Idempotency-Key", uuid}}).replayed());
  EXPECT_TRUE(post("/payments/eu/charge", {{"Idempotency-Key", uuid}}).replayed());
  EXPECT_EQ(upstream_.executions_of(uuid), 1);
  // /uploads/*: not protected at all, key or not.
  const std::string upload = key("upload");
  EXPECT_FALSE(post("/uploads/a", {{"Idempotency-Key", upload}}).replayed());
  EXPECT_FALSE(post("/uploads/a", {{"Idempotency-Key", upload}}).replayed());
  EXPECT_EQ(upstream_.executions_of(upload), 2);
  // Elsewhere, the flags' policy: no key needed.
  EXPECT_EQ(post("/elsewhere", {}).status, 200u);
  // /reports: every status is recorded (none released), under its own scope.
  const std::string report = key("report");
  EXPECT_EQ(post("/reports", {{"Idempotency-Key", report}, {"X-Test-Status", "503"}}).status, 503u);
  Reply again = post("/reports", {{"Idempotency-Key", report}});
  EXPECT_EQ(again.status, 503u);
  EXPECT_TRUE(again.replayed());
  EXPECT_TRUE(open_store(store_url())->get(hosted("reports"), report).has_value());
  EXPECT_EQ(upstream_.executions_of(report), 1);
}

TEST_F(ProxyTest, ARoutesFileWithAnUnknownFieldIsRefusedNamingIt) {
  const fs::path routes = dir_ / "routes.json";
  std::ofstream(routes) << R"({"routes": [{"path": "/pay", "requires_key": true}]})";
  const int status = run({IDEM_BINARY, "proxy", "--listen", "127.0.0.1:0", "--upstream",
                          upstream_.url(), "--store", store_url(), "--routes", routes.string()},
                         dir_ / "bad.out", dir_ / "bad.err");
  EXPECT_EQ(status, 64);
  EXPECT_THAT(read_file(dir_ / "bad.err"),
              AllOf(HasSubstr("--routes"), HasSubstr("route 1"), HasSubstr("\"requires_key\"")));
}

TEST_F(ProxyTest, KeyHeaderNameIsConfigurable) {
  auto proxy = start_proxy({"--key-header", "X-Idempotency-Key"});
  const std::string k = key("k");
  EXPECT_FALSE(request(proxy->port(), "POST", "/pay", {{"X-Idempotency-Key", k}}).replayed());
  EXPECT_TRUE(request(proxy->port(), "POST", "/pay", {{"X-Idempotency-Key", k}}).replayed());
  // The draft's header means nothing to this proxy: such requests pass through.
  const std::string other = key("other");
  EXPECT_FALSE(request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", other}}).replayed());
  EXPECT_FALSE(request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", other}}).replayed());
  EXPECT_EQ(upstream_.executions().size(), 3u);
}

TEST_F(ProxyTest, EveryOptionComesFromTheEnvironmentToo) {
  ProxyProcess proxy(ProxyProcess::Exactly{}, dir_.path(), "env", {},
                     {"IDEM_PROXY_LISTEN=127.0.0.1:0", "IDEM_PROXY_UPSTREAM=" + upstream_.url(),
                      "IDEM_STORE=" + store_url(), "IDEM_PROXY_KEY_HEADER=PayPal-Request-Id",
                      "IDEM_PROXY_REQUIRE_KEY=true", "IDEM_PROXY_KEY_FORMAT=uuid",
                      "IDEM_PROXY_METHODS=POST,PUT", "IDEM_PROXY_ACCESS_LOG=1"});
  EXPECT_THAT(request(proxy.port(), "PUT", "/pay").body, HasSubstr("\"code\":\"missing-key\""));
  const std::string uuid = "1e03978e-40d5-43e8-bc93-6894a57f9324";
  EXPECT_FALSE(request(proxy.port(), "PUT", "/pay", {{"PayPal-Request-Id", uuid}}).replayed());
  EXPECT_TRUE(request(proxy.port(), "PUT", "/pay", {{"PayPal-Request-Id", uuid}}).replayed());
  EXPECT_TRUE(proxy.logged("method=PUT target=/pay status=200 outcome=replayed"));
}

// ---------------------------------------------------------------------------------------
// Health, metrics, logs, purging.

// The value of a metric line (`name` with its labels, as written) in a Prometheus text.
std::optional<double> metric(const std::string& text, const std::string& name) {
  const std::string line = "\n" + name + " ";
  const auto at = text.find(line);
  if (at == std::string::npos) return std::nullopt;
  return std::stod(text.substr(at + line.size()));
}

TEST_F(ProxyTest, AdminListenerServesLivenessReadinessAndMetricsApartFromTheProxiedPort) {
  auto proxy = start_proxy({"--admin", "127.0.0.1:0", "--drain-timeout", "30s"});
  const std::uint16_t admin = proxy->admin_port();
  EXPECT_EQ(request(admin, "GET", "/livez").body, "ok\n");
  Reply ready = request(admin, "GET", "/readyz");
  EXPECT_EQ(ready.status, 200u) << ready.body;

  const std::string k = key("k");
  EXPECT_EQ(request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}}, "a").status, 200u);
  EXPECT_TRUE(request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}}, "a").replayed());
  EXPECT_EQ(request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}}, "b").status, 422u);
  const std::string gated = key("gated");
  Reply first;
  std::thread owner = send_gated(proxy->port(), gated, first);
  EXPECT_EQ(request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", gated}}).status, 409u);
  EXPECT_EQ(request(proxy->port(), "GET", "/plain").status, 200u);

  Reply scrape = request(admin, "GET", "/metrics");
  ASSERT_EQ(scrape.status, 200u);
  EXPECT_THAT(scrape.header("Content-Type"), Optional(HasSubstr("version=0.0.4")));
  const std::string& m = scrape.body;
  EXPECT_EQ(metric(m, "idem_proxy_requests_total{outcome=\"recorded\"}"), 1.0);
  EXPECT_EQ(metric(m, "idem_proxy_requests_total{outcome=\"replayed\"}"), 1.0);
  EXPECT_EQ(metric(m, "idem_proxy_requests_total{outcome=\"key-reuse\"}"), 1.0);
  EXPECT_EQ(metric(m, "idem_proxy_requests_total{outcome=\"in-progress\"}"), 1.0);
  EXPECT_EQ(metric(m, "idem_proxy_requests_total{outcome=\"passed\"}"), 1.0);
  // The gated request's connection at least (closed ones may not be noticed yet).
  EXPECT_GE(metric(m, "idem_proxy_connections").value_or(0), 1.0);
  EXPECT_EQ(metric(m, "idem_leases_active"), 1.0);
  EXPECT_GE(metric(m, "idem_proxy_store_seconds_count{op=\"acquire\"}").value_or(0), 4.0);
  EXPECT_GE(metric(m, "idem_proxy_store_seconds_count{op=\"complete\"}").value_or(0), 1.0);
  EXPECT_GE(metric(m, "idem_proxy_upstream_seconds_count").value_or(0), 2.0);
  EXPECT_TRUE(metric(m, "idem_proxy_upstream_seconds_bucket{le=\"+Inf\"}").has_value());
  EXPECT_EQ(metric(m, "idem_calls_total{outcome=\"ran\"}"), 1.0);
  EXPECT_EQ(metric(m, "idem_leases_total{event=\"stolen\"}"), 0.0);
  // The proxied port knows nothing of it: /metrics there is the upstream's.
  EXPECT_THAT(request(proxy->port(), "GET", "/metrics").body, Not(HasSubstr("idem_proxy")));

  // Draining: not ready any more, while the request in flight finishes.
  proxy->signal(SIGTERM);
  ASSERT_TRUE(eventually([&] { return proxy->logged("SIGTERM: stopped accepting"); }));
  EXPECT_EQ(request(admin, "GET", "/readyz").status, 503u);
  EXPECT_EQ(request(admin, "GET", "/livez").status, 200u);
  upstream_.open_gate(gated);
  owner.join();
  EXPECT_EQ(first.status, 200u);
  EXPECT_EQ(proxy->wait(), 0);
}

TEST_F(ProxyTest, ReadinessFollowsTheStore) {
  const auto schemes = idem::available_schemes();
  if (std::find(schemes.begin(), schemes.end(), "redis") == schemes.end() ||
      !fs::exists("/usr/bin/redis-server")) {
    GTEST_SKIP() << "this build has no Redis store, or redis-server is not installed";
  }
  const std::uint16_t port = free_port();
  auto redis = [&] {
    return std::make_unique<Child>(
        std::vector<std::string>{"/usr/bin/redis-server", "--bind", "127.0.0.1", "--port",
                                 std::to_string(port), "--save", "", "--appendonly", "no", "--dir",
                                 dir_.path().string()},
        dir_ / "redis.out", dir_ / "redis.err");
  };
  auto server = redis();
  ASSERT_TRUE(eventually([&] { return !refuses_connections(port); }));
  ProxyProcess proxy(
      dir_.path(), "proxy", upstream_.url(),
      "redis://127.0.0.1:" + std::to_string(port) + "/0?timeout=500&connect_timeout=500",
      {"--admin", "127.0.0.1:0"});
  const std::uint16_t admin = proxy.admin_port();
  EXPECT_EQ(request(admin, "GET", "/readyz").status, 200u);
  server.reset();  // SIGKILL
  EXPECT_TRUE(eventually([&] { return request(admin, "GET", "/readyz").status == 503u; }));
  EXPECT_EQ(request(admin, "GET", "/livez").status, 200u);
  EXPECT_TRUE(proxy.logged("readiness: the store does not answer"));
  server = redis();
  EXPECT_TRUE(eventually([&] { return request(admin, "GET", "/readyz").status == 200u; }));
}

TEST_F(ProxyTest, AccessLogInJsonTellsWhatHappenedAndTheUpstreamLearnsWhoAsked) {
  auto proxy = start_proxy({"--log-format", "json"});
  Reply passed = request(
      proxy->port(), "POST", "/echo",
      {{"X-Test-Echo", "1"}, {"X-Request-Id", "rid-1"}, {"X-Forwarded-For", "203.0.113.9"}});
  ASSERT_EQ(passed.status, 200u);
  EXPECT_THAT(passed.body, AllOf(HasSubstr("X-Forwarded-For: 203.0.113.9, 127.0.0.1\n"),
                                 HasSubstr("Forwarded: for=127.0.0.1\n"),
                                 HasSubstr("Via: 1.1 idem\n"), HasSubstr("X-Request-Id: rid-1\n")));
  const std::string k = key("k");
  ASSERT_EQ(
      request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}, {"X-Request-Id", "rid-2"}})
          .status,
      200u);
  // Each request id names one line of JSON with the outcome and where the time went.
  auto line_of = [&](const std::string& id) {
    std::istringstream in(proxy->log());
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"request_id\":\"" + id + "\"") != std::string::npos) {
        return nlohmann::json::parse(line);
      }
    }
    return nlohmann::json();
  };
  ASSERT_TRUE(eventually([&] { return !line_of("rid-2").is_null(); }));
  nlohmann::json a = line_of("rid-1"), b = line_of("rid-2");
  EXPECT_EQ(a["msg"], "request");
  EXPECT_EQ(a["level"], "info");
  EXPECT_TRUE(a["ts"].is_string());
  EXPECT_EQ(a["client"].get<std::string>().rfind("127.0.0.1:", 0), 0u);
  EXPECT_EQ(a["method"], "POST");
  EXPECT_EQ(a["target"], "/echo");
  EXPECT_EQ(a["status"], 200);
  EXPECT_EQ(a["outcome"], "passed");
  EXPECT_TRUE(a["upstream_ms"].is_number());
  EXPECT_TRUE(a["total_ms"].is_number());
  EXPECT_TRUE(a["bytes"].is_number());
  EXPECT_FALSE(a.contains("store_ms"));
  EXPECT_EQ(b["outcome"], "recorded");
  EXPECT_EQ(b["key"], k);
  EXPECT_TRUE(b["store_ms"].is_number());
  // The error log is JSON as well.
  EXPECT_TRUE(proxy->logged("\"msg\":\"listening on 127.0.0.1:"));
}

TEST_F(ProxyTest, ExpiredRecordsArePurgedInTheBackgroundUnlessTurnedOff) {
  auto purging = start_proxy({"--ttl", "1s", "--purge-interval", "200ms"}, "purging");
  auto keeping = start_proxy({"--ttl", "1s", "--no-purge"}, "keeping");
  EXPECT_TRUE(purging->logged("purging expired records every"));
  EXPECT_FALSE(keeping->logged("purging expired records every"));
  const std::string gone = key("gone");
  ASSERT_EQ(request(purging->port(), "POST", "/pay", {{"Idempotency-Key", gone}}).status, 200u);
  ASSERT_TRUE(record("POST /pay", gone).has_value());
  EXPECT_TRUE(
      eventually([&] { return !record("POST /pay", gone).has_value(); }, std::chrono::seconds(20)));
  purging.reset();
  const std::string kept = key("kept");
  ASSERT_EQ(request(keeping->port(), "POST", "/pay", {{"Idempotency-Key", kept}}).status, 200u);
  ASSERT_TRUE(eventually([&] {
    std::optional<Record> r = record("POST /pay", kept);
    return r && r->expires_at <= r->now;
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_TRUE(record("POST /pay", kept).has_value());
}

// ---------------------------------------------------------------------------------------
// The smaller findings.

TEST_F(ProxyTest, RetryAfterSaysWhatRequestsTakeUnlessTheKeyIsHeldUntilItsLeaseRunsOut) {
  auto proxy =
      start_proxy({"--lease", "60s", "--problem-type-base", "https://api.example/problems/"});
  ASSERT_EQ(request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", key("warm")}}).status,
            200u);
  const std::string k = key("k");
  Reply first;
  std::thread owner = send_gated(proxy->port(), k, first);
  Reply dup = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}});
  ASSERT_EQ(dup.status, 409u) << dup.error << dup.body;
  // Requests here take milliseconds: a minute of lease says nothing of when to retry.
  EXPECT_EQ(dup.header("Retry-After"), std::string("1"));
  EXPECT_THAT(dup.body, HasSubstr("\"type\":\"https://api.example/problems/in-progress\""));
  upstream_.open_gate(k);
  owner.join();

  // A key held after an uncertain outcome frees up only when its lease runs out.
  const std::string held = key("held");
  EXPECT_EQ(
      request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", held}, {"X-Test-Drop", "1"}})
          .status,
      502u);
  Reply wait = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", held}});
  ASSERT_EQ(wait.status, 409u);
  EXPECT_GE(std::stoi(wait.header("Retry-After").value_or("0")), 30);
}

TEST_F(ProxyTest, FirstRequestOnAConnectionIsBoundedByTheClientTimeoutNotTheIdleTimeout) {
  auto proxy = start_proxy({"--client-timeout", "300ms", "--idle-timeout", "60s"});
  // A client that connects and says nothing is dropped after --client-timeout; with the idle
  // timeout it would still be open when this wait gives up.
  EXPECT_EQ(idle_connection_ends(proxy->port(), std::chrono::seconds(20)), "end of file");
}

TEST_F(ProxyTest, OpenFileLimitIsRaisedAndAWarningSaysWhenItIsStillTooLow) {
  auto proxy = start_proxy({"--max-connections", "1000"}, "limited",
                           {"/usr/bin/prlimit", "--nofile=64:128", "--"});
  EXPECT_TRUE(proxy->logged("open files: raised the limit from 64 to 128"));
  EXPECT_TRUE(proxy->logged("level=warn msg=\"the open-file limit (128) is below"));
  EXPECT_EQ(request(proxy->port(), "GET", "/ping").status, 200u);
}

TEST_F(ProxyTest, IdemShowDecodesARecordedAnswer) {
  auto proxy = start_proxy({"--max-record", "1KiB"});
  const std::string k = key("k"), big = key("big");
  ASSERT_EQ(request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}}).status, 200u);
  ASSERT_EQ(request(proxy->port(), "POST", "/pay",
                    {{"Idempotency-Key", big}, {"X-Test-Body-Size", "5000"}})
                .status,
            200u);
  auto show = [&](const std::string& which, const std::vector<std::string>& more) {
    std::vector<std::string> argv = {IDEM_BINARY, "show",    "--store",
                                     store_url(), "--scope", hosted("POST /pay"),
                                     "--key",     which};
    argv.insert(argv.end(), more.begin(), more.end());
    const fs::path out = dir_ / ("show." + which), err = dir_ / ("show.err." + which);
    const int status = run(argv, out, err);
    return std::make_pair(status, read_file(out) + read_file(err));
  };
  auto [status, text] = show(k, {});
  EXPECT_EQ(status, 0) << text;
  EXPECT_THAT(text, AllOf(HasSubstr("\"format\": \"idem-proxy/1\""), HasSubstr("\"status\": 200"),
                          HasSubstr("\"X-Execution\""), HasSubstr("\"body_recorded\": true")));
  auto [payload_status, body] = show(k, {"--payload"});
  EXPECT_EQ(payload_status, 0);
  EXPECT_THAT(body, HasSubstr("execution=1 "));
  auto [marker_status, marker] = show(big, {});
  EXPECT_EQ(marker_status, 0);
  EXPECT_THAT(marker,
              AllOf(HasSubstr("\"body_bytes\": 5000"), HasSubstr("\"body_recorded\": false")));
}

// ---------------------------------------------------------------------------------------
// Connections, restarts and shutdown.

TEST_F(ProxyTest, KeepAliveOnBothSides) {
  auto proxy = start_proxy();
  Client client(proxy->port());
  for (int i = 0; i < 20; ++i) {
    const std::string k = key(std::to_string(i % 5));
    Reply r = i % 3 == 0 ? client.send("GET", "/ping")
                         : client.send("POST", "/pay", {{"Idempotency-Key", k}});
    ASSERT_EQ(r.status, 200u) << i << r.error;
    ASSERT_FALSE(client.closed()) << i;
  }
  // One client connection, sequential requests: the proxy reused one upstream connection.
  std::vector<std::string> connections;
  for (const auto& line : upstream_.executions()) connections.push_back(line.back());
  std::sort(connections.begin(), connections.end());
  connections.erase(std::unique(connections.begin(), connections.end()), connections.end());
  EXPECT_EQ(connections.size(), 1u);
}

TEST_F(ProxyTest, ExpectContinueIsAnsweredAndTheBodyForwarded) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  std::vector<std::string> args = {"-X",
                                   "POST",
                                   "-H",
                                   "Idempotency-Key: " + k,
                                   "-H",
                                   "Expect: 100-continue",
                                   "--data-binary",
                                   std::string(5000, 'b')};
  Reply r = curl(dir_.path(), proxy->url() + "/upload", args);
  ASSERT_EQ(r.status, 200u) << r.error;
  EXPECT_THAT(r.body, HasSubstr("body=5000"));
  EXPECT_TRUE(curl(dir_.path(), proxy->url() + "/upload", args).replayed());
}

TEST_F(ProxyTest, RecordsSurviveAProxyRestart) {
  const std::string k = key("k");
  Reply first;
  {
    auto proxy = start_proxy({}, "before");
    first = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}}, "body");
    ASSERT_EQ(first.status, 200u);
    proxy->signal(SIGTERM);
    EXPECT_EQ(proxy->wait(), 0);
  }
  auto proxy = start_proxy({}, "after");
  Reply replay = request(proxy->port(), "POST", "/pay", {{"Idempotency-Key", k}}, "body");
  EXPECT_TRUE(replay.replayed());
  EXPECT_EQ(replay.body, first.body);
  EXPECT_EQ(upstream_.executions_of(k), 1);
}

TEST_F(ProxyTest, SigtermFinishesTheRequestInFlightAndStopsAccepting) {
  auto proxy = start_proxy();
  const std::string k = key("k");
  Reply first;
  std::thread client = send_gated(proxy->port(), k, first);
  proxy->signal(SIGTERM);
  ASSERT_TRUE(eventually([&] { return proxy->logged("SIGTERM: stopped accepting"); }));
  EXPECT_TRUE(refuses_connections(proxy->port()));

  upstream_.open_gate(k);
  client.join();
  EXPECT_EQ(first.status, 200u) << first.error;
  EXPECT_EQ(first.header("Connection"), std::string("close"));
  EXPECT_EQ(proxy->wait(), 0);
  std::optional<Record> stored = record("POST /pay", k);
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->state, RecordState::kComplete);
}

TEST_F(ProxyTest, SigtermDrainTimeoutKeepsTheKeyOfARequestInFlightHeld) {
  auto proxy = start_proxy({"--drain-timeout", "300ms"}, "stopping");
  const std::string k = key("k");
  Reply first;
  std::thread client = send_gated(proxy->port(), k, first);
  proxy->signal(SIGTERM);
  client.join();
  EXPECT_EQ(first.status, 503u) << first.error;
  EXPECT_THAT(first.body, HasSubstr("\"code\":\"shutting-down\""));
  EXPECT_EQ(proxy->wait(), 0);
  // The upstream may still be running it: the key stays held, here and on another proxy.
  EXPECT_TRUE(in_progress("POST /pay", k));
  auto other = start_proxy({}, "other");
  EXPECT_EQ(request(other->port(), "POST", "/pay", {{"Idempotency-Key", k}}).status, 409u);
  EXPECT_EQ(upstream_.executions_of(k), 1);
  upstream_.open_gate(k);
}

}  // namespace
}  // namespace idem::proxy::test
