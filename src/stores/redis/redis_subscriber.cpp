#include "stores/redis/redis_subscriber.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "stores/redis/redis_layout.h"

namespace idem::redis {
namespace {

// Reconnection after a failed attempt: 20 ms, doubling up to 1 s (a link that broke after
// working is opened again at once).
constexpr Duration kFirstBackoff{20};
constexpr Duration kMaxBackoff{1000};
// A link that said nothing for this long is PINGed; no answer within the I/O timeout
// breaks it (a server that vanished without closing the socket).
constexpr Duration kPingAfterSilence{5000};

std::string_view text_of(const redisReply& r) { return {r.str, r.len}; }

int ms_until(SteadyClock::time_point t) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(t - SteadyClock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, INT_MAX));
}

}  // namespace

struct Subscriber::State {
  std::mutex mu;
  // Each watched channel's callbacks; a channel is here while it has a watch.
  std::map<std::string, std::list<std::function<void()>>> channels;
  // Channels whose first watch came or last watch went since the thread last looked.
  std::set<std::string> dirty;
  std::string move_to;  // Sentinel: the primary announced, until the thread follows it
  bool stop = false;
  bool started = false;
  bool denied = false;
  int wake_fd = -1;

  State() {
    wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  }
  ~State() { ::close(wake_fd); }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  void wake() const noexcept {
    const std::uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof one);
  }
};

class Subscriber::Watch final : public RecordWatch {
 public:
  using Channel = std::map<std::string, std::list<std::function<void()>>>::iterator;
  Watch(std::shared_ptr<State> state, Channel channel,
        std::list<std::function<void()>>::iterator entry)
      : state_(std::move(state)), channel_(channel), entry_(entry) {}
  ~Watch() override {
    // Under the lock the thread calls callbacks with: once this returns, ours never runs.
    std::lock_guard lock(state_->mu);
    channel_->second.erase(entry_);
    if (!channel_->second.empty()) return;
    const std::string name = channel_->first;
    state_->channels.erase(channel_);
    if (state_->stop) return;
    state_->dirty.insert(name);
    state_->wake();
  }

 private:
  std::shared_ptr<State> state_;
  Channel channel_;
  std::list<std::function<void()>>::iterator entry_;
};

Subscriber::Subscriber(const ConnectionSettings& settings)
    : settings_(settings), state_(std::make_shared<State>()) {
  settings_.scripts.clear();
  settings_.wait_command.clear();
  // The pool's connections check the policy; a subscription stores nothing.
  settings_.refuse_eviction = false;
  settings_.client_name = "idem-redis-sub-" + std::to_string(::getpid());
}

