#include "stores/redis/redis_connection.h"

#include <limits.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <system_error>
#include <utility>

#include "idem/error.h"
#include "stores/redis/redis_layout.h"

namespace idem::redis {
namespace {

using namespace std::chrono_literals;

// Reconnection: the first attempt at once, then after 20 ms, doubling up to 1 s.
constexpr Duration kFirstBackoff{20};
constexpr Duration kMaxBackoff{1000};

timeval to_timeval(Duration d) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

std::string ms(Duration d) { return std::to_string(d.count()) + " ms"; }

std::string errno_text(int err) { return std::generic_category().message(err); }

// Writes every buffer, as few system calls as the kernel allows. MSG_NOSIGNAL: a server
// that went away must not raise SIGPIPE in the application (hiredis's own write would).
std::string send_all(int fd, std::vector<iovec>& iov, Duration timeout) {
  std::size_t i = 0;
  while (i < iov.size()) {
    msghdr msg{};
    msg.msg_iov = &iov[i];
    msg.msg_iovlen = std::min<std::size_t>(iov.size() - i, IOV_MAX);
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return "timed out after " + ms(timeout) + " sending to the server";
      }
      return "cannot send to the server: " + errno_text(errno);
    }
    auto left = static_cast<std::size_t>(n);
    while (i < iov.size() && left >= iov[i].iov_len) {
      left -= iov[i].iov_len;
      ++i;
    }
    if (left > 0) {
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
      iov[i].iov_len -= left;
    }
  }
  return {};
}

std::string context_error(const redisContext* c, Duration timeout) {
  if (c->err == REDIS_ERR_EOF) return "the server closed the connection";
  const std::string text = c->errstr;
  // A blocking hiredis read that hits SO_RCVTIMEO reports EAGAIN's text.
  if (c->err == REDIS_ERR_IO && text == errno_text(EAGAIN)) {
    return "timed out after " + ms(timeout) + " waiting for the server's reply";
  }
  if (c->err == REDIS_ERR_PROTOCOL) return "protocol error: " + text;
  return text.empty() ? "connection error" : text;
}

std::string read_reply(redisContext* c, Reply& out, Duration timeout) {
  void* raw = nullptr;
  if (redisGetReply(c, &raw) != REDIS_OK) return context_error(c, timeout);
  out.reset(static_cast<redisReply*>(raw));
  if (!out) return "no reply";
  return {};
}

std::string_view reply_text(const redisReply& r) { return {r.str, r.len}; }

}  // namespace

std::string explain_server_error(std::string_view message) {
  const std::string_view code = message.substr(0, message.find(' '));
  std::string cause;
  // Redis 7.0 reports a command the ACL denies inside a script as a plain ERR.
  if (code == "NOPERM" ||
      message.find("user executing the script can't run") != std::string_view::npos) {
    cause = "permission denied by the server's ACL";
  } else if (code == "WRONGPASS") {
    cause = "authentication failed (wrong user name or password)";
  } else if (code == "NOAUTH") {
    cause = "authentication required (the URL gives no password)";
  } else if (message.find("without any password configured") != std::string_view::npos) {
    cause = "authentication failed (the server has no password for this user)";
  } else if (code == "OOM") {
    cause = "the server is out of memory (maxmemory reached)";
  } else if (code == "READONLY") {
    cause = "the server is a read-only replica";
  } else if (code == "LOADING") {
    cause = "the server is loading its data set";
  } else if (code == "MASTERDOWN") {
    cause = "the replica has lost its primary";
  } else if (code == "BUSY") {
    cause = "the server is busy running a script";
  } else if (code == "MOVED" || code == "ASK" || code == "CLUSTERDOWN" || code == "CROSSSLOT" ||
             code == "TRYAGAIN") {
    cause = "Redis Cluster redirection (idem talks to one node: give it a standalone server, "
            "or a cluster proxy)";
  } else {
    cause = "server error";
  }
  return cause + ": " + std::string(message);
}

std::string eviction_refusal(std::string_view info) {
  constexpr std::string_view kField = "maxmemory_policy:";
  const std::size_t at = info.find(kField);
  if (at == std::string_view::npos) {
    return "cannot tell the server's maxmemory-policy (INFO memory has no maxmemory_policy "
           "line); open the store with eviction=allow to skip the check "
           "(docs/stores/redis.md, \"Eviction\")";
  }
  std::string_view policy = info.substr(at + kField.size());
  policy = policy.substr(0, policy.find_first_of("\r\n"));
  if (policy == "noeviction") return {};
  return "the server's maxmemory-policy is " + std::string(policy) +
         ", which lets Redis evict idem's records when it reaches maxmemory: an evicted lease "
         "lets a second caller run the action beside the first, an evicted result lets it run "
         "again. Set maxmemory-policy to noeviction (redis.conf, CONFIG SET maxmemory-policy "
         "noeviction, or the provider's parameter group), or accept that risk with "
         "eviction=allow in the store URL (docs/stores/redis.md, \"Eviction\")";
}

