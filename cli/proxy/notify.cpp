#include "notify.h"

#include <cstdlib>
#include <string>

#ifdef IDEM_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace idem::proxy::notify {

namespace {

void send([[maybe_unused]] const std::string& state) {
#ifdef IDEM_HAVE_SYSTEMD
  (void)sd_notify(0, state.c_str());
#endif
}

}  // namespace

bool supported() {
#ifdef IDEM_HAVE_SYSTEMD
  return true;
#else
  return false;
#endif
}

bool requested() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  return socket != nullptr && *socket != '\0';
}

void ready(std::string_view text) { send("READY=1\nSTATUS=" + std::string(text)); }

void stopping(std::string_view text) { send("STOPPING=1\nSTATUS=" + std::string(text)); }

void status(std::string_view text) { send("STATUS=" + std::string(text)); }

std::optional<std::chrono::microseconds> watchdog_interval() {
#ifdef IDEM_HAVE_SYSTEMD
  std::uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
    return std::chrono::microseconds(static_cast<std::int64_t>(usec / 2));
  }
#endif
  return std::nullopt;
}

void watchdog() { send("WATCHDOG=1"); }

}  // namespace idem::proxy::notify