Subscriber::~Subscriber() {
  {
    std::lock_guard lock(state_->mu);
    state_->stop = true;
    state_->wake();
  }
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<RecordWatch> Subscriber::watch(std::string channel, std::function<void()> changed) {
  std::lock_guard lock(state_->mu);
  if (state_->denied || state_->stop) return nullptr;
  auto [it, inserted] = state_->channels.try_emplace(std::move(channel));
  it->second.push_front(std::move(changed));
  auto watch = std::make_unique<Watch>(state_, it, it->second.begin());
  if (inserted) {
    state_->dirty.insert(it->first);
    state_->wake();
  }
  if (!state_->started) {
    state_->started = true;
    thread_ = std::thread([this] { loop(); });
    // Named here, not in the thread, so it has its name before anyone can look (top -H,
    // /proc/PID/task/*/comm). 15 characters at most.
    ::pthread_setname_np(thread_.native_handle(), "idem-redis-sub");
  }
  return watch;
}

void Subscriber::moved_to(const std::string& address) {
  std::lock_guard lock(state_->mu);
  state_->move_to = address;
  state_->wake();
}

SubscriberStats Subscriber::stats() const {
  SubscriberStats s;
  s.connects = connects_.load(std::memory_order_relaxed);
  s.reconnects = reconnects_.load(std::memory_order_relaxed);
  s.messages = messages_.load(std::memory_order_relaxed);
  s.channels = confirmed_.load(std::memory_order_relaxed);
  std::lock_guard lock(state_->mu);
  s.denied = state_->denied;
  return s;
}

bool Subscriber::wait_readable(int fd, int timeout_ms) {
  pollfd fds[2] = {{fd, POLLIN, 0}, {state_->wake_fd, POLLIN, 0}};  // a negative fd is ignored
  const int n = ::poll(fds, 2, timeout_ms);
  return n > 0 && (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) != 0;
}

void Subscriber::drain_wake() {
  std::uint64_t count = 0;
  (void)!::read(state_->wake_fd, &count, sizeof count);
}

void Subscriber::loop() {
  Duration backoff{0};
  bool connected_before = false;
  // Waits out `d`, unless the subscriber stops; false when it does.
  const auto pause = [this](Duration d) {
    const auto until = SteadyClock::now() + d;
    for (;;) {
      // Emptied before the state is read: a stop after the read wakes the poll below.
      drain_wake();
      {
        std::lock_guard lock(state_->mu);
        if (state_->stop) return false;
      }
      if (SteadyClock::now() >= until) return true;
      (void)wait_readable(-1, ms_until(until));
    }
  };
  for (;;) {
    drain_wake();
    bool denied = false;
    {
      std::lock_guard lock(state_->mu);
      if (state_->stop) return;
      denied = state_->denied;
      if (denied) {
        state_->dirty.clear();
      } else {
        state_->move_to.clear();
      }
    }
    if (denied) {
      // Nothing more to do until the store closes: its waiters poll.
      (void)wait_readable(-1, -1);
      continue;
    }
    std::string error;
    std::uint64_t generation = 0;
    Context link = open_link(settings_, error, nullptr, generation);
    if (link && settings_.switched && settings_.switched->generation() != generation) {
      continue;  // a +switch-master came meanwhile: to the primary it names
    }
    if (!link) {
      backoff = backoff == Duration{0} ? kFirstBackoff : std::min(backoff * 2, kMaxBackoff);
      if (!pause(backoff)) return;
      continue;
    }
    backoff = Duration{0};
    connects_.fetch_add(1, std::memory_order_relaxed);
    if (connected_before) reconnects_.fetch_add(1, std::memory_order_relaxed);
    connected_before = true;
    subscribed_.clear();
    {
      // Every channel again on this link; each confirmation calls its watches.
      std::lock_guard lock(state_->mu);
      for (const auto& [name, watches] : state_->channels) state_->dirty.insert(name);
    }
    (void)serve(*link);
    confirmed_.store(0, std::memory_order_relaxed);
  }
}

std::string Subscriber::serve(Link& link) {
  const int fd = link.hiredis->fd;
  std::string ping;
  CommandWriter(ping).begin(1).arg("PING");
  auto last_heard = SteadyClock::now();
  bool ping_out = false;
  for (;;) {
    // Emptied before the state is read: a change after this read wakes the poll below.
    drain_wake();
    {
      std::lock_guard lock(state_->mu);
      if (state_->stop) return {};
      if (!state_->move_to.empty() && state_->move_to != link.address) return {};
    }
    if (std::string e = sync(link); !e.empty()) return e;
    for (;;) {
      Reply r;
      if (std::string e = link_next_reply(link, r); !e.empty()) return e;
      if (!r) break;
      last_heard = SteadyClock::now();
      ping_out = false;
      if (std::string e = handle(*r); !e.empty()) return e;
    }
    const auto deadline = ping_out ? last_heard + kPingAfterSilence + settings_.io_timeout
                                   : last_heard + kPingAfterSilence;
    if (SteadyClock::now() >= deadline) {
      if (ping_out) {
        return "the server did not answer a PING within " +
               std::to_string(settings_.io_timeout.count()) + " ms";
      }
      if (std::string e = link_write(link, ping, settings_.io_timeout); !e.empty()) return e;
      ping_out = true;
      continue;
    }
    if (wait_readable(fd, ms_until(deadline))) {
      if (std::string e = link_receive(link); !e.empty()) return e;
    }
  }
}

std::string Subscriber::sync(Link& link) {
  std::string request;
  {
    std::lock_guard lock(state_->mu);
    if (state_->dirty.empty()) return {};
    for (const std::string& name : state_->dirty) {
      const bool wanted = state_->channels.count(name) != 0;
      const bool asked = subscribed_.count(name) != 0;
      // One channel per command: a command's channels must share a slot on a cluster.
      if (wanted && !asked) {
        CommandWriter(request).begin(2).arg("SSUBSCRIBE").arg(name);
        subscribed_.insert(name);
      } else if (!wanted && asked) {
        CommandWriter(request).begin(2).arg("SUNSUBSCRIBE").arg(name);
        subscribed_.erase(name);
      }
    }
    state_->dirty.clear();
  }
  if (request.empty()) return {};
  return link_write(link, request, settings_.io_timeout);
}

std::string Subscriber::handle(const redisReply& r) {
  if (r.type == REDIS_REPLY_ERROR) {
    // Redis Cluster: a channel whose slot is now served by another node. Its watches keep
    // polling (at the watched pace) until they end; the store subscribes new watches at
    // the slot's new primary.
    const std::string_view text = text_of(r);
    if (text.substr(0, 6) == "MOVED " || text.substr(0, 4) == "ASK ") return {};
    // SSUBSCRIBE refused (an ACL without the channel or the command): waiters poll.
    std::lock_guard lock(state_->mu);
    state_->denied = true;
    return "the server refused to subscribe: " + explain_server_error(text_of(r));
  }
  // ["smessage", channel, text], ["ssubscribe", channel, count], ["sunsubscribe", channel,
  // count] or ["pong", ""] (a plain PONG once nothing is subscribed).
  if (r.type != REDIS_REPLY_ARRAY || r.elements != 3 || r.element[0]->type != REDIS_REPLY_STRING ||
      r.element[1]->type != REDIS_REPLY_STRING) {
    return {};
  }
  const std::string_view kind = text_of(*r.element[0]);
  const bool message = kind == "smessage";
  if (!message && kind != "ssubscribe") {
    if (kind != "sunsubscribe") return {};
    if (r.element[2]->type == REDIS_REPLY_INTEGER) {
      confirmed_.store(static_cast<std::size_t>(std::max(0LL, r.element[2]->integer)),
                       std::memory_order_relaxed);
    }
    // The end of a subscription this link asked to end, or, on Redis Cluster, one the
    // server ended because the channel's slot moved to another node: a channel that still
    // has watches was not asked to end, so they ask the store again now (the record may
    // have changed meanwhile) and poll from then on.
  }
  if (message) {
    messages_.fetch_add(1, std::memory_order_relaxed);
  } else if (r.element[2]->type == REDIS_REPLY_INTEGER) {
    confirmed_.store(static_cast<std::size_t>(std::max(0LL, r.element[2]->integer)),
                     std::memory_order_relaxed);
  }
  // A message, or a subscription now in force (a publish may have come before it): the
  // channel's watches ask the store again.
  std::lock_guard lock(state_->mu);
  const auto it = state_->channels.find(std::string(text_of(*r.element[1])));
  if (it == state_->channels.end()) return {};
  for (const auto& changed : it->second) changed();
  return {};
}

}  // namespace idem::redis
