#pragma once

// SPEC §7's same-machine signal for SQLite: waiters in other processes learn that a record
// was completed or released without polling for it.
//
// Every store object on a database maps one page of a file beside it (`<db>-wake`, like
// SQLite's own `-shm`). The page holds a count of the processes listening, one counter per
// slot of records (a hash of scope and key picks the slot) and a futex word. A write that
// completes, releases or forgets a record bumps its slot and the word and wakes the futex,
// but only while somebody listens: with no waiters it costs one atomic load. Each store
// object that has watches runs one listener thread, which sleeps on the futex and, when
// woken, calls the watches of the slots that moved. A crashed listener leaves the count
// raised, which costs writers a futex wake with nobody to wake and nothing else.
//
// Linux only (futexes on a shared mapping). A signal is a hint: a missed one costs the
// waiter one poll interval, never correctness.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "core/record_watchers.h"
#include "idem/store.h"

namespace idem::sqlite {

class WakeSignal {
 public:
  // Maps `<db_path>-wake`, creating it (with the database file's permission bits) when
  // missing. Null when that fails (a read-only directory, say): the store then neither
  // signals nor listens, and waiters poll.
  static std::unique_ptr<WakeSignal> open(const std::string& db_path);

  ~WakeSignal();
  WakeSignal(const WakeSignal&) = delete;
  WakeSignal& operator=(const WakeSignal&) = delete;

  // After a committed complete, release or forget of (scope, key).
  void notify(std::string_view scope, std::string_view key) noexcept;

  std::unique_ptr<RecordWatch> watch(std::string_view scope, std::string_view key,
                                     std::function<void()> changed);

  // Listener threads this object runs now (0 or 1), for tests.
  bool listening() const noexcept { return thread_.joinable(); }

 private:
  struct Page;
  WakeSignal(void* map, std::size_t size);
  void start_listening();
  void stop_listening();
  void listen();

  void* map_;
  std::size_t size_;
  Page* page_;
  std::atomic<bool> stop_{false};
  std::unique_ptr<std::uint32_t[]> seen_;  // the slots as the listener last saw them
  std::thread thread_;
  bool counted_ = false;  // this object adds one to the page's count of listeners
  detail::RecordWatchers watchers_;
};

}  // namespace idem::sqlite
