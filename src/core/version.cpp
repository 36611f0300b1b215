#include "idem/version.h"

namespace idem {

const char* version() noexcept { return IDEM_VERSION_STRING; }

}  // namespace idem