// --- Connection -------------------------------------------------------------------------

Connection::Connection(const ConnectionSettings& settings) : settings_(settings) {}

Connection::~Connection() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  fail_queued("the store was closed");
}

std::string Connection::connect_now(ScriptShas* shas) {
  std::string error;
  Context c = handshake(error, shas);
  std::lock_guard lock(mu_);
  if (!c) {
    last_error_ = error;
    return error;
  }
  ctx_ = std::move(c);
  up_.store(true, std::memory_order_release);
  return {};
}

void Connection::start() { thread_ = std::thread([this] { loop(); }); }

std::string Connection::last_error() const {
  std::lock_guard lock(mu_);
  return last_error_;
}

ConnectionStats Connection::stats() const {
  ConnectionStats s;
  s.round_trips = round_trips_.load(std::memory_order_relaxed);
  s.commands = commands_.load(std::memory_order_relaxed);
  s.reconnects = reconnects_.load(std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  s.queued = queue_.size();
  return s;
}

Context Connection::handshake(std::string& error, ScriptShas* shas) const {
  const timeval connect_tv = to_timeval(settings_.connect_timeout);
  Context c(settings_.socket.empty()
                ? redisConnectWithTimeout(settings_.host.c_str(), settings_.port, connect_tv)
                : redisConnectUnixWithTimeout(settings_.socket.c_str(), connect_tv));
  if (!c) {
    error = "cannot connect: out of memory";
    return {};
  }
  if (c->err != 0) {
    std::string why = c->errstr;
    if (why == errno_text(EINPROGRESS) || why == errno_text(ETIMEDOUT)) {
      why = "timed out after " + ms(settings_.connect_timeout);
    }
    error = "cannot connect: " + why;
    return {};
  }
  if (redisSetTimeout(c.get(), to_timeval(settings_.io_timeout)) != REDIS_OK ||
      (settings_.socket.empty() && redisEnableKeepAlive(c.get()) != REDIS_OK)) {
    error = "cannot set up the connection: " + std::string(c->errstr);
    return {};
  }

  // One round trip: AUTH, SELECT, then every script, so EVALSHA finds them even after a
  // restart emptied the server's script cache.
  std::string request;
  CommandWriter w(request);
  std::vector<std::string> what;  // what each reply answers, for errors
  if (!settings_.password.empty()) {
    if (settings_.user.empty()) {
      w.begin(2).arg("AUTH").arg(settings_.password);
    } else {
      w.begin(3).arg("AUTH").arg(settings_.user).arg(settings_.password);
    }
    what.emplace_back("AUTH");
  }
  if (settings_.db != 0) {
    w.begin(2).arg("SELECT").arg(std::int64_t{settings_.db});
    what.emplace_back("SELECT");
  }
  // On every (re)connection: a failover or a restart may bring another policy.
  if (settings_.refuse_eviction) {
    w.begin(2).arg("INFO").arg("memory");
    what.emplace_back("INFO");
  }
  for (const ScriptId id : settings_.scripts) {
    w.begin(3).arg("SCRIPT").arg("LOAD").arg(kScripts[id]->body);
    what.emplace_back("SCRIPT LOAD");
  }
  if (what.empty()) return c;
  std::vector<iovec> iov{{request.data(), request.size()}};
  if (error = send_all(c->fd, iov, settings_.io_timeout); !error.empty()) return {};
  std::string failure;
  std::size_t script = 0;
  for (const std::string& step : what) {
    Reply r;
    if (error = read_reply(c.get(), r, settings_.io_timeout); !error.empty()) return {};
    if (r->type == REDIS_REPLY_ERROR) {
      if (failure.empty()) {
        if (step == "AUTH") {
          failure = explain_server_error(reply_text(*r));
        } else if (step == "SELECT") {
          failure = "cannot select database " + std::to_string(settings_.db) + ": " +
                    explain_server_error(reply_text(*r));
        } else if (step == "INFO") {
          failure = "cannot read the server's maxmemory-policy (INFO memory): " +
                    explain_server_error(reply_text(*r)) +
                    "; grant the user +info, or open the store with eviction=allow "
                    "(docs/stores/redis.md, \"Eviction\")";
        } else {
          failure = "cannot load the store's scripts: " + explain_server_error(reply_text(*r));
        }
      }
    } else if (step == "INFO") {
      if (failure.empty()) {
        failure = eviction_refusal(r->type == REDIS_REPLY_STRING ? reply_text(*r)
                                                                 : std::string_view());
      }
    } else if (step == "SCRIPT LOAD") {
      if (shas != nullptr && r->type == REDIS_REPLY_STRING) {
        (*shas)[settings_.scripts[script]] = std::string(reply_text(*r));
      }
      ++script;
    }
  }
  if (!failure.empty()) {
    error = failure;
    return {};
  }
  return c;
}

std::string Connection::round_trip(std::vector<std::shared_ptr<Call>>& batch) {
  const Duration timeout = settings_.io_timeout;
  std::vector<iovec> iov;
  iov.reserve(batch.size() + 1);
  bool wait = false;
  std::size_t commands = 0;
  for (const auto& call : batch) {
    iov.push_back({call->request.data(), call->request.size()});
    wait = wait || call->wait_replicas;
    commands += call->commands;
  }
  if (wait) {
    iov.push_back({const_cast<char*>(settings_.wait_command.data()),
                   settings_.wait_command.size()});
    ++commands;
  }
  round_trips_.fetch_add(1, std::memory_order_relaxed);
  commands_.fetch_add(commands, std::memory_order_relaxed);

  std::string error = send_all(ctx_->fd, iov, timeout);
  // Calls that asked for WAIT are answered after its reply, with their own replies.
  std::vector<std::pair<Call*, std::vector<Reply>>> waiting;
  std::size_t answered = 0;
  for (; error.empty() && answered < batch.size(); ++answered) {
    Call& call = *batch[answered];
    std::vector<Reply> replies;
    replies.reserve(call.commands);
    for (std::size_t i = 0; i < call.commands && error.empty(); ++i) {
      Reply r;
      error = read_reply(ctx_.get(), r, timeout);
      if (error.empty()) replies.push_back(std::move(r));
    }
    if (!error.empty()) break;
    if (call.wait_replicas) {
      waiting.emplace_back(&call, std::move(replies));
    } else {
      finish(call, std::move(replies), -1, {});
    }
  }
  if (error.empty() && wait) {
    Reply r;
    error = read_reply(ctx_.get(), r, timeout);
    if (error.empty()) {
      const bool counted = r->type == REDIS_REPLY_INTEGER;
      const std::string why =
          counted ? std::string() : "WAIT for replicas failed: " + explain_server_error(reply_text(*r));
      for (auto& [call, replies] : waiting) {
        finish(*call, std::move(replies), counted ? r->integer : -1, why);
      }
      waiting.clear();
    }
  }
  if (error.empty()) return {};
  const std::string lost =
      "connection lost: " + error + " (the request was sent, so it may or may not have taken effect)";
  for (auto& [call, replies] : waiting) finish(*call, {}, -1, lost);
  for (std::size_t i = answered; i < batch.size(); ++i) finish(*batch[i], {}, -1, lost);
  return error;
}

void Connection::finish(Call& call, std::vector<Reply>&& replies, long long acked,
                        std::string error) {
  {
    std::lock_guard lock(call.mu_);
    if (call.state_ == Call::State::kAbandoned) return;
    call.replies = std::move(replies);
    call.replicas_acked = acked;
    call.error = std::move(error);
    call.state_ = Call::State::kDone;
  }
  // After unlocking, so the caller does not wake only to wait for the lock. The batch still
  // holds a reference, so the call outlives this even if its caller has already returned.
  call.cv_.notify_one();
}

void Connection::fail_queued(const std::string& reason) {
  for (const auto& call : queue_) finish(*call, {}, -1, reason);
  queue_.clear();
}

void Connection::broke(const std::string& reason) {
  ctx_.reset();
  up_.store(false, std::memory_order_release);
  last_error_ = reason;
  // The first attempt at once: a server that restarted is usually back.
  backoff_ = Duration{0};
  next_attempt_ = SteadyClock::now();
}

void Connection::execute(const std::shared_ptr<Call>& call, SteadyClock::time_point deadline,
                         Duration timeout) {
  load_.fetch_add(1, std::memory_order_relaxed);
  struct Unload {
    std::atomic<int>& load;
    ~Unload() { load.fetch_sub(1, std::memory_order_relaxed); }
  } unload{load_};
  std::unique_lock lock(mu_);
  if (!ctx_ || stop_) {
    call->error = "not connected (reconnecting in the background): " + last_error_;
    return;
  }
  if (!busy_ && queue_.empty()) {
    // Idle: make the round trip on this thread, which saves two thread hand-offs per call.
    busy_ = true;
    call->state_ = Call::State::kSent;  // not shared with any other thread yet
    lock.unlock();
    std::vector<std::shared_ptr<Call>> batch{call};
    const std::string error = round_trip(batch);
    lock.lock();
    busy_ = false;
    if (!error.empty()) broke(error);
    // Calls that queued meanwhile go out in the loop's next round trip.
    const bool wake = !queue_.empty() || !ctx_;
    lock.unlock();
    if (wake) cv_.notify_all();
    return;
  }
  queue_.push_back(call);
  const bool wake = !busy_;
  lock.unlock();
  // While a round trip is in flight its owner takes the queue afterwards: no wake-up needed.
  if (wake) cv_.notify_all();

  std::unique_lock call_lock(call->mu_);
  if (call->cv_.wait_until(call_lock, deadline,
                           [&] { return call->state_ == Call::State::kDone; })) {
    return;
  }
  const bool sent = call->state_ == Call::State::kSent;
  call->state_ = Call::State::kAbandoned;
  call->error = sent ? "timed out after " + ms(timeout) +
                           " waiting for the server's reply (the request was sent, so it may "
                           "or may not have taken effect)"
                     : "timed out after " + ms(timeout) + " before the request could be sent";
}

void Connection::loop() {
  std::vector<std::shared_ptr<Call>> batch;
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (!ctx_) {
      if (cv_.wait_until(lock, next_attempt_, [&] { return stop_; })) break;
      lock.unlock();
      std::string error;
      Context c = handshake(error, nullptr);
      lock.lock();
      if (c) {
        ctx_ = std::move(c);
        up_.store(true, std::memory_order_release);
        reconnects_.fetch_add(1, std::memory_order_relaxed);
      } else {
        last_error_ = error;
        backoff_ = backoff_ == Duration{0} ? kFirstBackoff : std::min(backoff_ * 2, kMaxBackoff);
        next_attempt_ = SteadyClock::now() + backoff_;
        fail_queued("not connected (reconnecting in the background): " + error);
      }
      continue;
    }
    cv_.wait(lock, [&] { return stop_ || !ctx_ || (!queue_.empty() && !busy_); });
    if (stop_ || !ctx_) continue;
    for (const auto& call : queue_) {
      std::lock_guard call_lock(call->mu_);
      // A call whose caller gave up before it was sent is not sent at all.
      if (call->state_ != Call::State::kQueued) continue;
      call->state_ = Call::State::kSent;
      batch.push_back(call);
    }
    queue_.clear();
    if (batch.empty()) continue;
    busy_ = true;
    lock.unlock();
    const std::string error = round_trip(batch);
    batch.clear();
    lock.lock();
    busy_ = false;
    if (!error.empty()) broke(error);
  }
}

