#pragma once

// The Redis store: shared by many machines, expiry by the server's clock, records dropped by
// the server itself (native expiry). Opened by
//
//   redis://[user:password@]host[:port][/db][?options]
//   rediss://...                      the same over TLS
//   unix://[user:password@]/path/to/redis.sock[?db=N&options]
//   redis+sentinel://[user:password@]host:port[,host:port...]/service[?options]
//   redis+cluster://[user:password@]host:port[,host:port...][?options]
//   rediss+sentinel://..., rediss+cluster://...   the same over TLS
//
// (see open_store.h and docs/stores/redis.md). Needs Redis 6.2 or later. Tokens increase
// strictly across the whole store (SPEC §2), whatever the server's clock does, for as long
// as the store's token key survives; on Redis Cluster they increase strictly per key (one
// token key per hash slot), and two keys may get the same token.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "idem/store.h"

namespace idem {

// How acquire looks for a stored result (docs/stores/redis.md, "Replays: script or GET").
enum class RedisReplayPath {
  // One script call whatever the key holds: every acquire is one round trip.
  kScript,
  // A plain GET first; a live COMPLETE record replays from it (cheaper for the server), and
  // anything else then runs the acquire script: a fresh key pays a second round trip.
  kGet,
};

// How the store finds its server (docs/stores/redis.md, "Deployments").
enum class RedisTopology {
  kStandalone,  // host:port or socket
  kSentinel,    // ask `addresses` (sentinels) for the primary of `service`
  kCluster,     // Redis Cluster: `addresses` are seed nodes; each key goes to its slot's primary
};

struct RedisStoreOptions {
  // The server over TCP. Unused when `socket` is set.
  std::string host = "127.0.0.1";
  int port = 6379;
  // A unix socket path; when not empty, the store connects to it instead of host:port.
  std::string socket;
  RedisTopology topology = RedisTopology::kStandalone;
  // Sentinels (kSentinel) or seed nodes (kCluster), as (host, port).
  std::vector<std::pair<std::string, int>> addresses;
  // The name the sentinels know the primary by (kSentinel).
  std::string service;
  // TLS on every TCP connection (rediss://). The server's certificate is checked against
  // tls_ca_file / tls_ca_dir (none: the system's CAs) and must name tls_server_name (empty:
  // the host connected to), which is also sent as SNI. tls_verify = false accepts any
  // certificate: encryption without knowing who answers (URL: tls_verify=off).
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_ca_dir;
  std::string tls_cert_file;  // a client certificate, with its key, when the server asks
  std::string tls_key_file;
  std::string tls_server_name;
  bool tls_verify = true;
  // AUTH: an ACL user and its password. No password: no AUTH. A password alone
  // authenticates as the default user.
  std::string user;
  std::string password;
  // The logical database (SELECT). Redis Cluster has only database 0.
  int db = 0;
  // Prepended to every key the store writes; any bytes but '{' and '}' (each record's
  // key carries exactly one hash tag, its own). Give each application its own prefix.
  std::string prefix = "idem:";
  // Connections shared by every caller of the store, each with one I/O loop that pipelines
  // the calls queued while its previous round trip was in flight. At least 1.
  std::size_t connections = 2;
  // How long a call waits for its reply (or the connection) before failing with
  // StoreUnavailable. A sent call that timed out may or may not have taken effect.
  Duration timeout{5000};
  // How long opening a connection may take.
  Duration connect_timeout{2000};
  // After each acquire and complete that wrote, wait until this many replicas have the
  // write (WAIT), up to wait_timeout; fewer in time fails the call with StoreUnavailable
  // (an acquire's lease is then released; a complete's error is unconfirmed(): the result
  // is on this server, and a read of it proves nothing about the replicas). 0: do not wait.
  int wait_replicas = 0;
  Duration wait_timeout{1000};
  // See RedisReplayPath.
  RedisReplayPath replay = RedisReplayPath::kScript;
  // Never write: get() and acquires answered without a write (replay, busy) work; anything
  // else throws StoreUnavailable. Only the read-only script is loaded.
  bool read_only = false;
  // False (the default): on every (re)connection, read the server's maxmemory-policy (INFO
  // memory) and refuse any policy but noeviction with StoreUnavailable, since an evicted
  // lease or result lets an action run twice. True: skip the check and accept that risk
  // (docs/stores/redis.md, "Eviction"). URL: eviction=refuse|allow.
  bool allow_eviction = false;
  // True (the default): complete, release and forget publish on the record's key (sharded
  // publish/subscribe, SPUBLISH), and watch() subscribes to it on one connection of the
  // store's own, so waiters in any process wake at once (SPEC §7; docs/stores/redis.md,
  // "Waiting without polling"). Turned off at open when the server cannot publish (before
  // Redis 7, or an ACL denies it); always off on Redis Cluster for now. False: no publish,
  // no watch; waiters only poll. URL: notify=on|off.
  bool notify = true;
};

// Counters of a store's connections, for metrics and tests.
struct RedisStats {
  // Writes to the server, each carrying one or more commands, and their replies.
  std::uint64_t round_trips = 0;
  std::uint64_t commands = 0;
  // Connections re-established after they broke.
  std::uint64_t reconnects = 0;
  // Commands the server had lost the script for (NOSCRIPT), sent again with the script.
  std::uint64_t script_reloads = 0;
  // Calls waiting right now for their connection's next round trip.
  std::size_t queued = 0;
  // Sentinel: failovers of the service that moved the store's connections to the new
  // primary: each +switch-master, and each failover the store found by asking a sentinel
  // after it subscribed (docs/stores/redis.md, "Sentinel").
  std::uint64_t primary_switches = 0;
  // Sentinel: whether the store is subscribed to +switch-master on a sentinel right now,
  // and has asked it for the primary since.
  bool switch_events = false;
  // Whether the store publishes and can watch (RedisStoreOptions::notify, after the check
  // at open).
  bool notify = false;
  // The subscriber's connection (one per store object, opened with the first watch):
  // connections opened, those opened again after one broke or moved, messages received,
  // channels subscribed right now (one per watched record, however many watches it has).
  std::uint64_t subscriber_connects = 0;
  std::uint64_t subscriber_reconnects = 0;
  std::uint64_t notifications = 0;
  std::size_t subscribed_channels = 0;
};

class RedisStore final : public Store {
 public:
  // Connects every connection and loads the scripts. Throws InvalidArgument for bad
  // options and StoreUnavailable naming the server and the cause (refused, timed out,
  // authentication failed, ...) when it cannot.
  explicit RedisStore(RedisStoreOptions options);
  ~RedisStore() override;

  // "redis://user:***@host:port/db" or "unix:///path.sock?db=N": never the password.
  std::string describe() const override;
  RedisStats stats() const;

 protected:
  AcquireResult do_acquire(std::string_view scope, std::string_view key, Duration lease,
                           Duration ttl, std::optional<std::string_view> fingerprint) override;
  WriteResult do_complete(std::string_view scope, std::string_view key, Token token,
                          std::string_view payload, Duration ttl) override;
  WriteResult do_release(std::string_view scope, std::string_view key, Token token) override;
  ExtendResult do_extend(std::string_view scope, std::string_view key, Token token,
                         Duration lease) override;
  std::vector<ExtendResult> do_extend_many(std::span<const ExtendRequest> requests) override;
  // Returns 0 at once: the server drops each record when SPEC §4 allows (native expiry).
  std::size_t do_purge(std::size_t limit) override;
  std::optional<Record> do_get(std::string_view scope, std::string_view key) override;
  bool do_forget(std::string_view scope, std::string_view key) override;
  // Null when the store does not notify (RedisStoreOptions::notify).
  std::unique_ptr<RecordWatch> do_watch(std::string_view scope, std::string_view key,
                                        std::function<void()> changed) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
