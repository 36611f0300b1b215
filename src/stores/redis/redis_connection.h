#pragma once

// Connections to one Redis server, shared by every caller of a store, with automatic
// pipelining (docs/stores/redis.md, "Connections and pipelining").
//
// A Connection is one hiredis context and one I/O loop (a thread). A caller hands it a
// Call (one or more formatted commands) and waits. When the connection is idle the caller
// makes the round trip itself, on its own thread, so a lone caller pays no thread hand-off;
// while a round trip is in flight, calls queue, and the loop sends everything queued as one
// write when that round trip ends, then matches the replies to the calls in order. Each
// call has a deadline; the socket has the same timeout, so a stuck server breaks the
// connection instead of hanging it. A broken connection fails only the calls that were on
// it and reconnects in the background, first at once and then with exponential backoff;
// while it is down a Pool routes calls to its other connections.
//
// Behind Sentinel, a Pool also runs a SentinelWatch: a thread subscribed to +switch-master
// on one sentinel, which moves every connection to the new primary as soon as a failover
// is announced (docs/stores/redis.md, "Sentinel").

#include <hiredis/hiredis.h>
#include <openssl/ssl.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "idem/types.h"
#include "stores/redis/redis_scripts.h"

namespace idem::redis {

using SteadyClock = std::chrono::steady_clock;

struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct ContextDeleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
struct SslDeleter {
  void operator()(SSL* s) const noexcept { SSL_free(s); }
};

// One established connection: a hiredis context (the socket, and the reader that parses
// replies) and, over TLS, an OpenSSL session on that socket. hiredis 0.14 has no TLS, so a
// TLS connection never lets hiredis read or write: OpenSSL encrypts into and decrypts from
// memory BIOs, this code moves the bytes over the socket (send with MSG_NOSIGNAL, recv
// with the socket's timeout), and the decrypted bytes go to hiredis's reader.
struct Link {
  std::unique_ptr<redisContext, ContextDeleter> hiredis;
  std::unique_ptr<SSL, SslDeleter> tls;  // null: plain TCP or a unix socket
  std::string address;                   // "host:port" (Sentinel: the primary connected to)
};
using Context = std::unique_ptr<Link>;

// What a TLS connection checks (docs/stores/redis.md, "TLS").
struct TlsSettings {
  std::string ca_file;      // PEM CA certificates; neither: the system's default CAs
  std::string ca_dir;       // a c_rehash'ed directory of CA certificates
  std::string cert_file;    // a client certificate (PEM), for servers that ask for one
  std::string key_file;     // its private key (PEM)
  std::string server_name;  // SNI and the name the certificate must carry; empty: the host
  bool verify = true;       // false: accept any certificate (tls_verify=off)
};

// The OpenSSL context of a store's TLS connections; throws InvalidArgument naming the file
// it cannot load.
std::shared_ptr<SSL_CTX> make_tls_context(const TlsSettings& tls);

// Sentinel: the primary the pool follows (the last +switch-master event's, or the one the
// watch's sentinel named after it subscribed), shared by a pool's connections. A
// (re)connection tries it before asking the sentinels, since a sentinel asked first may
// not have seen the failover yet while the old primary still takes writes.
class SwitchedPrimary {
 public:
  // The address ("" when none, or when it failed) and the count of moves it belongs to.
  std::pair<std::string, int> get(std::uint64_t& generation) const;
  // A move: a connection opening meanwhile opens again, to this address.
  void set(std::string host, int port);
  // The address the connections are on already, when there is none: no move.
  void seed(const std::string& host, int port);
  // Forgets the address when no event came since `generation` (it failed: ask the sentinels).
  void forget(std::uint64_t generation);
  std::uint64_t generation() const;

