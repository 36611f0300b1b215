#include "stores/redis/redis_test_util.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <variant>

#include "idem/open_store.h"
#include "idem/store.h"
#include "support/eventually.h"

namespace idem::testing {

std::optional<std::string> shared_redis_url() {
  const char* url = std::getenv("IDEM_TEST_REDIS_URL");
  if (url == nullptr || *url == '\0') return std::nullopt;
  return std::string(url);
}

std::string fresh_prefix(const std::string& stem) {
  static std::atomic<int> counter{0};
  const auto now = std::chrono::system_clock::now().time_since_epoch().count();
  return "idem-test:" + stem + ":" + std::to_string(::getpid()) + ":" + std::to_string(now) + ":" +
         std::to_string(counter.fetch_add(1)) + ":";
}

std::string with_param(const std::string& url, const std::string& param, const std::string& value) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") + param + "=" + value;
}

RedisStoreOptions shared_options() {
  const Url url = parse_url(shared_redis_url().value());
  RedisStoreOptions o;
  o.host = url.host;
  o.port = url.port;
  o.prefix = fresh_prefix();
  return o;
}

void SharedRedisTest::SetUp() {
  std::optional<std::string> url = shared_redis_url();
  IDEM_SKIP_OR_FAIL_UNLESS(url.has_value(),
                           "IDEM_TEST_REDIS_URL is not set (scripts/servers.sh starts a server)");
  url_ = *url;
}

void PrivateRedisTest::SetUp() {
  IDEM_SKIP_OR_FAIL_UNLESS(have_program("redis-server"), "redis-server is not installed");
}

std::vector<std::string> least_acl_user(const std::string& name, const std::string& password,
                                        const std::string& keys) {
  return {"ACL",      "SETUSER",  name,    "on",           ">" + password,
          "~" + keys, "+evalsha", "+eval", "+script|load", "+info",
          "+get",     "+set",     "+del",  "+append",      "+time"};
}

void expect_watch_wakes_on_complete(const std::string& url) {
  using namespace std::chrono_literals;
  auto owner = open_store(url);
  auto waiter_store = open_store(url);
  auto* waiter = dynamic_cast<RedisStore*>(waiter_store.get());
  ASSERT_NE(waiter, nullptr);
  ASSERT_TRUE(waiter->stats().notify);
  const AcquireResult r = owner->acquire("w", "job", 60s, 1h);
  ASSERT_TRUE(std::holds_alternative<Acquired>(r));
  std::atomic<int> woken{0};
  auto watch = waiter->watch("w", "job", [&] { ++woken; });
  ASSERT_NE(watch, nullptr);
  // The confirmed subscription calls the watch once (a publish may have come before it).
  ASSERT_TRUE(eventually([&] { return waiter->stats().subscribed_channels == 1 && woken > 0; }));
  const int before = woken.load();
  ASSERT_EQ(owner->complete("w", "job", std::get<Acquired>(r).lease.token, "done", 1h),
            WriteResult::kDone);
  EXPECT_TRUE(eventually([&] { return woken.load() > before; }));
  EXPECT_GE(waiter->stats().notifications, 1U);
}

// --- RawRedis -----------------------------------------------------------------------------

RawRedis::RawRedis(int port) {
  ctx_ = redisConnect("127.0.0.1", port);
  if (ctx_ == nullptr || ctx_->err != 0) {
    ADD_FAILURE() << "cannot connect to 127.0.0.1:" << port << ": "
                  << (ctx_ ? ctx_->errstr : "out of memory");
  }
}

RawRedis::RawRedis(const RedisStoreOptions& options) {
  ctx_ = options.socket.empty() ? redisConnect(options.host.c_str(), options.port)
                                : redisConnectUnix(options.socket.c_str());
  if (ctx_ == nullptr || ctx_->err != 0) {
    ADD_FAILURE() << "cannot connect: " << (ctx_ ? ctx_->errstr : "out of memory");
  }
  if (!options.password.empty()) {
    text({"AUTH", options.user.empty() ? "default" : options.user, options.password});
  }
  if (options.db != 0) text({"SELECT", std::to_string(options.db)});
}

RawRedis::~RawRedis() {
  if (ctx_ != nullptr) redisFree(ctx_);
}

RawReply RawRedis::command(const std::vector<std::string>& args) {
  if (!connected()) return nullptr;
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(
      redisCommandArgv(ctx_, static_cast<int>(args.size()), argv.data(), lens.data()));
  if (r == nullptr) ADD_FAILURE() << "raw Redis command failed: " << ctx_->errstr;
  return RawReply(r);
}

std::string RawRedis::text(const std::vector<std::string>& args) {
  RawReply r = command(args);
  if (!r) return {};
  if (r->type == REDIS_REPLY_INTEGER) return std::to_string(r->integer);
  if (r->str == nullptr) return {};
  return std::string(r->str, r->len);
}

