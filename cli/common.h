#pragma once

// Shared pieces of the `idem` tool: exit codes, argument parsing helpers, where the store
// lives, and the mapping from library errors to exit statuses. Defined by topic in
// durations.cpp, store_choice.cpp, exit_codes.cpp and output.cpp. The tool sees only the public
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
  // `idem show` / `idem forget`: there is no record for the key (show: or it expired).
  kExitAbsent = 1,
  // EX_USAGE: a bad argument, a missing option or command, an unknown store scheme.
  kExitUsage = 64,
  // EX_DATAERR: the key was used before with a different --fingerprint, or the stored
  // result was not written by `idem run`.
  kExitDataError = 65,
  // EX_NOINPUT: the store named by --store or IDEM_STORE does not exist, and the command
  // does not create one (show; forget and purge without --create).
  kExitNoStore = 66,
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
  // EX_IOERR: idem's standard output could not be written (a full disk, /dev/full).
  kExitOutputError = 74,
  // EX_TEMPFAIL: another run holds the key's lease and --wait ran out.
  kExitInProgress = 75,
  // EX_PROTOCOL, the nearest: the command ran and exited 0, but the store failed when its
  // result was to be recorded, for as long as the lease lasted. Not "retry later": a later
  // run takes the abandoned key over and runs the command again.
  kExitNotRecorded = 76,
  // 128 + SIGPIPE, as a shell reports a writer whose reader went away (`| head -1`).
  kExitBrokenPipe = 141,
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

// Idem's own standard output could not be written. `error()` is the errno (EPIPE: the
// reader went away).
class OutputError : public std::runtime_error {
 public:
  explicit OutputError(int error);
  int error() const noexcept { return error_; }

 private:
  int error_;
};

// Writes all of `bytes` to standard output; throws OutputError when it cannot.
void write_stdout(std::string_view bytes);

// Parses a duration such as "250ms", "30s", "1.5s", "5m", "24h", "7d", a sum of them
// ("1h30m"), or a bare "0". Returns nullopt with `why` filled when the text is not a
// duration, or is finer than a millisecond. Zero is accepted here; each option decides
// whether zero means something (SPEC §6 forbids it for lease and ttl).
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

// Where the store lives when neither --store nor IDEM_STORE says: idem::default_store_path(),
// with UsageError when neither XDG_STATE_HOME nor a home directory is known.
std::string default_store_path();

// The URL of the store a command uses: `flag` (from --store) when given, else
// idem::default_store_url() ($IDEM_STORE, else the default SQLite file).
std::string store_url(const std::string& flag);

// What a command does to its store.
enum class StoreAccess {
  // Reads and writes; creates the store when missing (the default file's directory too,
  // mode 0700): `idem run`, `idem bench`.
  kCreate,
  // Reads and writes an existing store only: `idem forget`, `idem purge`.
  kExisting,
  // Reads only; creates and writes nothing: `idem show`.
  kReadOnly,
};

// A store that does not exist and that the command may not create. The message says
// which, and how to create it when the command can (`hint`).
class NoStore : public std::runtime_error {
 public:
  NoStore(const std::string& store, const std::string& hint);
};

// Opens the store chosen by `flag` for `access`. Returns null when the default store does
// not exist yet and `access` may not create it (a store with no records). Throws NoStore
// when a store named by --store or IDEM_STORE is missing (idem::StoreNotFound) and may not
// be created, idem::InvalidArgument for a bad or unknown URL, idem::StoreUnavailable when
// the store cannot be opened.
std::shared_ptr<Store> open_cli_store(const std::string& flag, StoreAccess access,
                                      const std::string& create_hint = {});

// Reports `error` on stderr as "idem <command>: ..." and returns the exit status it maps to
// (the table in docs/cli.md). Handles idem::Error, UsageError, CLI11 errors and anything
// else (an unexpected failure is EX_SOFTWARE).
int report_error(std::string_view command, const std::exception& error);

// "SIGINT" for SIGINT; "signal N" for a number without a name.
std::string signal_name(int sig);

// Prints "idem <command>: <message>" on stderr.
void print_error(std::string_view command, std::string_view message);

// Writes all of `bytes` to file descriptor `fd`, retrying on EINTR and short writes.
// Returns false (with errno set) when the write fails, e.g. EPIPE.
bool write_all(int fd, std::string_view bytes);

// Shows text for people: valid UTF-8 as it is, while control characters (C0, DEL, C1),
// backslashes and bytes that are not valid UTF-8 become \xNN (\\), so a key with binary
// bytes or terminal escapes is shown safely in a message.
std::string printable(std::string_view text);

}  // namespace idem::cli
