#pragma once

// The waiting side of a store's notifications (SPEC §7, Store::watch): the callbacks of one
// store object's watches, keyed by a hash of the record that is the same in every process,
// so that a signal naming a hash (or a slot of hashes) reaches the watches it may concern.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>

#include "idem/store.h"

namespace idem::detail {

// FNV-1a over the scope's length, the scope and the key: stable across processes, builds
// and machines (std::hash promises none of that).
std::uint64_t stable_record_hash(std::string_view scope, std::string_view key) noexcept;

class RecordWatchers {
 public:
  // `on_first` runs when the first watch is added and `on_last` when the last one ends (a
  // store starts and stops listening there); both under the registry's lock.
  RecordWatchers(std::function<void()> on_first = {}, std::function<void()> on_last = {});
  ~RecordWatchers();
  RecordWatchers(const RecordWatchers&) = delete;
  RecordWatchers& operator=(const RecordWatchers&) = delete;

  std::unique_ptr<RecordWatch> add(std::uint64_t hash, std::function<void()> changed);

  // Runs the callback of every watch whose hash `concerns` says may have changed, under the
  // registry's lock (so a watch being destroyed waits for its callback to return).
  void notify_if(const std::function<bool(std::uint64_t hash)>& concerns);
  // The same for the watches of one hash (found by the index, not by a walk over them all).
  void notify(std::uint64_t hash);
  // The same for every watch.
  void notify_all();

  std::size_t size() const;

 private:
  // Callbacks by the hash of their record; a multimap's iterators stay valid while other
  // entries come and go, so each watch keeps its own.
  using Entries = std::multimap<std::uint64_t, std::function<void()>>;
  struct Shared {
    mutable std::mutex mu;
    Entries entries;
    std::function<void()> on_first, on_last;
  };
  class Watch;
  // Shared with every watch, so a watch that outlives its store (a caller's mistake) ends
  // without touching freed memory.
  std::shared_ptr<Shared> shared_;
};

}  // namespace idem::detail
