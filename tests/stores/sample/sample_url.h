#pragma once

// The sample store's factory, registered for the test executables' open_store() by the
// source cmake/IdemStores.cmake generates for a TEST_ONLY store.

#include <memory>

#include "idem/store.h"
#include "idem/store_url.h"

namespace idem::detail {

std::shared_ptr<Store> open_sample_store(const Url& url, const OpenOptions& options);

}  // namespace idem::detail
