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
#include "idem/store_url.h"

namespace idem {

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

// open_store(default_store_url()), creating the default file's directory (mode 0700) first
// when the store may be created (create_if_missing and not read_only). A default file that
// does not exist, opened without creating it, throws StoreNotFound (error.h).
std::shared_ptr<Store> open_default_store(const OpenOptions& options = {});

}  // namespace idem
