#pragma once

// Tells systemd how the proxy is doing when it runs as a Type=notify service (sd_notify(3),
// Debian's libsystemd): READY=1 once it listens, STOPPING=1 when the drain begins, STATUS=
// lines, and WATCHDOG=1 pings from the I/O threads when the unit sets WatchdogSec=, so a
// proxy whose event loop hangs is restarted. Outside systemd (no NOTIFY_SOCKET) every call
// does nothing. In a build without libsystemd (IDEM_WITH_SYSTEMD=OFF) too, and
// supported() says so.

#include <chrono>
#include <optional>
#include <string_view>

namespace idem::proxy::notify {

// Whether this build can notify systemd.
bool supported();
// Whether the service manager asked for notifications (NOTIFY_SOCKET is set).
bool requested();

void ready(std::string_view status);
void stopping(std::string_view status);
void status(std::string_view status);
// How often to ping the watchdog (half its timeout), if the unit set one.
std::optional<std::chrono::microseconds> watchdog_interval();
void watchdog();

}  // namespace idem::proxy::notify