long long RawRedis::integer(const std::vector<std::string>& args) {
  RawReply r = command(args);
  if (!r || r->type != REDIS_REPLY_INTEGER) {
    ADD_FAILURE() << args.at(0) << " did not answer an integer"
                  << (r && r->str ? ": " + std::string(r->str, r->len) : std::string());
    return -1;
  }
  return r->integer;
}

// --- PrivateRedis -------------------------------------------------------------------------

int unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

namespace {

bool answers_ping(int port) {
  redisContext* c = redisConnect("127.0.0.1", port);
  bool ok = false;
  if (c != nullptr && c->err == 0) {
    auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
    // A server still loading its AOF answers -LOADING, which is not ready yet.
    ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
    if (r != nullptr) freeReplyObject(r);
  }
  if (c != nullptr) redisFree(c);
  return ok;
}

// The program's path on PATH, or empty.
std::string program_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  const std::string dirs = path ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const std::size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return {};
}

}  // namespace

bool have_program(const std::string& name) { return !program_path(name).empty(); }

PrivateRedis::PrivateRedis(std::vector<std::string> args, std::vector<std::string> env,
                           std::string config)
    : args_(std::move(args)), env_(std::move(env)) {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "idem-private-redis-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed";
    return;
  }
  dir_ = pattern;
  if (!config.empty()) {
    config_ = dir_ + "/redis.conf";
    std::ofstream(config_) << config;
  }
  // Another process may take the port between our probe and the server's bind; try again.
  for (int attempt = 0; attempt < 5 && pid_ <= 0; ++attempt) {
    port_ = unused_port();
    start();
  }
}

PrivateRedis::~PrivateRedis() {
  if (pid_ > 0) {
    ::kill(pid_, SIGCONT);
    kill();
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

RedisStoreOptions PrivateRedis::options() const {
  RedisStoreOptions o;
  o.port = port_;
  o.prefix = fresh_prefix("private");
  return o;
}

void PrivateRedis::start() {
  std::vector<std::string> full = {"redis-server"};
  if (!config_.empty()) full.push_back(config_);
  const std::vector<std::string> common = {
      "--bind",       "127.0.0.1", "--port",           std::to_string(port_),
      "--unixsocket", socket(),    "--unixsocketperm", "700",
      "--save",       "",          "--appendonly",     "no",
      "--dir",        dir_,        "--logfile",        dir_ + "/redis.log"};
  full.insert(full.end(), common.begin(), common.end());
  full.insert(full.end(), args_.begin(), args_.end());
  std::vector<char*> argv;
  for (std::string& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Built before fork: the child of a threaded process may only make async-signal-safe
  // calls.
  std::vector<std::string> env_strings = env_;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string path = program_path("redis-server");
  if (path.empty()) {
    ADD_FAILURE() << "redis-server is not on PATH";
    pid_ = -1;
    return;
  }
  // fork + exec rather than posix_spawn, to ask for SIGKILL when this process dies: a test
  // that crashes or times out must not leave its server behind. The child only makes
  // async-signal-safe calls.
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::execve(path.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  if (pid < 0) {
    ADD_FAILURE() << "cannot start redis-server: fork failed";
    pid_ = -1;
    return;
  }
  pid_ = pid;
  const bool ready = eventually([&] {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) return true;  // exited: not ready
    return answers_ping(port_);
  });
  int status = 0;
  if (!ready || ::waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;  // exited (port taken?) or never answered
  }
}

void PrivateRedis::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

void PrivateRedis::restart() {
  kill();
  start();
  if (pid_ <= 0) ADD_FAILURE() << "redis-server did not come back on port " << port_;
}

void PrivateRedis::pause() {
  ASSERT_GT(pid_, 0);
  ASSERT_EQ(::kill(pid_, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid_, &status, WUNTRACED), pid_);
}

void PrivateRedis::resume() {
  ASSERT_GT(pid_, 0);
  ASSERT_EQ(::kill(pid_, SIGCONT), 0);
}

std::string sentinel_config(const std::string& service, int primary_port, int down_after_ms,
                            int failover_timeout_ms) {
  return "sentinel monitor " + service + " 127.0.0.1 " + std::to_string(primary_port) +
         " 1\n"
         "sentinel down-after-milliseconds " +
         service + " " + std::to_string(down_after_ms) +
         "\n"
         "sentinel failover-timeout " +
         service + " " + std::to_string(failover_timeout_ms) + "\n";
}

bool ready_to_fail_over(RawRedis& sentinel, const std::string& service, int primary_port) {
  return eventually([&] {
    RawReply replicas = sentinel.command({"SENTINEL", "replicas", service});
    const std::string info = RawRedis(primary_port).text({"INFO", "replication"});
    return replicas && replicas->type == REDIS_REPLY_ARRAY && replicas->elements == 1 &&
           info.find("state=online") != std::string::npos;
  });
}

}  // namespace idem::testing
