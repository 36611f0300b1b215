#pragma once

// The Redis store's factory, listed for open_store() by cmake/IdemStores.cmake.

#include <memory>

#include "idem/store.h"
#include "idem/store_url.h"

namespace idem::detail {

std::shared_ptr<Store> open_redis_store(const Url& url, const OpenOptions& options);

}  // namespace idem::detail
