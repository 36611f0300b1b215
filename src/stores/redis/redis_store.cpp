#include "idem/stores/redis_store.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <shared_mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "idem/error.h"
#include "stores/kit/url_params.h"
#include "stores/redis/redis_connection.h"
#include "stores/redis/redis_layout.h"
#include "stores/redis/redis_scripts.h"
#include "stores/redis/redis_subscriber.h"
#include "stores/redis/redis_url.h"

namespace idem {
namespace {

using redis::Call;
using redis::CommandWriter;
using redis::Reply;
using redis::ScriptId;

constexpr std::size_t kMaxConnections = 64;

Timestamp at_ms(std::int64_t ms) { return Timestamp(Duration(ms)); }

std::string token_text(Token token) {
  char digits[24];
  auto [end, ec] = std::to_chars(digits, digits + sizeof digits, token);
  (void)ec;
  return std::string(digits, end);
}

std::string_view text_of(const redisReply& r) { return {r.str, r.len}; }

// TIME's reply (seconds and microseconds, as text) in milliseconds; nullopt if malformed.
std::optional<std::int64_t> server_ms(const redisReply& r) {
  if (r.type != REDIS_REPLY_ARRAY || r.elements != 2) return std::nullopt;
  std::int64_t part[2] = {0, 0};
  for (std::size_t i = 0; i < 2; ++i) {
    const redisReply& e = *r.element[i];
    if (e.type != REDIS_REPLY_STRING) return std::nullopt;
    const auto [end, ec] = std::from_chars(e.str, e.str + e.len, part[i]);
    if (ec != std::errc{} || end != e.str + e.len) return std::nullopt;
  }
  return part[0] * 1000 + part[1] / 1000;
}

bool is_error(const Reply& r, std::string_view code) {
  return r->type == REDIS_REPLY_ERROR && text_of(*r).substr(0, code.size()) == code;
}

std::string host_port(const std::string& host, int port) {
  return (host.find(':') == std::string::npos ? host : "[" + host + "]") + ":" +
         std::to_string(port);
}

// The store's URL without secrets: the password is "***", TLS files are not named.
std::string describe_options(const RedisStoreOptions& o) {
  std::string userinfo;
  if (!o.password.empty()) {
    userinfo = o.user + ":***@";
  } else if (!o.user.empty()) {
    userinfo = o.user + "@";
  }
  if (!o.socket.empty()) {
    return "unix://" + userinfo + o.socket + (o.db != 0 ? "?db=" + std::to_string(o.db) : "");
  }
  std::string query;
  if (o.tls && !o.tls_verify) query += "&tls_verify=off";
  if (o.tls && !o.tls_server_name.empty()) query += "&tls_server_name=" + o.tls_server_name;
  if (!query.empty()) query[0] = '?';
  const std::string scheme = o.tls ? "rediss" : "redis";
  if (o.topology == RedisTopology::kStandalone) {
    return scheme + "://" + userinfo + host_port(o.host, o.port) + "/" + std::to_string(o.db) +
           query;
  }
  std::string hosts;
  for (const auto& [h, p] : o.addresses) hosts += (hosts.empty() ? "" : ",") + host_port(h, p);
  if (o.topology == RedisTopology::kSentinel) {
    return scheme + "+sentinel://" + userinfo + hosts + "/" + o.service + query;
  }
  return scheme + "+cluster://" + userinfo + hosts + query;
}

void validate(const RedisStoreOptions& o) {
  auto positive = [](const char* name, Duration d) {
    if (d <= Duration::zero() || d > kMaxDuration) {
      throw InvalidArgument(name,
                            "must be 1 ms to 365 days, got " + std::to_string(d.count()) + " ms");
    }
  };
  if (o.prefix.find_first_of("{}") != std::string::npos) {
    throw InvalidArgument("Redis key prefix",
                          "must not contain '{' or '}' (each record key carries its own hash tag)");
  }
  if (o.topology == RedisTopology::kStandalone) {
    if (o.socket.empty() && o.host.empty())
      throw InvalidArgument("Redis host", "must not be empty");
    if (o.socket.empty() && (o.port <= 0 || o.port > 65535)) {
      throw InvalidArgument("Redis port", "must be 1 to 65535, got " + std::to_string(o.port));
    }
  } else {
    if (o.addresses.empty()) {
      throw InvalidArgument("Redis addresses", o.topology == RedisTopology::kSentinel
                                                   ? "give at least one sentinel"
                                                   : "give at least one seed node");
    }
    for (const auto& [h, p] : o.addresses) {
      if (h.empty() || p <= 0 || p > 65535) {
        throw InvalidArgument("Redis addresses", "each needs a host and a port 1 to 65535, got '" +
                                                     h + ":" + std::to_string(p) + "'");
      }
    }
    if (!o.socket.empty()) {
      throw InvalidArgument("Redis socket", "Sentinel and Cluster connect over TCP only");
    }
    if (o.topology == RedisTopology::kSentinel && o.service.empty()) {
      throw InvalidArgument("Redis sentinel service", "must not be empty (the primary's name)");
    }
    if (o.topology == RedisTopology::kCluster && o.db != 0) {
      throw InvalidArgument("Redis database", "Redis Cluster has only database 0");
    }
  }
  if (o.tls && !o.socket.empty()) {
    throw InvalidArgument("Redis TLS", "not over a unix socket (use rediss:// with a host)");
  }
  if (o.db < 0) throw InvalidArgument("Redis database", "must not be negative");
  if (o.connections == 0 || o.connections > kMaxConnections) {
    throw InvalidArgument("Redis connections", "must be 1 to " + std::to_string(kMaxConnections) +
                                                   ", got " + std::to_string(o.connections));
  }
  positive("Redis timeout", o.timeout);
  positive("Redis connect timeout", o.connect_timeout);
  if (o.wait_replicas < 0) throw InvalidArgument("Redis wait_replicas", "must not be negative");
  if (o.wait_replicas > 0) positive("Redis wait timeout", o.wait_timeout);
}

// Redis Cluster: for each hash slot, a short text whose slot it is (the decimal number
// found first by counting up), so the token key of a slot is PREFIX "tokens{" tag "}".
const std::vector<std::string>& slot_tags() {
  static const std::vector<std::string> tags = [] {
    std::vector<std::string> t(redis::kHashSlots);
    std::size_t left = redis::kHashSlots;
    for (std::uint64_t n = 0; left > 0; ++n) {
      std::string text = std::to_string(n);
      std::string& slot = t[redis::hash_slot(text)];
      if (slot.empty()) {
        slot = std::move(text);
        --left;
      }
    }
    return t;
  }();
  return tags;
}

// A MOVED or ASK error's target: "MOVED 3999 127.0.0.1:6381" -> slot and "host:port".
bool parse_redirect(std::string_view text, unsigned& slot, std::string& node) {
  const std::size_t a = text.find(' ');
  const std::size_t b = a == std::string_view::npos ? a : text.find(' ', a + 1);
  if (b == std::string_view::npos) return false;
  const std::string_view number = text.substr(a + 1, b - a - 1);
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), slot);
  if (ec != std::errc{} || slot >= redis::kHashSlots) return false;
  node = std::string(text.substr(b + 1));
  return !node.empty();
}

