#include "stores/kit/url_params.h"

#include <charconv>

#include "idem/error.h"

namespace idem::kit {

namespace {

[[noreturn]] void refuse(std::string_view name, std::string_view value, const std::string& rule) {
  throw InvalidArgument("store URL", "parameter '" + std::string(name) + "' must be " + rule +
                                         ", got '" + std::string(value) + "'");
}

std::int64_t read_number(std::string_view name, std::string_view value, std::int64_t min,
                         std::int64_t max, const char* unit) {
  std::int64_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (value.empty() || ec != std::errc{} || end != value.data() + value.size() || n < min ||
      n > max) {
    std::string rule = std::string("a whole number") + unit;
    rule += max == kUnbounded ? ", at least " + std::to_string(min)
                              : " from " + std::to_string(min) + " to " + std::to_string(max);
    refuse(name, value, rule);
  }
  return n;
}

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

}  // namespace

std::int64_t whole_number(std::string_view name, std::string_view value, std::int64_t min,
                          std::int64_t max) {
  return read_number(name, value, min, max, "");
}

Duration milliseconds(std::string_view name, std::string_view value, std::int64_t min,
                      std::int64_t max) {
  return Duration{read_number(name, value, min, max, " of milliseconds")};
}

bool same_word(std::string_view a, std::string_view b, bool ignore_case) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (ignore_case ? lower(a[i]) != lower(b[i]) : a[i] != b[i]) return false;
  }
  return true;
}

void refuse_choice(std::string_view name, std::string_view value,
                   const std::vector<std::string_view>& words) {
  std::string rule;
  for (std::size_t i = 0; i < words.size(); ++i) {
    rule += i == 0 ? "" : i + 1 == words.size() ? " or " : ", ";
    rule += "'" + std::string(words[i]) + "'";
  }
  refuse(name, value, rule);
}

void refuse_unknown(std::string_view name, std::string_view scheme, std::string_view known) {
  throw InvalidArgument("store URL", "unknown parameter '" + std::string(name) + "' for " +
                                         std::string(scheme) + ": (known: " + std::string(known) +
                                         ")");
}

}  // namespace idem::kit
