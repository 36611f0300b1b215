// The tool's durations, sizes and times: parsing the options, and the forms it prints.

#include <fmt/core.h>

#include <cctype>
#include <charconv>
#include <cstdint>
#include <limits>

#include "common.h"
#include "idem/error.h"

namespace idem::cli {

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

}  // namespace idem::cli
