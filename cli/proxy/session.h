#pragma once

// One connection of `idem proxy`: the session that serves its requests (session.cpp).

#include <memory>

#include "core.h"
#include "net.h"

namespace idem::proxy {

// Serves an accepted connection until it closes; the session keeps itself and `core` alive
// and is listed in the core's live set so that a drain reaches it.
void start_session(std::shared_ptr<Server::Core> core, tcp::socket socket);

}  // namespace idem::proxy
