// The Redis store through Redis Sentinel (redis+sentinel://) on the primary, replica and
// three sentinels scripts/servers.sh starts (idem_start_redis_sentinel,
// IDEM_TEST_REDIS_SENTINEL_URL): the shared store suite unchanged, the sentinels' errors,
// and a forced failover (SENTINEL FAILOVER) under load. Every test of this executable holds
// the resource lock redis_sentinel (tests/stores/redis/CMakeLists.txt): a failover must not
// run beside the suite.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "idem/open_store.h"
#include "idem/stores/redis_store.h"
#include "idem/testing/store_conformance.h"
#include "stores/redis/redis_layout.h"
#include "stores/redis/redis_test_util.h"

#ifdef IDEM_BINARY
#include "cli/process.h"
#endif

namespace idem::testing {
namespace {

using namespace std::chrono_literals;

::testing::Environment* const kSentinelEnvironment = ::testing::AddGlobalTestEnvironment(
    new ServerEnvironment("IDEM_TEST_REDIS_SENTINEL_URL",
                          "source scripts/servers.sh and run idem_start_redis_sentinel"));

std::string sentinel_url() {
  const char* v = std::getenv("IDEM_TEST_REDIS_SENTINEL_URL");
  return v == nullptr ? std::string() : std::string(v);
}

std::vector<int> sentinel_ports() {
  std::vector<int> out;
  const char* v = std::getenv("IDEM_TEST_REDIS_SENTINEL_PORTS");
  std::istringstream in(v == nullptr ? "" : v);
  for (int p = 0; in >> p;) out.push_back(p);
  return out;
}

IDEM_INSTANTIATE_STORE_CONFORMANCE(
    RedisSentinel,
    StoreTestContext{.name = "redis_sentinel",
                     .make = [](std::shared_ptr<ManualClock>) -> std::shared_ptr<Store> {
                       return open_store(
                           with_param(sentinel_url(), "prefix", fresh_prefix("sentinel")));
                     },
                     .fake_clock = false,
                     .tick = Duration{200},
                     .native_expiry = true,
                     .store_wide_tokens = true});

// The primary's port as the first sentinel reports it.
std::string primary_port() {
  RawRedis sentinel(sentinel_ports().at(0));
  RawReply r = sentinel.command({"SENTINEL", "get-master-addr-by-name", "idemtest"});
  if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) return {};
  return std::string(r->element[1]->str, r->element[1]->len);
}

// SPEC §7: the subscriber connects to the primary the sentinels name.
TEST(RedisSentinel, AWatchWakesWhenAnotherStoreCompletes) {
  expect_watch_wakes_on_complete(
      with_param(sentinel_url(), "prefix", fresh_prefix("sentinel-wake")));
}

TEST(RedisSentinel, DescribeNamesTheSentinelsAndTheService) {
  auto store = open_store(sentinel_url());
  EXPECT_EQ(store->describe(), sentinel_url().substr(0, sentinel_url().find('?')));
}

TEST(RedisSentinel, AnUnknownServiceIsRefusedSayingSo) {
  const std::string url = sentinel_url();
  const std::string other = url.substr(0, url.rfind('/')) + "/nosuchservice";
  expect_unavailable([&] { (void)open_store(other); },
                     {"no sentinel named a primary for \"nosuchservice\"",
                      "monitors no service named \"nosuchservice\""});
}

TEST(RedisSentinel, NoSentinelReachableIsRefusedSayingSo) {
  const std::string url = "redis+sentinel://127.0.0.1:" + std::to_string(unused_port()) +
                          ",127.0.0.1:" + std::to_string(unused_port()) + "/idemtest";
  expect_unavailable([&] { (void)open_store(url); },
                     {"no sentinel named a primary", "cannot connect"});
}

TEST(RedisSentinel, UrlNeedsAServiceAndPorts) {
  EXPECT_THROW((void)open_store("redis+sentinel://127.0.0.1:1,127.0.0.1:2"), InvalidArgument);
  EXPECT_THROW((void)open_store("redis+sentinel://127.0.0.1,127.0.0.1:2/s"), InvalidArgument);
  EXPECT_THROW((void)open_store("redis://127.0.0.1:1,127.0.0.1:2/0"), InvalidArgument);
}

// Eight threads record fresh keys (acquire, then complete) while SENTINEL FAILOVER promotes
// the replica. Callers see only StoreUnavailable while it happens; afterwards every thread
// records again; with wait_replicas=1 every key reported recorded is on the new primary.
TEST(RedisSentinel, AForcedFailoverUnderLoadKeepsEveryRecordedKey) {
  const std::string before = primary_port();
  ASSERT_FALSE(before.empty());
  const std::string prefix = fresh_prefix("failover");
  auto store = open_store(sentinel_url() + "?prefix=" + prefix +
                          "&wait_replicas=1&wait_timeout=1000&timeout=2000");
  std::atomic<bool> stop{false};
  std::atomic<int> unavailable{0};
  std::atomic<int> other_errors{0};
  std::mutex mu;
  std::vector<std::string> recorded;
  std::map<int, std::chrono::steady_clock::time_point> last_success;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; !stop.load(); ++i) {
        const std::string key = std::to_string(t) + ":" + std::to_string(i);
        try {
          const AcquireResult r = store->acquire("s", key, Duration{5000}, Duration{600000});
          if (!std::holds_alternative<Acquired>(r)) {
            ++other_errors;  // a fresh key: anything else would be a bug
            continue;
          }
          if (store->complete("s", key, std::get<Acquired>(r).lease.token, "v" + key,
                              Duration{600000}) == WriteResult::kDone) {
            std::lock_guard lock(mu);
            recorded.push_back(key);
            last_success[t] = std::chrono::steady_clock::now();
          }
          std::this_thread::sleep_for(1ms);  // load, not a flood that starves the replica
        } catch (const StoreUnavailable&) {
          ++unavailable;
          std::this_thread::sleep_for(20ms);
          continue;
        } catch (...) {
          ++other_errors;
        }
      }
    });
  }
  struct Joiner {  // also when an assertion returns early
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~Joiner() {
      stop = true;
      for (auto& t : threads) {
        if (t.joinable()) t.join();
      }
    }
  } joiner{stop, threads};
  std::this_thread::sleep_for(500ms);
  // SENTINEL FAILOVER; on a loaded machine a promotion can time out (failover-abort-...), so
  // ask again until the sentinels name another primary, within 40 s.
  const auto asked_at = std::chrono::steady_clock::now();
  {
    RawRedis sentinel(sentinel_ports().at(0));
    while (primary_port() == before && std::chrono::steady_clock::now() - asked_at < 40s) {
      (void)sentinel.text({"SENTINEL", "FAILOVER", "idemtest"});
      for (int i = 0; i < 50 && primary_port() == before; ++i) std::this_thread::sleep_for(200ms);
    }
  }
  const auto failover_at = std::chrono::steady_clock::now();
  ASSERT_NE(primary_port(), before) << "the sentinels did not fail over";
  // Then every thread records again within 20 s: nothing stays stuck.
  bool all_recovered = false;
  for (int i = 0; i < 200 && !all_recovered; ++i) {
    std::this_thread::sleep_for(100ms);
    std::lock_guard lock(mu);
    all_recovered = last_success.size() == 8;
    for (const auto& [t, at] : last_success) all_recovered = all_recovered && at > failover_at + 1s;
  }
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_TRUE(all_recovered) << "a caller never recorded again after the failover";
  EXPECT_EQ(other_errors.load(), 0);
  std::cout << "recorded " << recorded.size() << " keys; " << unavailable.load()
            << " calls failed with StoreUnavailable during the failover\n";
  // Every key reported recorded is COMPLETE on the new primary.
  auto check = open_store(sentinel_url() + "?prefix=" + prefix);
  for (const std::string& key : recorded) {
    const std::optional<Record> r = check->get("s", key);
    ASSERT_TRUE(r.has_value()) << key << " was reported recorded and is lost";
    EXPECT_EQ(r->state, RecordState::kComplete);
    EXPECT_EQ(r->payload, "v" + key);
  }
}