 private:
  mutable std::mutex mu_;
  std::string host_;
  int port_ = 0;
  std::uint64_t generation_ = 0;
};

// The SHA1 of each script, as the server names it (SCRIPT LOAD's answer).
using ScriptShas = std::array<std::string, kScriptCount>;

struct ConnectionSettings {
  std::string host;  // TCP, when socket is empty
  int port = 6379;
  // TLS on TCP connections when set (rediss://).
  std::shared_ptr<SSL_CTX> tls_context;
  TlsSettings tls;
  // Sentinel: when not empty, host and port are unused; each (re)connection asks these
  // sentinels for the primary of `sentinel_service`, and checks with ROLE that it is one.
  std::vector<std::pair<std::string, int>> sentinels;
  std::string sentinel_service;
  std::shared_ptr<SwitchedPrimary> switched;  // set by the Pool behind Sentinel
  std::string socket;                         // a unix socket path
  std::string user;
  std::string password;
  int db = 0;
  Duration connect_timeout{2000};
  // The socket's read and write timeout: a call's timeout, plus the WAIT timeout when the
  // store waits for replicas.
  Duration io_timeout{5000};
  // Scripts loaded on every (re)connection, so EVALSHA finds them after a server restart.
  std::vector<ScriptId> scripts;
  // "WAIT n ms", sent after a batch holding a call that asks for it; empty: never.
  std::string wait_command;
  // Read the server's maxmemory-policy (INFO memory) on every (re)connection and refuse
  // any policy but noeviction (docs/stores/redis.md, "Eviction").
  bool refuse_eviction = true;
  // CLIENT SETNAME on every (re)connection, so an operator (CLIENT LIST) sees what the
  // connection is; empty: unnamed. A server that refuses it (an ACL) does not fail the
  // connection: the name is for people only.
  std::string client_name;
};

// Opens one connection as a Connection does (the socket or TCP, TLS, AUTH, SELECT, the
// checks and SCRIPT LOAD; behind Sentinel the primary +switch-master named, else the one
// the sentinels name, checked with ROLE), for a caller that runs its own I/O on it (the
// subscriber, redis_subscriber.h). Null with `error` set when it fails; `generation` is the
// SwitchedPrimary's count it started from. Blocks for at most the connect timeout per server
// tried, plus the I/O timeout.
Context open_link(const ConnectionSettings& settings, std::string& error, ScriptShas* shas,
                  std::uint64_t& generation);

// Sends `data` over the link (encrypted over TLS); empty, or why it failed.
std::string link_write(Link& link, std::string_view data, Duration timeout);

// For a caller that polls the link's socket itself: takes what the socket has now, without
// waiting, into the link's reply reader (decrypting it over TLS). Empty, or why the
// connection broke (closed by the server included).
std::string link_receive(Link& link);

// The next reply the reader holds complete, without reading the socket: `out` stays null
// when none is complete yet. Empty, or a protocol error.
std::string link_next_reply(Link& link, Reply& out);

// One request: one or more commands and, once done, their replies in order.
class Call {
 public:
  std::string request;       // RESP-formatted commands
  std::size_t commands = 0;  // how many replies the request expects
  bool wait_replicas = false;

  // Valid after Connection::execute returned without an error.
  std::vector<Reply> replies;
  long long replicas_acked = -1;  // WAIT's answer, when wait_replicas
  // When WAIT answered an error (replicas_acked is -1), why; the replies are the calls' own
  // still, to be read first: a demoted cluster primary answers MOVED, then refuses WAIT.
  std::string wait_error;
  // Empty on success; otherwise why the call failed (and that its outcome is unknown when
  // the request was sent).
  std::string error;

