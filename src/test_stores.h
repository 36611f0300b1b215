#pragma once

// The test build's TEST_ONLY stores (cmake/IdemStores.cmake, e.g. tests/stores/sample) are
// never compiled into libidem: a source generated for each registers its schemes here
// before main(), in the test executables only, and open_store() and available_schemes()
// then know them after the generated table of the installed stores. Nothing else calls it.

#include "idem/store_url.h"

namespace idem::detail {

// Adds `scheme`, opened by `open`. Called during static initialisation only.
void add_test_store(const char* scheme, StoreFactory open);

}  // namespace idem::detail