// +switch-master: a store that makes no call during a forced failover is moved to the new
// primary by the event itself, so no call afterwards meets the old primary (no READONLY, no
// broken connection, no write that lands on the old primary and is lost). Without the
// event the connections stay on the old primary, which takes writes until the sentinels
// make it a replica.
TEST(RedisSentinel, SwitchMasterMovesTheStoreBeforeAnyCallMeetsTheFailover) {
  const std::string before = primary_port();
  ASSERT_FALSE(before.empty());
  const std::string prefix = fresh_prefix("switch");
  auto opened = open_store(sentinel_url() + "?prefix=" + prefix + "&connections=3");
  auto* store = dynamic_cast<RedisStore*>(opened.get());
  ASSERT_NE(store, nullptr);
  // Every connection in use once, and the subscription confirmed, before the failover.
  for (int i = 0; i < 6; ++i)
    (void)store->acquire("s", "warm" + std::to_string(i), 5000ms, 60000ms);
  for (int i = 0; i < 100 && !store->stats().switch_events; ++i) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(store->stats().switch_events) << "not subscribed to +switch-master";
  const std::uint64_t switches = store->stats().primary_switches;
  const std::uint64_t reconnects = store->stats().reconnects;
  const auto asked_at = std::chrono::steady_clock::now();
  {
    RawRedis sentinel(sentinel_ports().at(0));
    while (primary_port() == before && std::chrono::steady_clock::now() - asked_at < 40s) {
      (void)sentinel.text({"SENTINEL", "FAILOVER", "idemtest"});
      for (int i = 0; i < 50 && primary_port() == before; ++i) std::this_thread::sleep_for(200ms);
    }
  }
  const std::string after = primary_port();
  ASSERT_NE(after, before) << "the sentinels did not fail over";
  // The event reaches the subscribed sentinel within about a second of the switch.
  for (int i = 0; i < 100 && store->stats().primary_switches == switches; ++i) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_GT(store->stats().primary_switches, switches);
  // Every call now succeeds and lands on the new primary.
  for (int i = 0; i < 12; ++i) {
    const std::string key = "k" + std::to_string(i);
    try {
      const AcquireResult r = store->acquire("s", key, 5000ms, 60000ms);
      ASSERT_TRUE(std::holds_alternative<Acquired>(r)) << key;
      EXPECT_EQ(store->complete("s", key, std::get<Acquired>(r).lease.token, "v", 60000ms),
                WriteResult::kDone);
    } catch (const StoreUnavailable& e) {
      ADD_FAILURE() << key << " met the failover: " << e.what();
      continue;
    }
    RawRedis primary(std::stoi(after));
    EXPECT_EQ(primary.integer({"EXISTS", redis::record_key(prefix, "s", key)}), 1)
        << key << " is not on the new primary 127.0.0.1:" << after;
  }
  EXPECT_GE(store->stats().reconnects, reconnects + 3) << "the connections did not move";
}