 private:
  friend class Connection;
  enum class State { kQueued, kSent, kDone, kAbandoned };
  std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kQueued;
};

struct ConnectionStats {
  std::uint64_t round_trips = 0;
  std::uint64_t commands = 0;
  std::uint64_t reconnects = 0;
  std::size_t queued = 0;
  std::uint64_t primary_switches = 0;  // Sentinel: moves to a new primary (SentinelWatch)
  bool switch_events = false;          // Sentinel: following the sentinels right now
};

class Connection {
 public:
  explicit Connection(const ConnectionSettings& settings);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects in the calling thread (before start()). Returns the reason it failed, empty on
  // success; fills `shas` from SCRIPT LOAD.
  std::string connect_now(ScriptShas* shas);
  // Starts the I/O loop.
  void start();

  // Sends `call` in the next round trip and waits until it is answered, fails or reaches
  // `deadline`; call->error says which. REQUIRES: the call is not reused.
  void execute(const std::shared_ptr<Call>& call, SteadyClock::time_point deadline,
               Duration timeout);

  // Sentinel: a failover was announced; unless already on `address`, the connection is
  // dropped (at once, or after the round trip in flight) and opened to the new primary,
  // and calls queue meanwhile instead of failing.
  void move_to(const std::string& address);
  // Sentinel: up, and on a server other than `address`.
  bool up_elsewhere(const std::string& address) const;

  // Whether the connection is established right now.
  bool up() const noexcept { return up_.load(std::memory_order_acquire); }
  // Calls in execute() right now (in flight or queued): the pool's measure of load.
  int load() const noexcept { return load_.load(std::memory_order_relaxed); }
  // Why the last connection attempt or round trip failed.
  std::string last_error() const;
  ConnectionStats stats() const;

 private:
  // open_link with this connection's settings.
  Context handshake(std::string& error, ScriptShas* shas, std::uint64_t& generation) const;
  // Sends the batch as one write and completes each call from its replies; returns the
  // reason the connection broke, empty when it did not. REQUIRES: busy_ held by the caller.
  std::string round_trip(std::vector<std::shared_ptr<Call>>& batch);
  void loop();
  // Hands a call its outcome and wakes its caller, unless the caller gave up on it.
  static void finish(Call& call, std::vector<Reply>&& replies, long long acked, std::string error,
                     std::string wait_error = {});
  void fail_queued(const std::string& reason);  // REQUIRES: mu_ held
  void broke(const std::string& reason);        // REQUIRES: mu_ held
  // After a round trip (busy_ cleared): drops the connection if it broke or must move.
  void round_trip_ended(const std::string& error);  // REQUIRES: mu_ held

  const ConnectionSettings& settings_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Context ctx_;        // used only by whoever holds busy_; replaced under mu_
  bool busy_ = false;  // a round trip is in flight (the loop's or a caller's)
  bool stop_ = false;
  // move_to() was called: calls queue until the next connection attempt ends.
  bool moving_ = false;
  std::vector<std::shared_ptr<Call>> queue_;
  std::string last_error_;
  SteadyClock::time_point next_attempt_{};
  Duration backoff_{0};
  std::atomic<bool> up_{false};
  std::atomic<int> load_{0};
  std::atomic<std::uint64_t> round_trips_{0};
  std::atomic<std::uint64_t> commands_{0};
  std::atomic<std::uint64_t> reconnects_{0};
  std::thread thread_;
};

// Sentinel: one thread subscribed to +switch-master on the first sentinel that answers
// (the next one when it dies or stops answering PING, with backoff). Each event about
// `settings.sentinel_service` calls on_primary(host, port, true). Once each subscription is
// confirmed it asks that sentinel which server is the primary, and in which configuration
// epoch, and calls on_primary(host, port, false): a failover before the subscription
// (while the store opened, or while the watch moved between sentinels) sent its event to
// nobody. An answer from an epoch older than one already followed is a sentinel that has
// not caught up yet, and is ignored. on_primary returns whether it moved anything. Its
// sockets never block: the destructor wakes it at once (an eventfd), whatever the
// sentinel does.
class SentinelWatch {
 public:
  using OnPrimary = std::function<bool(const std::string& host, int port, bool announced)>;
  SentinelWatch(const ConnectionSettings& settings, OnPrimary on_primary);
  ~SentinelWatch();
  SentinelWatch(const SentinelWatch&) = delete;
  SentinelWatch& operator=(const SentinelWatch&) = delete;