// "host:port" -> host and port (the host may be an IPv6 address: the port is after the
// last colon).
bool split_node(const std::string& node, std::string& host, int& port) {
  const std::size_t c = node.rfind(':');
  if (c == std::string::npos || c == 0) return false;
  host = node.substr(0, c);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const auto [end, ec] = std::from_chars(node.data() + c + 1, node.data() + node.size(), port);
  return ec == std::errc{} && end == node.data() + node.size() && port > 0;
}

// Redirections a call follows at once; after these it pauses between rounds (see
// run_cluster), until the call's timeout.
constexpr int kRedirectionsAtOnce = 4;
constexpr Duration kMinRefreshInterval{100};

}  // namespace

struct RedisStore::Impl {
  // A record's Redis key, and the record it holds.
  struct RecordRef {
    std::string_view scope;
    std::string_view key;
  };

  struct Outcome {
    std::vector<Reply> replies;
    long long replicas_acked = -1;
  };

  RedisStoreOptions o;
  std::string describe;
  std::string token_key;  // redis_layout.h
  redis::ScriptShas shas;
  Duration call_timeout;              // with WAIT's timeout when the store waits for replicas
  std::unique_ptr<redis::Pool> pool;  // standalone and Sentinel
  std::atomic<std::uint64_t> script_reloads{0};

  // Redis Cluster: a pool per node, created when a slot first leads to it; each slot's
  // primary as "host:port" (empty: unknown), from CLUSTER SLOTS and MOVED answers.
  bool cluster = false;
  redis::ConnectionSettings node_settings;  // host and port set per node
  mutable std::shared_mutex nodes_mu;
  std::map<std::string, std::unique_ptr<redis::Pool>> pools;
  std::vector<std::string> slot_owner;
  // Each slot's pool once a call has looked it up (null: look up slot_owner).
  std::vector<redis::Pool*> slot_pool;
  std::mutex refresh_mu;
  std::atomic<bool> map_stale{false};
  redis::SteadyClock::time_point last_refresh{};
  std::atomic<std::uint64_t> redirections{0};
  bool shas_loaded = false;

  // SPEC §7: the scripts' last argument, "1" when complete, release and forget publish on
  // the record's key, and the subscriber behind watch() (redis_subscriber.h).
  std::string notify_flag;
  std::unique_ptr<redis::Subscriber> subscriber;
  // Redis Cluster: a subscriber per primary, made when a watch first leads to it (under
  // subscribers_mu); a watch subscribes at its record's slot's primary.
  std::mutex subscribers_mu;
  std::map<std::string, std::unique_ptr<redis::Subscriber>> node_subscribers;

  explicit Impl(RedisStoreOptions options) : o(std::move(options)) {
    validate(o);
    describe = describe_options(o);
    token_key = redis::token_key(o.prefix);
    call_timeout = o.timeout + (o.wait_replicas > 0 ? o.wait_timeout : Duration{0});
    redis::ConnectionSettings s;
    s.host = o.host;
    s.port = o.port;
    s.socket = o.socket;
    if (o.tls) {
      s.tls = redis::TlsSettings{o.tls_ca_file,  o.tls_ca_dir,      o.tls_cert_file,
                                 o.tls_key_file, o.tls_server_name, o.tls_verify};
      s.tls_context = redis::make_tls_context(s.tls);
    }
    if (o.topology == RedisTopology::kSentinel) {
      s.sentinels = o.addresses;
      s.sentinel_service = o.service;
    }
    s.user = o.user;
    s.password = o.password;
    s.db = o.db;
    s.connect_timeout = o.connect_timeout;
    s.io_timeout = call_timeout;
    s.refuse_eviction = !o.allow_eviction;
    if (o.read_only) {
      s.scripts = {redis::kPeek};
    } else {
      s.scripts = {redis::kAcquire, redis::kComplete, redis::kDelete, redis::kExtend, redis::kPeek};
    }
    if (o.wait_replicas > 0) {
      CommandWriter(s.wait_command)
          .begin(3)
          .arg("WAIT")
          .arg(std::int64_t{o.wait_replicas})
          .arg(static_cast<std::int64_t>(o.wait_timeout.count()));
    }
    if (o.topology == RedisTopology::kCluster) {
      cluster = true;
      slot_owner.resize(redis::kHashSlots);
      slot_pool.assign(redis::kHashSlots, nullptr);
      (void)slot_tags();
      node_settings = std::move(s);
      refresh_slots(/*at_open=*/true);
      if (o.notify) start_notifying_cluster();
      return;
    }
    pool = std::make_unique<redis::Pool>(std::move(s), o.connections, describe);
    pool->connect(&shas);
    if (o.notify) start_notifying();
  }

  ~Impl() {
    // The subscribers go first, and the pool's Sentinel watch stops calling them before.
    if (pool) pool->on_switch({});
    subscriber.reset();
    node_subscribers.clear();
  }

  // One SPUBLISH on a channel nobody listens to, shaped like a record's key (so an ACL that
  // grants the records' channels grants it): an error (a server before Redis 7, an ACL that
  // denies SPUBLISH or the channel) leaves the store polling only.
  void start_notifying() {
    auto call = std::make_shared<Call>();
    CommandWriter(call->request)
        .begin(3)
        .arg("SPUBLISH")
        .arg(redis::record_key(o.prefix, "idem", "notify-check"))
        .arg("");
    call->commands = 1;
    try {
      pool->execute(call, call_timeout);
    } catch (const StoreUnavailable&) {
      return;
    }
    if (call->replies.empty() || call->replies.front()->type != REDIS_REPLY_INTEGER) return;
    try {
      subscriber = std::make_unique<redis::Subscriber>(pool->settings());
    } catch (const std::system_error&) {
      return;  // no eventfd: the store polls
    }
    notify_flag = "1";
    if (o.topology == RedisTopology::kSentinel) {
      redis::Subscriber* sub = subscriber.get();
      pool->on_switch([sub](const std::string& address) { sub->moved_to(address); });
    }
  }