// --- Pool ---------------------------------------------------------------------------------

Pool::Pool(ConnectionSettings settings, std::size_t connections, std::string store_name)
    : settings_(std::move(settings)), store_name_(std::move(store_name)) {
  for (std::size_t i = 0; i < connections; ++i) {
    connections_.push_back(std::make_unique<Connection>(settings_));
  }
}

Pool::~Pool() = default;

void Pool::connect(ScriptShas* shas) {
  for (std::size_t i = 0; i < connections_.size(); ++i) {
    const std::string error = connections_[i]->connect_now(i == 0 ? shas : nullptr);
    if (!error.empty()) throw StoreUnavailable(store_name_, error);
  }
  for (auto& c : connections_) c->start();
}

void Pool::execute(const std::shared_ptr<Call>& call, Duration timeout) {
  const auto deadline = SteadyClock::now() + timeout;
  const std::size_t n = connections_.size();
  const std::size_t first = next_.fetch_add(1, std::memory_order_relaxed) % n;
  Connection* chosen = connections_[first].get();
  int least = -1;
  for (std::size_t i = 0; i < n && least != 0; ++i) {
    Connection* c = connections_[(first + i) % n].get();
    if (!c->up()) continue;
    const int load = c->load();
    if (least < 0 || load < least) {
      chosen = c;
      least = load;
    }
  }
  chosen->execute(call, deadline, timeout);
  if (!call->error.empty()) throw StoreUnavailable(store_name_, call->error);
}

ConnectionStats Pool::stats() const {
  ConnectionStats total;
  for (const auto& c : connections_) {
    const ConnectionStats s = c->stats();
    total.round_trips += s.round_trips;
    total.commands += s.commands;
    total.reconnects += s.reconnects;
    total.queued += s.queued;
  }
  return total;
}

}  // namespace idem::redis
