// The tool's exit statuses: the library's errors and the tool's own mapped to them
// (docs/cli.md lists them).

#include <fmt/core.h>
#include <string.h>

#include <CLI/CLI.hpp>
#include <cerrno>

#include "common.h"
#include "idem/error.h"

namespace idem::cli {

std::string signal_name(int sig) {
  const char* name = ::sigabbrev_np(sig);
  return name != nullptr ? fmt::format("SIG{}", name) : fmt::format("signal {}", sig);
}

int report_error(std::string_view command, const std::exception& error) {
  if (const auto* e = dynamic_cast<const OutputError*>(&error)) {
    // A reader that went away (`| head -1`) ends a writer silently, as SIGPIPE would.
    if (e->error() == EPIPE) return kExitBrokenPipe;
    print_error(command, e->what());
    return kExitOutputError;
  }
  if (const auto* e = dynamic_cast<const NoStore*>(&error)) {
    print_error(command, e->what());
    return kExitNoStore;
  }
  if (const auto* e = dynamic_cast<const UsageError*>(&error)) {
    print_error(command, e->what());
    return kExitUsage;
  }
  if (const auto* e = dynamic_cast<const CLI::ParseError*>(&error)) {
    print_error(command, e->what());
    return kExitUsage;
  }
  if (const auto* e = dynamic_cast<const PayloadTooLarge*>(&error)) {
    print_error(command, e->what());
    return kExitOutputTooLarge;
  }
  if (const auto* e = dynamic_cast<const Error*>(&error)) {
    print_error(command, e->what());
    switch (e->code()) {
      case ErrorCode::kInvalidArgument:
        return kExitUsage;
      case ErrorCode::kPayloadTooLarge:
        return kExitOutputTooLarge;
      case ErrorCode::kDecodeFailed:
        return kExitDataError;
      case ErrorCode::kShutDown:
        return kExitStoreUnavailable;
      case ErrorCode::kInProgress:
        return kExitInProgress;
      case ErrorCode::kKeyReuse:
        return kExitDataError;
      case ErrorCode::kLeaseLost:
        return kExitLeaseLost;
      case ErrorCode::kStoreUnavailable:
        return kExitStoreUnavailable;
    }
    return kExitInternal;
  }
  if (const auto* e = dynamic_cast<const std::system_error*>(&error)) {
    const int code = e->code().value();
    print_error(command,
                fmt::format("system error: {}{}", e->what(),
                            code == EAGAIN || code == ENOMEM || code == EMFILE || code == ENFILE
                                ? " (out of processes, memory or files; try again later)"
                                : ""));
    return kExitOsError;
  }
  print_error(command, fmt::format("internal error: {}", error.what()));
  return kExitInternal;
}

}  // namespace idem::cli
