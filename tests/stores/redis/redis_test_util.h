#pragma once

// Helpers for the Redis store tests:
//  - the shared server the test script starts (IDEM_TEST_REDIS_URL): a test skips without
//    it, and fails when IDEM_REQUIRE_SERVERS=1;
//  - a fresh key prefix per store, so every test starts from an empty store on that server;
//  - RawRedis, a plain hiredis connection to look at or tamper with what the store wrote;
//  - PrivateRedis, a redis-server of the test's own (for tests that stop, restart, pause or
//    reconfigure a server, which must not disturb the shared one other tests use).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "idem/error.h"
#include "idem/stores/redis_store.h"
#include "support/require_server.h"

namespace idem::testing {

// The shared server's URL (redis://127.0.0.1:PORT/0), or nullopt when it is not set.
std::optional<std::string> shared_redis_url();

// A key prefix no other store in any test process has used.
std::string fresh_prefix(const std::string& stem = "t");

// `url` with `param=value` added to its query.
std::string with_param(const std::string& url, const std::string& param, const std::string& value);

// Options for a store on the shared server under a fresh prefix. REQUIRES: the server is set.
RedisStoreOptions shared_options();

// For tests on the shared server: skips (fails with IDEM_REQUIRE_SERVERS=1) without it.
class SharedRedisTest : public ::testing::Test {
 protected:
  void SetUp() override;
  std::string url_;
};

// For tests that start servers of their own: skips (fails with IDEM_REQUIRE_SERVERS=1)
// when redis-server is not installed.
class PrivateRedisTest : public ::testing::Test {
 protected:
  void SetUp() override;
};

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using RawReply = std::unique_ptr<redisReply, ReplyFree>;

// A plain hiredis connection; every failure is a test failure.
class RawRedis {
 public:
  explicit RawRedis(int port);
  explicit RawRedis(const RedisStoreOptions& options);
  ~RawRedis();
  RawRedis(const RawRedis&) = delete;
  RawRedis& operator=(const RawRedis&) = delete;

  bool connected() const { return ctx_ != nullptr && ctx_->err == 0; }
  // Runs one command; null (and a recorded failure) when the connection fails.
  RawReply command(const std::vector<std::string>& args);
  // The reply as text (string, status or error), or its integer as text.
  std::string text(const std::vector<std::string>& args);
  long long integer(const std::vector<std::string>& args);

 private:
  redisContext* ctx_ = nullptr;
};

// A redis-server of the test's own on a free loopback port and a unix socket, in a
// temporary directory, without persistence unless `args` asks for it; `env` ("NAME=value")
// is added to its environment; `config`, when not empty, is written to a configuration file
// in its directory that the server reads first (a sentinel needs one: it rewrites it).
// Killed and removed by the destructor.
class PrivateRedis {
 public:
  explicit PrivateRedis(std::vector<std::string> args = {}, std::vector<std::string> env = {},
                        std::string config = {});
  ~PrivateRedis();
  PrivateRedis(const PrivateRedis&) = delete;
  PrivateRedis& operator=(const PrivateRedis&) = delete;

  // False (with a recorded failure) when the server could not be started.
  bool ok() const { return pid_ > 0; }
  int port() const { return port_; }
  const std::string& dir() const { return dir_; }
  std::string socket() const { return dir_ + "/redis.sock"; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }
  RedisStoreOptions options() const;

  // SIGKILL: the server dies at once, as in a crash.
  void kill();
  // Starts it again on the same port and directory (so an AOF is read back).
  void restart();
  // SIGSTOP / SIGCONT.
  void pause();
  void resume();

 private:
  void start();
  std::vector<std::string> args_;
  std::vector<std::string> env_;
  std::string config_;
  std::string dir_;
  int port_ = 0;
  int pid_ = -1;
};

// The configuration of a sentinel of the test's own (PrivateRedis with --sentinel)
// monitoring `service` on the server at `primary_port`, quorum 1: it takes the server for
// down after `down_after_ms` without an answer, and gives a failover `failover_timeout_ms`.
std::string sentinel_config(const std::string& service, int primary_port, int down_after_ms,
                            int failover_timeout_ms = 2000);

// Waits (eventually) until `sentinel` knows one replica of `service` and the primary at
// `primary_port` has it in sync, so that SENTINEL FAILOVER can promote it; false if never.
bool ready_to_fail_over(RawRedis& sentinel, const std::string& service, int primary_port);

// Expects `step` to throw StoreUnavailable whose message holds every part; returns it.
template <typename F>
std::optional<StoreUnavailable> expect_unavailable(F&& step,
                                                   const std::vector<std::string>& parts) {
  try {
    step();
    ADD_FAILURE() << "no StoreUnavailable";
  } catch (const StoreUnavailable& e) {
    for (const std::string& part : parts) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(part));
    }
    return e;
  }
  return std::nullopt;
}

// ACL SETUSER's arguments for a user `name` with password `password` and the least the
// store needs on keys `keys` (its scripts and the commands they call); no publish/subscribe.
std::vector<std::string> least_acl_user(const std::string& name, const std::string& password,
                                        const std::string& keys);

// SPEC §7 on any Redis deployment: on two stores opened from `url` (which names a fresh
// prefix), a watch on one store is subscribed, and a complete through the other wakes it.
void expect_watch_wakes_on_complete(const std::string& url);

// A loopback TCP port nothing listens on right now (bound, then closed again).
int unused_port();

// Whether a program is on PATH.
bool have_program(const std::string& name);

}  // namespace idem::testing
