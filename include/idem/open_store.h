#pragma once

// Opens a store from a URL (SPEC §9):
//
//   memory:                                   a new, empty in-process store
//   sqlite:///absolute/path.db[?synchronous=normal|full]
//   sqlite:relative/path.db
//   postgresql://user@host:port/db?...        (when built with PostgreSQL)
//   redis://[user:password@]host:port/db[?options]   (when built with Redis;
//   unix:///path/redis.sock[?db=N&options]            see stores/redis_store.h;
//   rediss://, redis+sentinel://, redis+cluster://    TLS, Sentinel, Cluster)
//
// An unknown scheme, a malformed URL, a store this build does not include or an unreachable
// server throws idem::InvalidArgument or idem::StoreUnavailable naming what is wrong.

#include <memory>
#include <string>
#include <string_view>
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

std::shared_ptr<Store> open_store(std::string_view url, const OpenOptions& options = {});

// The URL schemes this build can open, e.g. {"memory", "sqlite"}.
std::vector<std::string> available_schemes();

// The store a program uses when its user named none, as the `idem` tool does: the URL in
// the IDEM_STORE environment variable when set, else an SQLite file at
// $XDG_STATE_HOME/idem/idem.db (an absolute XDG_STATE_HOME only) or
// ~/.local/state/idem/idem.db. Throws InvalidArgument when neither IDEM_STORE, a state
// directory nor a home directory is known, or when the default needs SQLite and this build
// has none.
std::string default_store_url();

// The default SQLite file that default_store_url() names when IDEM_STORE is unset:
// $XDG_STATE_HOME/idem/idem.db (an absolute XDG_STATE_HOME only), else
// ~/.local/state/idem/idem.db. Throws InvalidArgument when neither is known.
std::string default_store_path();

// An sqlite:// URL for a file path, percent-encoding what the URL parser would otherwise
// read as syntax ('%', '?', '#', and anything outside printable ASCII).
std::string sqlite_store_url(std::string_view path);

// open_store(default_store_url()), creating the default file's directory (mode 0700) first.
std::shared_ptr<Store> open_default_store(const OpenOptions& options = {});

// A URL split into its parts. `scheme:rest` forms keep everything after the colon in
// `path`; `scheme://[user[:password]@]host[:port]/path?query` fills every field. A list of
// servers (`host:port,host:port`) is kept whole in `host`, with no port.
struct Url {
  std::string scheme;
  std::string user;
  std::string password;
  std::string host;
  int port = 0;                 // 0: not given
  std::string path;
  std::vector<std::pair<std::string, std::string>> query;  // percent-decoded
  bool has_authority = false;   // "//" followed the scheme

  // The value of query parameter `name`, or `fallback`.
  std::string param(std::string_view name, std::string_view fallback = {}) const;
  // The URL as text with the password replaced by "***".
  std::string redacted() const;
};

// Throws idem::InvalidArgument("store URL", ...) when the text is not a URL.
Url parse_url(std::string_view text);

}  // namespace idem
