#include "common.h"

#include <fmt/core.h>
#include <string.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <system_error>

#include "idem/error.h"
#include "idem/open_store.h"

namespace idem::cli {
namespace {

// Returns the value of environment variable `name` when it is set and not empty.
std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

}  // namespace

std::optional<Duration> parse_duration(std::string_view text, std::string* why) {
  auto fail = [why](std::string message) -> std::optional<Duration> {
    if (why != nullptr) *why = std::move(message);
    return std::nullopt;
  };
  if (text.empty()) return fail("empty duration");
  // A bare 0 needs no unit: zero is zero in any unit.
  if (text == "0") return Duration{0};
  // Sums such as "1h30m" are accepted; each term is a number (decimals allowed: "1.5s")
  // followed by a unit.
  std::int64_t total_ms = 0;
  constexpr std::int64_t kLimitMs = std::numeric_limits<std::int64_t>::max() / 4;
  std::string_view rest = text;
  while (!rest.empty()) {
    std::int64_t whole = 0;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), whole);
    if (ec == std::errc::result_out_of_range) return fail("number too large");
    if (ec != std::errc{} || whole < 0) {
      return fail("expected a number followed by a unit (ms, s, m, h, d), e.g. 30s or 1.5s");
    }
    rest.remove_prefix(static_cast<std::size_t>(end - rest.data()));
    // The fraction as digits over a power of ten, at most 9 digits.
    std::int64_t fraction = 0;
    std::int64_t denominator = 1;
    if (!rest.empty() && rest.front() == '.') {
      rest.remove_prefix(1);
      std::size_t digits = 0;
      while (digits < rest.size() && std::isdigit(static_cast<unsigned char>(rest[digits]))) {
        if (digits == 9) return fail("too many decimals");
        fraction = fraction * 10 + (rest[digits] - '0');
        denominator *= 10;
        ++digits;
      }
      if (digits == 0) return fail("expected digits after the decimal point");
      rest.remove_prefix(digits);
    }
    std::size_t unit_len = 0;
    while (unit_len < rest.size() && std::isalpha(static_cast<unsigned char>(rest[unit_len]))) {
      ++unit_len;
    }
    std::string_view unit = rest.substr(0, unit_len);
    rest.remove_prefix(unit_len);
    std::int64_t scale = 0;
    if (unit == "ms") {
      scale = 1;
    } else if (unit == "s") {
      scale = 1000;
    } else if (unit == "m") {
      scale = 60'000;
    } else if (unit == "h") {
      scale = 3'600'000;
    } else if (unit == "d") {
      scale = 86'400'000;
    } else if (unit.empty()) {
      return fail("missing unit (use ms, s, m, h or d, e.g. 30s; only 0 needs none)");
    } else {
      return fail(fmt::format("unknown unit '{}' (use ms, s, m, h or d)", unit));
    }
    if (whole > (kLimitMs - total_ms) / scale) return fail("duration too large");
    // SPEC §6: durations have millisecond resolution.
    if ((fraction * scale) % denominator != 0) return fail("finer than a millisecond");
    total_ms += whole * scale + fraction * scale / denominator;
  }
  return Duration{total_ms};
}

Duration duration_option(std::string_view option, std::string_view text, bool allow_zero) {
  std::string why;
  std::optional<Duration> d = parse_duration(text, &why);
  if (!d) {
    throw UsageError(std::string(option),
                     fmt::format("'{}' is not a duration: {}", printable(text), why));
  }
  // SPEC §6: a zero duration is invalid for leases and TTLs; --wait 0 means "do not wait".
  if (!allow_zero && d->count() == 0) {
    throw UsageError(std::string(option), "must be more than zero");
  }
  // SPEC §10: durations are at most 365 days.
  if (*d > kMaxDuration) {
    throw UsageError(std::string(option),
                     fmt::format("'{}' is more than the limit of 365 days", printable(text)));
  }
  return *d;
}

std::optional<std::size_t> parse_size(std::string_view text) {
  std::size_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end == text.data()) return std::nullopt;
  std::string_view unit = text.substr(static_cast<std::size_t>(end - text.data()));
  std::size_t scale = 1;
  if (unit.empty()) {
    scale = 1;
  } else if (unit == "K" || unit == "KiB" || unit == "k") {
    scale = 1024;
  } else if (unit == "M" || unit == "MiB") {
    scale = 1024 * 1024;
  } else {
    return std::nullopt;
  }
  if (value > std::numeric_limits<std::size_t>::max() / scale) return std::nullopt;
  return value * scale;
}

std::string iso8601(Timestamp t) { return to_iso8601(t); }

