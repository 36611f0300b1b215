#pragma once

// SPEC §7 on PostgreSQL: waiters in other processes and on other machines learn that a
// record was completed, released or forgotten through LISTEN/NOTIFY instead of polling.
//
// A store with notify = true sends pg_notify(channel, payload) from the statement that
// completes, releases or forgets a record (postgres_schema.cpp), so the notification is
// delivered when, and only if, the write commits. The channel is the table's
// (notify_channel()); the payload is the record's stable_record_hash in hex, the same in
// every process, so the record's scope and key never travel.
//
// Each store object that has had a watch runs one Listener: one connection, one thread
// (idem-pg-listen), however many watches. The thread sleeps in poll() on the connection's
// socket and an eventfd that the destructor writes, hands each notification to the watches
// of its hash, and sends `SELECT 1` after 30 s of silence so a connection that died without
// a word is found. A lost connection is made again (backoff 50 ms doubling to 5 s) and
// listens again; every watch is then woken, since notifications sent meanwhile are lost.
// The first connection wakes them all too: a watch made before LISTEN took effect may have
// missed one. A notification is a hint: a missed one costs the waiter one poll interval,
// never correctness.

#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "core/record_watchers.h"
#include "idem/store.h"
#include "idem/stores/postgres_store.h"
#include "stores/postgres/postgres_connection.h"
#include "stores/postgres/postgres_schema.h"
#include "stores/postgres/postgres_url.h"

namespace idem::postgres {

// The longest channel name (NAMEDATALEN - 1).
inline constexpr std::size_t kMaxChannelLength = 63;

// "idem:schema.name"; when that is longer than kMaxChannelLength, "idem:" and 16 hex digits
// of a stable hash of "schema.name".
std::string notify_channel(const TableNames& names);

// `name` as a quoted SQL identifier ("a""b" for a"b).
std::string quote_identifier(std::string_view name);

// The payload that names (scope, key): stable_record_hash in hex, as the statements'
// to_hex() writes it. Zero when `payload` is not one (a stranger's NOTIFY).
std::uint64_t parse_payload(std::string_view payload, bool& ok);

class Listener {
 public:
  // Does not connect: the first watch starts the thread. `params` are libpq's keywords and
  // values for the listening connection; `timeout` bounds connecting and each round trip.
  Listener(ConnParams params, std::string channel, Duration timeout);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  std::unique_ptr<RecordWatch> watch(std::string_view scope, std::string_view key,
                                     std::function<void()> changed);

  PostgresListenerStats stats() const;

 private:
  struct Finish {
    void operator()(PGconn* c) const { PQfinish(c); }
  };
  using Conn = std::unique_ptr<PGconn, Finish>;
  enum class Woke { kReady, kStop, kTimeout };

  void run();
  // Connects and listens; null when that failed or the store is closing.
  Conn connect();
  // Listens on `c` until it breaks or the store closes.
  void serve(PGconn* c);
  // Sends `sql` and reads its results (handing on notifications that arrive meanwhile),
  // within the timeout. False when it failed; `value` (if given) gets the first column of
  // the first row returned.
  bool round_trip(PGconn* c, const char* sql, std::string* value);
  void hand_on(PGconn* c);
  // Waits until `fd` is ready for `events` (no fd: -1), the store closes, or `until`.
  Woke wait(int fd, short events, SteadyClock::time_point until) const;

  ConnParams params_;
  std::string channel_;
  Duration timeout_;
  int stop_fd_ = -1;  // an eventfd: readable once the store closes
  std::atomic<bool> stop_{false};
  std::mutex start_mu_;
  std::thread thread_;
  idem::detail::RecordWatchers watchers_;

  std::atomic<std::uint64_t> connects_{0};
  std::atomic<std::uint64_t> reconnects_{0};
  std::atomic<std::uint64_t> notifications_{0};
  std::atomic<bool> listening_{false};
  std::atomic<int> backend_pid_{0};
};

}  // namespace idem::postgres