// The store's destructor stops its +switch-master subscriber at once, even while the
// sentinel it watches accepts connections and never answers (a listening socket nobody
// reads, first in the URL; the store's connections come from the next sentinel).
TEST(RedisSentinel, ClosingTheStoreDoesNotWaitForASilentSentinel) {
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::listen(silent, 16), 0);
  ASSERT_EQ(::getsockname(silent, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string url = sentinel_url();
  const std::string with_silent = url.substr(0, url.find("//") + 2) +
                                  "127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "," +
                                  url.substr(url.find("//") + 2);
  auto store = open_store(
      with_param(with_param(with_silent, "connect_timeout", "3000"), "connections", "1"));
  (void)store->get("s", "k");
  std::this_thread::sleep_for(200ms);  // the subscriber is waiting on the silent sentinel
  const auto closing = std::chrono::steady_clock::now();
  store.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - closing, 500ms);
  ::close(silent);
}

#ifdef IDEM_BINARY
// The tool on this setup: `idem run` twice with one key runs the command once and replays
// its output the second time.
TEST(RedisSentinel, TheToolRunsACommandOnceAndReplaysIt) {
  const std::string dir = ::testing::TempDir() + "idem-tool-" + fresh_prefix("d").substr(10, 40);
  ASSERT_EQ(std::system(("mkdir -p '" + dir + "'").c_str()), 0);
  const std::string runs = dir + "/runs";
  const std::string url = with_param(sentinel_url(), "prefix", fresh_prefix("tool"));
  for (int i = 0; i < 2; ++i) {
    const cli::test::ProcessResult r =
        cli::test::run_process({IDEM_BINARY, "run", "--store", url, "--key", "k", "--", "sh", "-c",
                                "echo ran >> '" + runs + "'; echo out"},
                               {});
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, "out\n") << r.err;
  }
  std::ifstream in(runs);
  int n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  EXPECT_EQ(n, 1) << "the command ran more than once";
}
#endif

}  // namespace
}  // namespace idem::testing
