#pragma once

// SPEC §7 on Redis: waiters in any process learn that a record was completed, released or
// forgotten without polling for it (docs/stores/redis.md, "Waiting without polling").
//
// The store's complete, release and forget scripts end with SPUBLISH on the record's own
// key (sharded publish/subscribe, Redis 7: the channel hashes to the record's slot). Each
// store object that has watches runs one Subscriber: one connection of its own, opened like
// the pool's (TLS, unix sockets, ACL users, Sentinel) and named idem-redis-sub-<pid>, and
// one thread (idem-redis-sub) that SSUBSCRIBEs to each watched record's key once, however
// many watches that record has, and SUNSUBSCRIBEs when its last watch ends. A message calls
// the watches of its channel.
//
// A notification is a hint, never the only way to learn: a broken connection is opened
// again (20 ms, doubling to 1 s), a link silent for 5 s is PINGed, and after every
// subscription the server confirms, the watches of that channel are called, since a
// publish may have gone out while it was not subscribed. Behind Sentinel the subscriber
// follows +switch-master to the new primary. The destructor wakes the thread through an
// eventfd, so it waits at most for a connection attempt in progress (the connect timeout).

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "idem/store.h"
#include "stores/redis/redis_connection.h"

namespace idem::redis {

struct SubscriberStats {
  std::uint64_t connects = 0;    // connections opened, the first one included
  std::uint64_t reconnects = 0;  // connections opened after one broke or moved
  std::uint64_t messages = 0;    // published messages received
  std::size_t channels = 0;      // channels the server confirmed subscribed right now
  bool denied = false;           // the server refused SSUBSCRIBE (an ACL): no more watches
};

class Subscriber {
 public:
  // `settings`: the pool's (scripts, the eviction check and WAIT are dropped, a client name
  // is added).
  explicit Subscriber(const ConnectionSettings& settings);
  ~Subscriber();
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  // Calls `changed` on the subscriber's thread after each message on `channel` and each
  // confirmed (re)subscription to it, until the returned watch is destroyed. Starts the
  // thread with the first watch. Null once the server has refused SSUBSCRIBE.
  std::unique_ptr<RecordWatch> watch(std::string channel, std::function<void()> changed);

  // Sentinel: the primary moved to `address` ("host:port"); the subscription follows.
  void moved_to(const std::string& address);

  SubscriberStats stats() const;

 private:
  struct State;
  class Watch;
  void loop();
  // Runs one connection until it breaks, moves or the subscriber stops; returns why it
  // ended (empty: stopped or moved).
  std::string serve(Link& link);
  // Sends SSUBSCRIBE/SUNSUBSCRIBE for the channels whose watches came or went.
  std::string sync(Link& link);
  // One reply from the server: a confirmation, a message or a PING's answer.
  std::string handle(const redisReply& r);
  // Waits until the fd is readable, the wake-up fd fires or `timeout_ms` passes.
  bool wait_readable(int fd, int timeout_ms);
  void drain_wake();

  ConnectionSettings settings_;
  std::shared_ptr<State> state_;
  std::thread thread_;
  std::set<std::string> subscribed_;  // asked on this link (thread only)
  std::atomic<std::uint64_t> connects_{0};
  std::atomic<std::uint64_t> reconnects_{0};
  std::atomic<std::uint64_t> messages_{0};
  std::atomic<std::size_t> confirmed_{0};
};

}  // namespace idem::redis