  // Redis Cluster: the same check, at the primary of the check key's slot. The scripts
  // publish on the record's key, which hashes to the record's slot, so each publish goes
  // out on the node that holds the record.
  void start_notifying_cluster() {
    const RecordRef check{"idem", "notify-check"};
    Outcome out;
    try {
      out = run_cluster(
          1,
          [&](std::string& request, std::size_t, bool) {
            CommandWriter(request)
                .begin(3)
                .arg("SPUBLISH")
                .arg(redis::record_key(o.prefix, check.scope, check.key))
                .arg("");
          },
          [&](std::size_t) { return check; }, /*wait_replicas=*/false);
    } catch (const StoreUnavailable&) {
      return;
    }
    if (out.replies.empty() || out.replies.front()->type != REDIS_REPLY_INTEGER) return;
    notify_flag = "1";
  }

  // The subscriber at the primary of `r`'s slot. Throws StoreUnavailable (no primary) and
  // std::system_error (no eventfd).
  redis::Subscriber& node_subscriber(RecordRef r) {
    const std::string node = owner_of(slot_of(r));
    std::lock_guard lock(subscribers_mu);
    std::unique_ptr<redis::Subscriber>& sub = node_subscribers[node];
    if (!sub) {
      redis::ConnectionSettings s = node_settings;
      if (!split_node(node, s.host, s.port)) fail("the cluster named a node as '" + node + "'");
      sub = std::make_unique<redis::Subscriber>(s);
    }
    return *sub;
  }

  // --- Redis Cluster ----------------------------------------------------------------------

  // The pool of node "host:port", connected on first use. Throws StoreUnavailable.
  redis::Pool& pool_for(const std::string& node) {
    {
      std::shared_lock lock(nodes_mu);
      if (auto it = pools.find(node); it != pools.end()) return *it->second;
    }
    redis::ConnectionSettings s = node_settings;
    if (!split_node(node, s.host, s.port)) fail("the cluster named a node as '" + node + "'");
    auto p = std::make_unique<redis::Pool>(std::move(s), o.connections,
                                           describe + " (node " + node + ")");
    redis::ScriptShas loaded;
    p->connect(&loaded);  // outside the lock: a slow node must not stall the others
    std::unique_lock lock(nodes_mu);
    if (!shas_loaded) {  // the first node, at open, before any other thread
      shas = loaded;
      shas_loaded = true;
    }
    auto [it, inserted] = pools.emplace(node, std::move(p));
    return *it->second;
  }

  // Reads the slot map (CLUSTER SLOTS) from a node that answers: the known nodes first,
  // then the seeds of the URL. Throws StoreUnavailable when none does.
  void refresh_slots(bool at_open = false) {
    std::lock_guard refresh(refresh_mu);
    std::vector<std::string> candidates;
    if (!at_open) {
      std::shared_lock lock(nodes_mu);
      for (const auto& [node, p] : pools) candidates.push_back(node);
    }
    for (const auto& [h, p] : o.addresses) candidates.push_back(host_port(h, p));
    std::string failures;
    for (const std::string& node : candidates) {
      try {
        redis::Pool& p = pool_for(node);
        auto call = std::make_shared<Call>();
        CommandWriter(call->request).begin(2).arg("CLUSTER").arg("SLOTS");
        call->commands = 1;
        p.execute(call, call_timeout);
        const redisReply& r = *call->replies.front();
        if (r.type != REDIS_REPLY_ARRAY) {
          failures +=
              "; " + node + ": " +
              (r.type == REDIS_REPLY_ERROR ? redis::explain_server_error(text_of(r))
                                           : std::string("unexpected reply to CLUSTER SLOTS"));
          continue;
        }
        std::vector<std::string> owner(redis::kHashSlots);
        std::string node_host;
        int node_port = 0;
        split_node(node, node_host, node_port);
        for (std::size_t i = 0; i < r.elements; ++i) {
          const redisReply& range = *r.element[i];
          if (range.type != REDIS_REPLY_ARRAY || range.elements < 3 ||
              range.element[0]->type != REDIS_REPLY_INTEGER ||
              range.element[1]->type != REDIS_REPLY_INTEGER ||
              range.element[2]->type != REDIS_REPLY_ARRAY || range.element[2]->elements < 2) {
            continue;
          }
          const redisReply& primary = *range.element[2];
          std::string host = primary.element[0]->type == REDIS_REPLY_STRING
                                 ? std::string(text_of(*primary.element[0]))
                                 : std::string();
          if (host.empty() || host == "?") host = node_host;  // "the node you asked"
          const std::string name = host_port(host, static_cast<int>(primary.element[1]->integer));
          const long long first = range.element[0]->integer;
          const long long last = range.element[1]->integer;
          for (long long slot = std::max(first, 0LL);
               slot <= last && slot < static_cast<long long>(redis::kHashSlots); ++slot) {
            owner[static_cast<std::size_t>(slot)] = name;
          }
        }
        std::unique_lock lock(nodes_mu);
        slot_owner = std::move(owner);
        std::fill(slot_pool.begin(), slot_pool.end(), nullptr);
        last_refresh = redis::SteadyClock::now();
        map_stale.store(false, std::memory_order_relaxed);
        return;
      } catch (const StoreUnavailable& e) {
        failures += "; " + node + ": " + e.reason();
      }
    }
    {
      std::unique_lock lock(nodes_mu);
      last_refresh = redis::SteadyClock::now();
    }
    fail("cannot read the cluster's slot map (CLUSTER SLOTS) from any node" +
         (failures.empty() ? std::string() : " (" + failures.substr(2) + ")"));
  }

  // Refreshes the map when a MOVED or a failed node made it stale, at most every 100 ms.
  void refresh_if_stale() {
    if (!map_stale.load(std::memory_order_relaxed)) return;
    {
      std::shared_lock lock(nodes_mu);
      if (redis::SteadyClock::now() - last_refresh < kMinRefreshInterval) return;
    }
    try {
      refresh_slots();
    } catch (const StoreUnavailable&) {
      // The call that follows fails or succeeds on its own; the map stays stale.
    }
  }

  std::string owner_of(unsigned slot) {
    {
      std::shared_lock lock(nodes_mu);
      if (!slot_owner[slot].empty()) return slot_owner[slot];
    }
    refresh_slots();
    std::shared_lock lock(nodes_mu);
    if (slot_owner[slot].empty()) {
      fail("hash slot " + std::to_string(slot) +
           " has no primary in the cluster's slot map (the cluster is down or being set up)");
    }
    return slot_owner[slot];
  }

  // The pool of the slot's primary (owner_of, then pool_for), remembered for the next call
  // until the map changes. Throws StoreUnavailable.
  redis::Pool& owner_pool(unsigned slot) {
    {
      std::shared_lock lock(nodes_mu);
      if (slot_pool[slot] != nullptr) return *slot_pool[slot];
    }
    const std::string node = owner_of(slot);
    redis::Pool& p = pool_for(node);
    std::unique_lock lock(nodes_mu);
    if (slot_owner[slot] == node) slot_pool[slot] = &p;
    return p;
  }

