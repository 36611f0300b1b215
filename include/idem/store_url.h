#pragma once

// The store plug: what a store is opened from. open_store() (open_store.h) parses a URL
// into a Url and hands it, with the caller's OpenOptions, to the factory of the store that
// registered the URL's scheme (a StoreFactory, see cmake/IdemStores.cmake). A store
// includes this header and store.h, never open_store.h.

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/store.h"

namespace idem {

struct OpenOptions {
  // The clock for stores that take one (memory, SQLite). Null means the system clock.
  // Stores that judge time by their server's clock ignore it.
  std::shared_ptr<const Clock> clock{};

  // Open the store for reading only. Opening writes and creates nothing (no file, table,
  // schema or journal change), whatever create_if_missing says, and a store that does not
  // exist yet is refused with StoreUnavailable. Afterwards get() works, and so does an
  // acquire that is answered without a write (a replay, a busy answer); everything that
  // needs a write (any other acquire, complete, release, extend, purge, forget) throws
  // StoreUnavailable and changes nothing. For tools that only look (`idem show`) and for
  // stores kept where the caller may not write.
  //   SQLite:      the file is opened read-only; a WAL file whose shared-memory index
  //                cannot be created (a read-only directory) is read as it is on disk.
  //   memory:      ignored (the store is new, empty and private to the process).
  //   server stores (PostgreSQL, Redis): no write is sent, on opening or later.
  bool read_only = false;

  // Create the store's database when it does not exist yet: the SQLite file and its
  // schema, a server store's tables. false: a store that does not exist, or exists
  // without idem's schema (an empty SQLite file), is refused with StoreUnavailable saying
  // so, and nothing is created. For tools that must not leave a new store behind when a
  // path or URL was mistyped (`idem forget`, `idem purge`).
  //   memory:      ignored (always created empty).
  //   Redis:       ignored (records need nothing created beforehand).
  bool create_if_missing = true;
};

// A URL split into its parts. `scheme:rest` forms keep everything after the colon in
// `path`; `scheme://[user[:password]@]host[:port]/path?query` fills every field. A list of
// servers (`host:port,host:port`) is kept whole in `host`, with no port.
struct Url {
  std::string scheme;
  std::string user;
  std::string password;
  std::string host;
  int port = 0;  // 0: not given
  std::string path;
  std::vector<std::pair<std::string, std::string>> query;  // percent-decoded
  bool has_authority = false;                              // "//" followed the scheme

  // The value of query parameter `name`, or `fallback`.
  std::string param(std::string_view name, std::string_view fallback = {}) const;
  // The URL as text with the password replaced by "***".
  std::string redacted() const;
};

// Throws idem::InvalidArgument("store URL", ...) when the text is not a URL.
Url parse_url(std::string_view text);

// What a store provides to be opened by URL: it builds the store from the parsed URL and the
// caller's options, or throws InvalidArgument (a malformed URL or parameter)
// or StoreUnavailable (an unreachable server, a store that does not exist).
using StoreFactory = std::shared_ptr<Store> (*)(const Url& url, const OpenOptions& options);

}  // namespace idem
