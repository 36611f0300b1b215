#pragma once

// The SQLite store's URL: sqlite:///absolute/path.db or sqlite:relative/path.db, with
// ?synchronous=normal|full&busy_timeout=MS&shared=0|1 (open_store.h).

#include <memory>
#include <string>

#include "idem/store.h"
#include "idem/store_url.h"

namespace idem::detail {

// The SQLite store's factory (IdemStores.cmake lists it for open_store()).
std::shared_ptr<Store> open_sqlite_store(const Url& url, const OpenOptions& options);

}  // namespace idem::detail

namespace idem::sqlite {

// ASCII lower case, for the parameters that ignore case.
std::string lowercase(std::string s);

}  // namespace idem::sqlite