  unsigned slot_of(RecordRef r) const { return redis::record_slot(o.prefix, r.scope, r.key); }

  // Sends command i (written by append, for record record_of(i)) to the primary of its
  // slot: one pipeline per node, following MOVED (the slot moved: the map is updated and
  // refreshed), ASK (a migration: ASKING then the command, once, on the target), TRYAGAIN
  // (a migration in progress: again after a pause) and NOSCRIPT (again with the body).
  template <typename Append, typename RecordOf>
  Outcome run_cluster(std::size_t n, const Append& append, const RecordOf& record_of,
                      bool wait_replicas) {
    refresh_if_stale();
    Outcome out;
    out.replies.resize(n);
    const bool wait = wait_replicas && o.wait_replicas > 0;
    long long acked = std::numeric_limits<long long>::max();
    std::vector<unsigned> slots(n);
    for (std::size_t i = 0; i < n; ++i) slots[i] = slot_of(record_of(i));
    std::vector<redis::Pool*> ask(n, nullptr);  // ASK: the node to ask once, with ASKING
    std::vector<char> by_body(n, 0);
    std::vector<std::size_t> pending(n);
    std::iota(pending.begin(), pending.end(), std::size_t{0});
    std::string last_redirect;
    int redirected = 0;  // rounds with a MOVED or ASK
    const auto deadline = redis::SteadyClock::now() + call_timeout;
    std::vector<std::pair<redis::Pool*, std::vector<std::size_t>>> groups;  // by node
    for (int round = 0; !pending.empty(); ++round) {
      groups.clear();
      for (const std::size_t i : pending) {
        redis::Pool* node = ask[i] != nullptr ? ask[i] : &owner_pool(slots[i]);
        auto group = std::find_if(groups.begin(), groups.end(),
                                  [&](const auto& g) { return g.first == node; });
        if (group == groups.end()) group = groups.insert(groups.end(), {node, {}});
        group->second.push_back(i);
      }
      std::vector<std::size_t> next;
      bool pause = false;
      bool redirect = false;
      for (const auto& [node, indexes] : groups) {
        auto call = std::make_shared<Call>();
        for (const std::size_t i : indexes) {
          if (ask[i] != nullptr) {
            CommandWriter(call->request).begin(1).arg("ASKING");
            ++call->commands;
          }
          append(call->request, i, by_body[i] != 0);
          ++call->commands;
        }
        call->wait_replicas = wait;
        try {
          node->execute(call, call_timeout);
        } catch (const StoreUnavailable&) {
          // The node may have failed over: read the map again before the next call.
          map_stale.store(true, std::memory_order_relaxed);
          throw;
        }
        // A WAIT refused next to a MOVED: the node was demoted by a cluster failover (a
        // replica answers MOVED to every command on a key and refuses WAIT), so nothing
        // ran there. Every command of the group goes again, to its slot's new primary;
        // those with no redirection (TIME) too, since no WAIT counts for them. A WAIT
        // refused otherwise fails the call, as before.
        const bool demoted = !call->wait_error.empty() &&
                             std::any_of(call->replies.begin(), call->replies.end(),
                                         [](const Reply& r) { return is_error(r, "MOVED "); });
        if (!call->wait_error.empty() && !demoted) {
          map_stale.store(true, std::memory_order_relaxed);
          fail(call->wait_error);
        }
        if (demoted) {
          map_stale.store(true, std::memory_order_relaxed);
          last_redirect = call->wait_error;
          redirect = true;
        }
        // WAIT's count matters for the round only when a command of it is answered here:
        // a round that was all redirected wrote nothing.
        bool kept = false;
        std::size_t k = 0;
        for (const std::size_t i : indexes) {
          if (ask[i] != nullptr) ++k;  // ASKING's +OK
          Reply& r = call->replies[k++];
          unsigned slot = 0;
          std::string target;
          if (is_error(r, "MOVED ") && parse_redirect(text_of(*r), slot, target)) {
            {
              std::unique_lock lock(nodes_mu);
              slot_owner[slot] = target;
              slot_pool[slot] = nullptr;
            }
            map_stale.store(true, std::memory_order_relaxed);
            ask[i] = nullptr;
            last_redirect = std::string(text_of(*r));
            redirections.fetch_add(1, std::memory_order_relaxed);
            redirect = true;
            next.push_back(i);
          } else if (is_error(r, "ASK ") && parse_redirect(text_of(*r), slot, target)) {
            ask[i] = &pool_for(target);
            last_redirect = std::string(text_of(*r));
            redirections.fetch_add(1, std::memory_order_relaxed);
            redirect = true;
            next.push_back(i);
          } else if (is_error(r, "TRYAGAIN")) {
            ask[i] = nullptr;
            pause = true;
            last_redirect = std::string(text_of(*r));
            next.push_back(i);
          } else if (is_error(r, "NOSCRIPT") && by_body[i] == 0) {
            by_body[i] = 1;
            script_reloads.fetch_add(1, std::memory_order_relaxed);
            next.push_back(i);
          } else if (demoted) {
            ask[i] = nullptr;
            next.push_back(i);
          } else {
            ask[i] = nullptr;
            out.replies[i] = std::move(r);
            kept = true;
          }
        }
        if (wait && kept) acked = std::min(acked, call->replicas_acked);
      }
      pending = std::move(next);
      if (redirect) ++redirected;
      // TRYAGAIN: the acquire script's two keys (the record and its slot's token key) are
      // split between the two nodes of a slot being migrated. MOVED back and forth: the
      // migration is ending, and one of its nodes already names the other as the slot's
      // owner while the other does not know yet (the tool that migrates tells them one
      // after the other; the rest of the cluster learns by gossip). Either way, again
      // after a pause, until the migration ends, within the call's timeout.
      if ((pause || (redirect && redirected > kRedirectionsAtOnce)) && !pending.empty()) {
        if (redis::SteadyClock::now() >= deadline) {
          fail(pause ? "the hash slot stayed in migration for longer than the call's timeout (" +
                           std::to_string(call_timeout.count()) + " ms): " + last_redirect
                     : "still redirected after " + std::to_string(redirected) +
                           " tries within the call's timeout (" +
                           std::to_string(call_timeout.count()) +
                           " ms; the cluster's slots keep moving): " + last_redirect);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(5 * (round + 1), 50)));
      }
    }
    out.replicas_acked = wait ? acked : -1;
    return out;
  }

  [[noreturn]] void fail(const std::string& why) const { throw StoreUnavailable(describe, why); }

  // The key holds something other than an idem record: named, with the record it stands
  // for, never read as one (the other stores refuse a foreign database the same way).
  [[noreturn]] void foreign(std::string_view step, RecordRef r, std::string_view what) const {
    throw StoreUnavailable(
        describe,
        std::string(step) + ": not an idem record: the Redis key \"" +
            printable(redis::record_key(o.prefix, r.scope, r.key), 200) + "\" holds " +
            std::string(what) +
            "; another program writes under idem's key prefix, or another version of idem "
            "wrote it. Give idem a prefix of its own (prefix= in the store URL), or delete "
            "the key (idem forget)",
        ::idem::RecordRef{r.scope, r.key});
  }

  [[noreturn]] void bad_reply(std::string_view step, const redisReply& r,
                              std::optional<RecordRef> record = std::nullopt) const {
    if (r.type == REDIS_REPLY_ERROR) {
      const std::string_view text = text_of(r);
      if (record && text.substr(0, 9) == "WRONGTYPE") {
        foreign(step, *record, "a Redis value of another type (WRONGTYPE)");
      }
      if (record && text.find("not an idem record") != std::string_view::npos) {
        foreign(step, *record, "a value idem did not write");
      }
      if (text.find("not an idem token key") != std::string_view::npos) {
        throw StoreUnavailable(
            describe,
            std::string(step) + ": the store's token key \"" + printable(token_key, 200) +
                "\" holds a value idem did not write; another program writes under idem's key "
                "prefix. Give idem a prefix of its own (prefix= in the store URL)",
            record ? ::idem::RecordRef{record->scope, record->key} : ::idem::RecordRef{});
      }
      fail(std::string(step) + ": " + redis::explain_server_error(text));
    }
    fail(std::string(step) + ": unexpected reply from the server (type " + std::to_string(r.type) +
         ")");
  }

  void refuse_write(std::string_view step) const {
    if (o.read_only) fail(std::string(step) + " needs a write, and the store was opened read-only");
  }

  // A record's Redis key, written straight into a request.
  void append_key(CommandWriter& w, RecordRef r) const {
    w.arg_of(redis::record_key_size(o.prefix, r.scope, r.key),
             [&](std::string& out) { redis::append_record_key(out, o.prefix, r.scope, r.key); });
  }

  // EVALSHA of a script on one record key (and the token key, for acquire), or EVAL with
  // its body once the server said it has lost it (NOSCRIPT).
  template <typename... Args>
  void append_script(std::string& out, ScriptId id, bool by_body, RecordRef record,
                     const Args&... args) const {
    const bool tokens = id == redis::kAcquire;
    CommandWriter w(out);
    w.begin(4 + (tokens ? 1 : 0) + sizeof...(args))
        .arg(by_body ? "EVAL" : "EVALSHA")
        .arg(by_body ? std::string_view(redis::kScripts[id]->body) : std::string_view(shas[id]))
        .arg(tokens ? "2" : "1");
    append_key(w, record);
    if (tokens) {
      if (cluster) {
        // The token key of the record's slot: a script touches one slot only.
        const std::string& tag = slot_tags()[slot_of(record)];
        w.arg_of(token_key.size() + tag.size() + 2,
                 [&](std::string& o) { o.append(token_key).append("{").append(tag).append("}"); });
      } else {
        w.arg(token_key);
      }
    }
    (w.arg(args), ...);
  }

  // Sends `n` commands, the i-th written by append(out, i, by_body), as one call (one
  // round trip unless the server has lost a script). Throws StoreUnavailable.
  // On Redis Cluster, command i goes to the primary of record_of(i)'s slot (run_cluster).
  template <typename Append, typename RecordOf>
  Outcome run(std::size_t n, const Append& append, const RecordOf& record_of,
              bool wait_replicas = false) {
    if (cluster) return run_cluster(n, append, record_of, wait_replicas);
    auto call = std::make_shared<Call>();
    for (std::size_t i = 0; i < n; ++i) append(call->request, i, false);
    call->commands = n;
    call->wait_replicas = wait_replicas && o.wait_replicas > 0;
    pool->execute(call, call_timeout);
    if (!call->wait_error.empty()) fail(call->wait_error);
    Outcome out{std::move(call->replies), call->replicas_acked};
    // NOSCRIPT: the server lost its script cache (SCRIPT FLUSH, or a failover to a replica
    // that never loaded them) while we were connected. Nothing ran; send those commands
    // again with the script's body, which also caches it for the EVALSHAs that follow.
    std::vector<std::size_t> lost;
    for (std::size_t i = 0; i < out.replies.size(); ++i) {
      if (is_error(out.replies[i], "NOSCRIPT")) lost.push_back(i);
    }
    if (lost.empty()) return out;
    script_reloads.fetch_add(lost.size(), std::memory_order_relaxed);
    auto retry = std::make_shared<Call>();
    for (const std::size_t i : lost) append(retry->request, i, true);
    retry->commands = lost.size();
    retry->wait_replicas = call->wait_replicas;
    pool->execute(retry, call_timeout);
    if (!retry->wait_error.empty()) fail(retry->wait_error);
    for (std::size_t k = 0; k < lost.size(); ++k) {
      out.replies[lost[k]] = std::move(retry->replies[k]);
    }
    out.replicas_acked = std::min(out.replicas_acked, retry->replicas_acked);
    return out;
  }

  Reply run_one(ScriptId id, RecordRef key, const auto&... args) {
    return std::move(run(
                         1,
                         [&](std::string& out, std::size_t, bool by_body) {
                           append_script(out, id, by_body, key, args...);
                         },
                         [&](std::size_t) { return key; })
                         .replies.front());
  }

  // A write that the caller asked to see on replicas: fewer of them in time fails the call.
  // `unconfirmed`: the write stays on this server (error.h: a read of it proves nothing).
  void check_replicas(std::string_view step, long long acked, bool unconfirmed) const {
    if (o.wait_replicas > 0 && acked < o.wait_replicas) {
      throw StoreUnavailable(
          describe,
          std::string(step) + ": only " + std::to_string(std::max(acked, 0LL)) + " of " +
              std::to_string(o.wait_replicas) + " replicas acknowledged the write within " +
              std::to_string(o.wait_timeout.count()) +
              " ms (WAIT); the write is on the primary but a failover could lose it",
          {}, unconfirmed);
    }
  }

  redis::StoredRecord decode(std::string_view step, const redisReply& r, char kind,
                             RecordRef record) const {
    std::optional<redis::StoredRecord> rec = redis::decode_record(text_of(r));
    if (!rec || rec->kind != kind) foreign(step, record, "a value idem did not write");
    return *rec;
  }

  static std::optional<std::string> owned(std::optional<std::string_view> v) {
    if (!v) return std::nullopt;
    return std::string(*v);
  }

  Replay replay_of(const redis::StoredRecord& rec) const {
    return Replay{std::string(rec.payload), at_ms(rec.at), at_ms(rec.expires_at),
                  owned(rec.fingerprint)};
  }

  // A stored result handed to a caller must be one that a failover cannot lose, like a
  // result reported recorded: the complete that wrote it may have been told "may or may not
  // have been recorded" because the replicas never confirmed it, and a failover then brings
  // back its IN_PROGRESS record, whose lease runs out and lets the action run again. With
  // wait_replicas, the WAIT in the replay's round trip (it counts every write the primary had
  // taken when it ran, that complete among them) must have been answered by enough replicas.
  Replay confirmed_replay(const redis::StoredRecord& rec, long long acked) const {
    if (o.wait_replicas > 0 && acked < o.wait_replicas) {
      throw StoreUnavailable(
          describe, "acquire: the key's result is on the primary, but only " +
                        std::to_string(std::max(acked, 0LL)) + " of " +
                        std::to_string(o.wait_replicas) + " replicas acknowledged it within " +
                        std::to_string(o.wait_timeout.count()) +
                        " ms (WAIT); it is not replayed, since a failover could lose it");
    }
    return replay_of(rec);
  }

  Busy busy_of(const redis::StoredRecord& rec, std::int64_t now) const {
    return Busy{at_ms(rec.lease_expires_at), Duration(rec.lease_expires_at - now),
                owned(rec.fingerprint)};
  }

  AcquireResult acquire_read_only(RecordRef key) {
    const Reply r = run_one(redis::kPeek, key);
    const auto [now, rec] = peeked("acquire", r, key);
    if (rec && rec->kind == redis::kKindComplete && rec->expires_at > now) return replay_of(*rec);
    if (rec && rec->kind == redis::kKindInProgress && rec->lease_expires_at > now) {
      return busy_of(*rec, now);
    }
    fail(
        "acquire needs a write here (the key is absent, expired or abandoned), and the store "
        "was opened read-only");
  }

  // The peek script's reply: the server's now and the record, if any.
  std::pair<std::int64_t, std::optional<redis::StoredRecord>> peeked(std::string_view step,
                                                                     const Reply& r,
                                                                     RecordRef record) const {
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 || r->elements > 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER) {
      bad_reply(step, *r, record);
    }
    const std::int64_t now = r->element[0]->integer;
    if (r->elements == 1) return {now, std::nullopt};
    if (r->element[1]->type != REDIS_REPLY_STRING) bad_reply(step, *r->element[1], record);
    std::optional<redis::StoredRecord> rec = redis::decode_record(text_of(*r->element[1]));
    if (!rec || rec->kind == redis::kKindTombstone) {
      foreign(step, record, "a value idem did not write");
    }
    return {now, rec};
  }
};