std::string human_duration(Duration d) {
  std::int64_t ms = d.count();
  if (ms < 0) {
    // The most negative count has no positive twin; one millisecond less reads the same.
    const std::int64_t magnitude = ms == std::numeric_limits<std::int64_t>::min()
                                       ? std::numeric_limits<std::int64_t>::max()
                                       : -ms;
    return "-" + human_duration(Duration{magnitude});
  }
  if (ms < 1000) return fmt::format("{} ms", ms);
  if (ms < 60'000) return fmt::format("{:.1f} s", static_cast<double>(ms) / 1000.0);
  std::int64_t s = ms / 1000;
  if (s < 3600) return fmt::format("{} min {} s", s / 60, s % 60);
  if (s < 86'400) return fmt::format("{} h {} min", s / 3600, (s % 3600) / 60);
  return fmt::format("{} d {} h", s / 86'400, (s % 86'400) / 3600);
}

std::string default_store_path() {
  try {
    return idem::default_store_path();
  } catch (const InvalidArgument&) {
    throw UsageError("--store",
                     "no store given and no home directory to keep the default store in "
                     "(set --store, IDEM_STORE, XDG_STATE_HOME or HOME)");
  }
}

std::string store_url(const std::string& flag) {
  if (!flag.empty()) return flag;
  try {
    return idem::default_store_url();
  } catch (const InvalidArgument&) {
    (void)default_store_path();  // no home directory: the tool's own message
    throw;
  }
}

NoStore::NoStore(const std::string& store, const std::string& hint)
    : std::runtime_error(fmt::format("{} does not exist (a mistyped --store or IDEM_STORE?){}",
                                     store, hint.empty() ? "" : "; " + hint)) {}

std::shared_ptr<Store> open_cli_store(const std::string& flag, StoreAccess access,
                                      const std::string& create_hint) {
  const std::string url = store_url(flag);
  OpenOptions options;
  if (access != StoreAccess::kCreate) {
    // A command that must not create the store says so when it is missing, so that a
    // mistyped path gets a message that says so (and an absent default store simply has no
    // records).
    options.read_only = access == StoreAccess::kReadOnly;
    options.create_if_missing = false;
  }
  try {
    // The default store: open_default_store() makes its directory when it may create it.
    return flag.empty() ? open_default_store(options) : open_store(url, options);
  } catch (const StoreNotFound&) {
    if (flag.empty() && !env("IDEM_STORE")) return nullptr;
    throw NoStore(parse_url(url).redacted(), create_hint);
  }
}

std::string signal_name(int sig) {
  const char* name = ::sigabbrev_np(sig);
  return name != nullptr ? fmt::format("SIG{}", name) : fmt::format("signal {}", sig);
}

void print_error(std::string_view command, std::string_view message) {
  std::string line = command.empty() ? fmt::format("idem: {}\n", message)
                                     : fmt::format("idem {}: {}\n", command, message);
  (void)write_all(STDERR_FILENO, line);
}

OutputError::OutputError(int error)
    : std::runtime_error(
          fmt::format("cannot write to standard output: {}", std::strerror(error))),
      error_(error) {}

void write_stdout(std::string_view bytes) {
  if (!write_all(STDOUT_FILENO, bytes)) throw OutputError(errno);
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
    print_error(command, fmt::format("system error: {}{}", e->what(),
                                     code == EAGAIN || code == ENOMEM || code == EMFILE ||
                                             code == ENFILE
                                         ? " (out of processes, memory or files; try again later)"
                                         : ""));
    return kExitOsError;
  }
  print_error(command, fmt::format("internal error: {}", error.what()));
  return kExitInternal;
}

bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

namespace {

// The length of the valid UTF-8 sequence at the start of `text` (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF), or 0.
std::size_t utf8_sequence_length(std::string_view text) {
  auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  std::size_t len = 0;
  unsigned char low = 0x80;
  unsigned char high = 0xbf;
  if (lead >= 0xc2 && lead <= 0xdf) {
    len = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    len = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    len = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (text.size() < len) return 0;
  if (byte(1) < low || byte(1) > high) return 0;
  for (std::size_t i = 2; i < len; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xbf) return 0;
  }
  return len;
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto u = static_cast<unsigned char>(text[i]);
    if (u == '\\') {
      out += "\\\\";
      ++i;
      continue;
    }
    if (u >= 0x20 && u < 0x7f) {
      out += text[i++];
      continue;
    }
    const std::size_t len = u >= 0x80 ? utf8_sequence_length(text.substr(i)) : 0;
    // C1 controls (U+0080 to U+009F, "\xc2\x80" to "\xc2\x9f") steer terminals too.
    const bool c1 = len == 2 && u == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0;
    if (len == 0 || c1) {
      for (std::size_t j = 0; j < std::max<std::size_t>(len, 1); ++j) {
        out += fmt::format("\\x{:02x}", static_cast<unsigned char>(text[i + j]));
      }
      i += std::max<std::size_t>(len, 1);
      continue;
    }
    out.append(text.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace idem::cli