  // The moves: each +switch-master event, and each answer that found the pool elsewhere.
  std::uint64_t switches() const noexcept { return switches_.load(std::memory_order_relaxed); }
  // Subscribed, and the primary asked for since.
  bool subscribed() const noexcept { return subscribed_.load(std::memory_order_relaxed); }

 private:
  void loop();
  // Watches through one sentinel until it fails or the watch stops; returns why it ended
  // and sets `subscribed_once` when the subscription was confirmed and the primary asked.
  std::string watch(const std::string& host, int port, bool& subscribed_once);
  // Opens a non-blocking connection to the sentinel into `sock`; empty, or why not.
  std::string dial(const std::string& host, int port, int& sock);
  // Asks the sentinel (a connection of its own) for the service's primary
  // (get-master-addr-by-name) and its configuration epoch (SENTINEL MASTER).
  std::string ask(const std::string& host, int port, std::string& primary_host, int& primary_port,
                  std::int64_t& epoch);
  // Waits until `fd` is ready for `events`, the timeout passes (false) or stop (false).
  bool wait_for(int fd, short events, Duration timeout);
  // True when `r` confirms the subscription.
  bool handle(const redisReply& r);

  const ConnectionSettings& settings_;
  OnPrimary on_primary_;
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> subscribed_{false};
  std::atomic<std::uint64_t> switches_{0};
  // The thread's own: the configuration epoch last followed, at least (-1: none yet). An
  // event raises it by one, the least a failover raises it by.
  std::int64_t followed_epoch_ = -1;
  std::thread thread_;
};

// A few connections; each call goes to the least loaded one that is up (the first of
// equals in round-robin order), so a call finds an idle connection whenever there is one.
class Pool {
 public:
  Pool(ConnectionSettings settings, std::size_t connections, std::string store_name);
  ~Pool();

  // Connects every connection; throws StoreUnavailable with the first failure.
  void connect(ScriptShas* shas);

  // Runs `call` on one connection; throws StoreUnavailable naming the store and the cause.
  void execute(const std::shared_ptr<Call>& call, Duration timeout);

  ConnectionStats stats() const;
  const std::string& store_name() const noexcept { return store_name_; }
  // The settings its connections use (behind Sentinel, with the pool's SwitchedPrimary).
  const ConnectionSettings& settings() const noexcept { return settings_; }
  // Sentinel: `listener(address)` runs on the watch's thread after each move of the
  // connections (a +switch-master for the service, or a sentinel's answer that found them
  // elsewhere), so the subscriber follows the primary too. It must return quickly. Empty:
  // none.
  void on_switch(std::function<void(const std::string&)> listener);

 private:
  // Sentinel: `host:port` is the primary, as an event announced it or a sentinel answered.
  // An announcement always moves the connections (those already there stay); an answer
  // only when something is elsewhere, and otherwise is kept as the address to come back
  // to (SwitchedPrimary::seed). Returns whether it moved them.
  bool follow(const std::string& host, int port, bool announced);

  ConnectionSettings settings_;
  std::string store_name_;
  std::mutex switch_mu_;
  std::function<void(const std::string&)> switch_listener_;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::atomic<std::size_t> next_{0};
  // Behind Sentinel; declared last so that it stops before the connections go.
  std::unique_ptr<SentinelWatch> watch_;
};

// "<cause>: <server's message>" for an error reply, naming what it means for the caller
// (authentication, ACL, memory, replica, cluster).
std::string explain_server_error(std::string_view message);

// Why a server that answered `info` to INFO memory must not hold idem's records, or empty
// when its maxmemory-policy is noeviction.
std::string eviction_refusal(std::string_view info);

}  // namespace idem::redis