RedisStore::RedisStore(RedisStoreOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

RedisStore::~RedisStore() = default;

std::string RedisStore::describe() const { return impl_->describe; }

RedisStats RedisStore::stats() const {
  redis::ConnectionStats s;
  if (impl_->pool) {
    s = impl_->pool->stats();
  } else {
    std::shared_lock lock(impl_->nodes_mu);
    for (const auto& [node, p] : impl_->pools) {
      const redis::ConnectionStats n = p->stats();
      s.round_trips += n.round_trips;
      s.commands += n.commands;
      s.reconnects += n.reconnects;
      s.queued += n.queued;
    }
  }
  RedisStats out{s.round_trips,  s.commands,
                 s.reconnects,   impl_->script_reloads.load(std::memory_order_relaxed),
                 s.queued,       s.primary_switches,
                 s.switch_events};
  if (impl_->subscriber) {
    const redis::SubscriberStats sub = impl_->subscriber->stats();
    out.notify = true;
    out.subscriber_connects = sub.connects;
    out.subscriber_reconnects = sub.reconnects;
    out.notifications = sub.messages;
    out.subscribed_channels = sub.channels;
  }
  if (impl_->cluster && !impl_->notify_flag.empty()) {
    out.notify = true;
    std::lock_guard lock(impl_->subscribers_mu);
    for (const auto& [node, sub] : impl_->node_subscribers) {
      const redis::SubscriberStats n = sub->stats();
      out.subscriber_connects += n.connects;
      out.subscriber_reconnects += n.reconnects;
      out.notifications += n.messages;
      out.subscribed_channels += n.channels;
    }
  }
  return out;
}

AcquireResult RedisStore::do_acquire(std::string_view scope, std::string_view key, Duration lease,
                                     Duration ttl, std::optional<std::string_view> fingerprint) {
  Impl& m = *impl_;
  const Impl::RecordRef k{scope, key};
  if (m.o.read_only) return m.acquire_read_only(k);
  if (m.o.replay == RedisReplayPath::kGet) {
    // A plain GET, then TIME in the same round trip: a COMPLETE record whose expires_at is
    // later than that TIME was live when the GET read it (SPEC §4: Replay), whatever its
    // key's own expiry says (the key may have lost it: PERSIST, RESTORE with TTL 0).
    const Impl::Outcome got = m.run(
        2,
        [&](std::string& out, std::size_t i, bool) {
          CommandWriter w(out);
          if (i == 0) {
            m.append_key(w.begin(2).arg("GET"), k);
          } else {
            w.begin(1).arg("TIME");
          }
        },
        [&](std::size_t) { return k; }, /*wait_replicas=*/true);
    const redisReply& r = *got.replies[0];
    if (r.type == REDIS_REPLY_STRING) {
      const std::optional<redis::StoredRecord> rec = redis::decode_record(text_of(r));
      const std::optional<std::int64_t> now = server_ms(*got.replies[1]);
      if (!now) m.bad_reply("acquire", *got.replies[1]);
      if (rec && rec->kind == redis::kKindComplete && rec->expires_at > *now) {
        return m.confirmed_replay(*rec, got.replicas_acked);
      }
    } else if (r.type == REDIS_REPLY_ERROR) {
      m.bad_reply("acquire", r, k);
    }
  }
  std::string fp;
  redis::append_fingerprint_section(fp, fingerprint);
  const Impl::Outcome out = m.run(
      1,
      [&](std::string& o, std::size_t, bool by_body) {
        m.append_script(o, redis::kAcquire, by_body, k, std::int64_t{lease.count()},
                        std::int64_t{ttl.count()}, std::string_view(fp));
      },
      [&](std::size_t) { return k; }, /*wait_replicas=*/true);
  const redisReply& r = *out.replies.front();
  if (r.type == REDIS_REPLY_ARRAY && r.elements == 2 && r.element[0]->type == REDIS_REPLY_INTEGER &&
      r.element[1]->type == REDIS_REPLY_STRING) {
    return m.busy_of(m.decode("acquire", *r.element[1], redis::kKindInProgress, k),
                     r.element[0]->integer);
  }
  if (r.type != REDIS_REPLY_STRING) m.bad_reply("acquire", r, k);
  const std::optional<redis::StoredRecord> rec = redis::decode_record(text_of(r));
  if (rec && rec->kind == redis::kKindComplete) return m.confirmed_replay(*rec, out.replicas_acked);
  if (!rec || rec->kind != redis::kKindInProgress) {
    m.foreign("acquire", k, "a value idem did not write");
  }
  // The record the script wrote: its token, its times by the server's clock, its attempt.
  const Token token = rec->token;
  const Timestamp now = at_ms(rec->at);
  const std::uint32_t attempt = rec->attempt;
  if (m.o.wait_replicas > 0 && out.replicas_acked < m.o.wait_replicas) {
    // Not safely replicated: the action must not run on a lease a failover could lose. Let
    // the next caller start at once rather than after the lease (best effort).
    try {
      (void)do_release(scope, key, token);
    } catch (const StoreUnavailable&) {
    }
    m.check_replicas("acquire", out.replicas_acked, /*unconfirmed=*/false);
  }
  // SPEC §4: a fresh lease has attempt 1; a steal counts on from the record's.
  return Acquired{Lease{token, now, now + lease, now + ttl, lease, attempt}, attempt > 1};
}

WriteResult RedisStore::do_complete(std::string_view scope, std::string_view key, Token token,
                                    std::string_view payload, Duration ttl) {
  Impl& m = *impl_;
  m.refuse_write("complete");
  const Impl::RecordRef k{scope, key};
  const std::string tok = token_text(token);
  Impl::Outcome out;
  try {
    out = m.run(
        1,
        [&](std::string& o, std::size_t, bool by_body) {
          m.append_script(o, redis::kComplete, by_body, k, std::string_view(tok),
                          std::int64_t{ttl.count()}, payload, std::string_view(m.notify_flag));
        },
        [&](std::size_t) { return k; }, /*wait_replicas=*/true);
  } catch (const StoreUnavailable& e) {
    // The complete may have landed here and not on the replicas (its reply, or WAIT's, was
    // lost): with wait_replicas a read of this server cannot settle that (error.h).
    if (m.o.wait_replicas > 0) throw StoreUnavailable(e.store(), e.reason(), {}, true);
    throw;
  }
  const redisReply& r = *out.replies.front();
  if (r.type != REDIS_REPLY_INTEGER) m.bad_reply("complete", r, k);
  if (r.integer == 0) return WriteResult::kFenced;
  m.check_replicas("complete", out.replicas_acked, /*unconfirmed=*/true);
  return WriteResult::kDone;
}

WriteResult RedisStore::do_release(std::string_view scope, std::string_view key, Token token) {
  Impl& m = *impl_;
  m.refuse_write("release");
  const Impl::RecordRef k{scope, key};
  const Reply r = m.run_one(redis::kDelete, k, std::string_view(token_text(token)),
                            std::string_view(m.notify_flag));
  if (r->type != REDIS_REPLY_INTEGER) m.bad_reply("release", *r, k);
  return r->integer == 1 ? WriteResult::kDone : WriteResult::kFenced;
}

ExtendResult RedisStore::do_extend(std::string_view scope, std::string_view key, Token token,
                                   Duration lease) {
  const ExtendRequest request{scope, key, token, lease};
  return do_extend_many(std::span<const ExtendRequest>(&request, 1)).front();
}

std::vector<ExtendResult> RedisStore::do_extend_many(std::span<const ExtendRequest> requests) {
  Impl& m = *impl_;
  m.refuse_write("extend");
  // One pipeline for the whole batch: the heartbeat's due leases cost one round trip.
  const Impl::Outcome out = m.run(
      requests.size(),
      [&](std::string& o, std::size_t i, bool by_body) {
        const ExtendRequest& r = requests[i];
        m.append_script(o, redis::kExtend, by_body, Impl::RecordRef{r.scope, r.key},
                        std::string_view(token_text(r.token)), std::int64_t{r.lease.count()});
      },
      [&](std::size_t i) {
        return Impl::RecordRef{requests[i].scope, requests[i].key};
      });
  std::vector<ExtendResult> results;
  results.reserve(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const redisReply& r = *out.replies[i];
    if (r.type != REDIS_REPLY_INTEGER) {
      m.bad_reply("extend", r, Impl::RecordRef{requests[i].scope, requests[i].key});
    }
    if (r.integer == 0) {
      results.push_back(ExtendResult{});
    } else {
      // The deadline is now + lease by the server's clock, so the time left is the lease.
      results.push_back(ExtendResult{WriteResult::kDone, at_ms(r.integer), requests[i].lease});
    }
  }
  return results;
}

std::size_t RedisStore::do_purge(std::size_t) {
  // SPEC §8: every record's key expires when SPEC §4 allows it to be purged; Redis drops it.
  return 0;
}

std::optional<Record> RedisStore::do_get(std::string_view scope, std::string_view key) {
  Impl& m = *impl_;
  const Impl::RecordRef k{scope, key};
  const Reply r = m.run_one(redis::kPeek, k);
  const auto [now, rec] = m.peeked("get", r, k);
  if (!rec) return std::nullopt;
  Record out;
  out.token = rec->token;
  out.expires_at = at_ms(rec->expires_at);
  out.fingerprint = Impl::owned(rec->fingerprint);
  out.now = at_ms(now);
  if (rec->kind == redis::kKindComplete) {
    out.state = RecordState::kComplete;
    out.completed_at = at_ms(rec->at);
    out.payload = std::string(rec->payload);
  } else {
    out.state = RecordState::kInProgress;
    out.attempt = rec->attempt;
    out.acquired_at = at_ms(rec->at);
    out.lease_expires_at = at_ms(rec->lease_expires_at);
  }
  return out;
}

bool RedisStore::do_forget(std::string_view scope, std::string_view key) {
  Impl& m = *impl_;
  m.refuse_write("forget");
  const Impl::RecordRef k{scope, key};
  const Reply r = m.run_one(redis::kDelete, k, std::string_view(), std::string_view(m.notify_flag));
  if (r->type != REDIS_REPLY_INTEGER) m.bad_reply("forget", *r, k);
  return r->integer == 1;
}

std::unique_ptr<RecordWatch> RedisStore::do_watch(std::string_view scope, std::string_view key,
                                                  std::function<void()> changed) {
  Impl& m = *impl_;
  // The record's own key is its channel: on a cluster it hashes to the record's slot, and
  // is subscribed at that slot's primary.
  std::string channel = redis::record_key(m.o.prefix, scope, key);
  if (m.cluster) {
    if (m.notify_flag.empty()) return nullptr;
    return m.node_subscriber(Impl::RecordRef{scope, key})
        .watch(std::move(channel), std::move(changed));
  }
  if (!m.subscriber) return nullptr;
  return m.subscriber->watch(std::move(channel), std::move(changed));
}

namespace detail {
namespace {

constexpr std::int64_t kMaxMs = 365LL * 24 * 3600 * 1000;

}  // namespace

// "host:port,host:port" (IPv6 hosts in brackets); every entry needs its port.
std::vector<std::pair<std::string, int>> parse_addresses(const std::string& list) {
  std::vector<std::pair<std::string, int>> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = list.find(',', start);
    const std::string item =
        list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? list.size() + 1 : comma + 1;
    std::string host;
    std::string port;
    if (!item.empty() && item.front() == '[') {
      const std::size_t close = item.find(']');
      if (close != std::string::npos && close + 1 < item.size() && item[close + 1] == ':') {
        host = item.substr(1, close - 1);
        port = item.substr(close + 2);
      }
    } else if (const std::size_t c = item.rfind(':'); c != std::string::npos) {
      host = item.substr(0, c);
      port = item.substr(c + 1);
    }
    if (host.empty() || port.empty()) {
      throw InvalidArgument("store URL",
                            "each server in the list needs host:port, got '" + item + "'");
    }
    out.emplace_back(host, static_cast<int>(kit::whole_number("port", port, 1, 65535)));
  }
  return out;
}

std::shared_ptr<Store> open_redis_store(const Url& url, const OpenOptions& options) {
  RedisStoreOptions o;
  o.read_only = options.read_only;
  if (!url.has_authority) {
    throw InvalidArgument("store URL", "'" + url.scheme +
                                           ":' needs '//': redis://host:port/db or "
                                           "unix:///path/redis.sock");
  }
  o.user = url.user;
  o.password = url.password;
  const std::string& scheme = url.scheme;
  o.tls = scheme.rfind("rediss", 0) == 0;
  if (scheme.size() > 9 && scheme.substr(scheme.size() - 9) == "+sentinel") {
    o.topology = RedisTopology::kSentinel;
  } else if (scheme.size() > 8 && scheme.substr(scheme.size() - 8) == "+cluster") {
    o.topology = RedisTopology::kCluster;
  }
  if (scheme == "unix") {
    if (!url.host.empty() || url.port != 0) {
      throw InvalidArgument("store URL", "'unix:' takes a socket path, not a host ('" + url.host +
                                             "'); use unix:///path/redis.sock");
    }
    if (url.path.size() < 2 || url.path.front() != '/') {
      throw InvalidArgument("store URL",
                            "'unix:' needs an absolute socket path: "
                            "unix:///path/redis.sock");
    }
    o.socket = url.path;
  } else if (o.topology != RedisTopology::kStandalone) {
    o.addresses =
        parse_addresses(url.port != 0 ? url.host + ":" + std::to_string(url.port) : url.host);
    if (o.topology == RedisTopology::kSentinel) {
      if (url.path.size() < 2) {
        throw InvalidArgument("store URL", "'" + scheme +
                                               ":' needs the service name as its "
                                               "path: " +
                                               scheme + "://host:port,host:port/mymaster");
      }
      o.service = url.path.substr(1);
    } else if (url.path.size() > 1 && url.path != "/0") {
      throw InvalidArgument("store URL",
                            "Redis Cluster has only database 0; '" + scheme + ":' takes no path");
    }
  } else {
    if (url.host.find(',') != std::string::npos) {
      throw InvalidArgument("store URL", "'" + scheme +
                                             ":' takes one server; for several use "
                                             "redis+sentinel:// or redis+cluster://");
    }
    if (!url.host.empty()) o.host = url.host;
    if (url.port != 0) o.port = url.port;
    if (url.path.size() > 1) {
      o.db = static_cast<int>(kit::whole_number("database (the URL's path)", url.path.substr(1), 0,
                                                std::numeric_limits<int>::max()));
    }
  }
  for (const auto& [name, value] : url.query) {
    if (name == "db" && url.scheme == "unix") {
      o.db = static_cast<int>(kit::whole_number(name, value, 0, std::numeric_limits<int>::max()));
    } else if (name == "prefix") {
      o.prefix = value;
    } else if (name == "connections") {
      o.connections = static_cast<std::size_t>(kit::whole_number(name, value, 1, kMaxConnections));
    } else if (name == "timeout") {
      o.timeout = kit::milliseconds(name, value, 1, kMaxMs);
    } else if (name == "connect_timeout") {
      o.connect_timeout = kit::milliseconds(name, value, 1, kMaxMs);
    } else if (name == "wait_replicas") {
      o.wait_replicas = static_cast<int>(kit::whole_number(name, value, 0, 1000));
    } else if (name == "wait_timeout") {
      o.wait_timeout = kit::milliseconds(name, value, 1, kMaxMs);
    } else if (name == "eviction") {
      o.allow_eviction = kit::choice<bool>(name, value, {{"refuse", false}, {"allow", true}});
    } else if (o.tls && name == "tls_ca") {
      o.tls_ca_file = value;
    } else if (o.tls && name == "tls_ca_dir") {
      o.tls_ca_dir = value;
    } else if (o.tls && name == "tls_cert") {
      o.tls_cert_file = value;
    } else if (o.tls && name == "tls_key") {
      o.tls_key_file = value;
    } else if (o.tls && name == "tls_server_name") {
      o.tls_server_name = value;
    } else if (o.tls && name == "tls_verify") {
      o.tls_verify = kit::choice<bool>(name, value, {{"on", true}, {"off", false}});
    } else if (name == "notify") {
      o.notify = kit::choice<bool>(name, value, {{"on", true}, {"off", false}}, true);
    } else if (name == "replay") {
      o.replay = kit::choice<RedisReplayPath>(
          name, value, {{"script", RedisReplayPath::kScript}, {"get", RedisReplayPath::kGet}});
    } else {
      kit::refuse_unknown(name, url.scheme,
                          std::string(url.scheme == "unix" ? "db, " : "") +
                              "prefix, connections, timeout, connect_timeout, wait_replicas, "
                              "wait_timeout, replay, eviction, notify" +
                              (o.tls ? ", tls_ca, tls_ca_dir, tls_cert, tls_key, "
                                       "tls_server_name, tls_verify"
                                     : ""));
    }
  }
  return std::make_shared<RedisStore>(std::move(o));
}

}  // namespace detail

}  // namespace idem
