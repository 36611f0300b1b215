#pragma once

// Shared pieces of the `idem` tool: exit codes, argument parsing helpers, where the store
// lives, and the mapping from library errors to exit statuses. The tool sees only the public
// headers of the library (STYLE: "the tool sees only public headers").

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "idem/store.h"
#include "idem/types.h"

namespace idem::cli {

// Exit statuses of the tool itself, from sysexits.h where one fits (docs/cli.md lists them).
// `idem run` otherwise exits with the command's own status.
enum ExitCode : int {
  kExitOk = 0,
  // `idem show` / `idem forget`: there is no record for the key.
  kExitAbsent = 1,
  // EX_USAGE: a bad argument, a missing option or command, an unknown store scheme.
  kExitUsage = 64,
  // EX_DATAERR: the key was used before with a different --fingerprint, or the stored
  // result was not written by `idem run`.
  kExitDataError = 65,
  // EX_UNAVAILABLE: the store could not be opened or reached.
  kExitStoreUnavailable = 69,
  // EX_SOFTWARE: the lease was lost while the command ran; its result was not recorded.
  kExitLeaseLost = 70,
  // EX_SOFTWARE as well: an unexpected internal failure (the message says which).
  kExitInternal = 70,
  // EX_OSERR: the tool could not create a pipe or start the command.
  kExitOsError = 71,
  // EX_CANTCREAT: the command's output is larger than the limit; nothing was recorded.
  kExitOutputTooLarge = 73,
  // EX_TEMPFAIL: another run holds the key's lease and --wait ran out.
  kExitInProgress = 75,
};

// A bad command-line argument. `option` names it as the user typed it ("--ttl").
class UsageError : public std::runtime_error {
 public:
  UsageError(std::string option, const std::string& why)
      : std::runtime_error(option + ": " + why), option_(std::move(option)) {}
  const std::string& option() const noexcept { return option_; }

 private:
  std::string option_;
};

// Parses a duration such as "250ms", "30s", "5m", "24h", "7d" or a sum of them ("1h30m").
// Returns nullopt with `why` filled when the text is not a duration. Zero is accepted here;
// each option decides whether zero means something (SPEC §6 forbids it for lease and ttl).
std::optional<Duration> parse_duration(std::string_view text, std::string* why = nullptr);

// parse_duration for option `option`; throws UsageError naming the option. `allow_zero` is
// for options where 0 has a meaning (--wait 0: fail at once). Also enforces SPEC §10's
// upper bound of 365 days.
Duration duration_option(std::string_view option, std::string_view text, bool allow_zero);

// Parses a byte count: digits, optionally followed by "KiB" or "MiB" (or "K", "M").
std::optional<std::size_t> parse_size(std::string_view text);

// Formats a store timestamp as ISO-8601 UTC with milliseconds: "2024-05-01T12:00:00.250Z".
std::string iso8601(Timestamp t);

// Formats a duration for people: "850 ms", "12.5 s", "3 min 20 s", "2 h 5 min".
std::string human_duration(Duration d);

// Where the store lives when neither --store nor IDEM_STORE says: an SQLite file at
// $XDG_STATE_HOME/idem/idem.db, or ~/.local/state/idem/idem.db. Returns the file path.
// Throws UsageError when neither XDG_STATE_HOME nor a home directory is known.
std::string default_store_path();

// Turns a file path into an sqlite:// URL, percent-encoding what the URL parser would
// otherwise read as syntax ('%', '?', '#', and anything outside printable ASCII).
std::string sqlite_url_for_path(std::string_view path);

// The URL of the store to use: `flag` (from --store) when given, else $IDEM_STORE, else the
// default SQLite file (whose directory is created, mode 0700, on first use).
std::string resolve_store_url(const std::string& flag);

// Opens the store named by resolve_store_url(flag). Throws idem::InvalidArgument for a bad
// or unknown URL and idem::StoreUnavailable when it cannot be opened.
std::shared_ptr<Store> open_cli_store(const std::string& flag);

// Reports `error` on stderr as "idem <command>: ..." and returns the exit status it maps to
// (the table in docs/cli.md). Handles idem::Error, UsageError, CLI11 errors and anything
// else (an unexpected failure is EX_SOFTWARE).
int report_error(std::string_view command, const std::exception& error);

// Prints "idem <command>: <message>" on stderr.
void print_error(std::string_view command, std::string_view message);

// Writes all of `bytes` to file descriptor `fd`, retrying on EINTR and short writes.
// Returns false (with errno set) when the write fails, e.g. EPIPE.
bool write_all(int fd, std::string_view bytes);

// Shows text for people: replaces bytes that are not printable ASCII with \xNN, so a key
// with binary bytes or terminal escapes is shown safely in a message.
std::string printable(std::string_view text);

}  // namespace idem::cli
