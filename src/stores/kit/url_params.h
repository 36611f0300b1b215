#pragma once

// The store kit's URL-parameter reader: a store's factory walks its URL's query (Url::query,
// idem/store_url.h) and reads each value it knows with these, so every store refuses a bad
// value, or a parameter it does not know, in the same words. Each throws
// InvalidArgument("store URL", ...) naming the parameter and quoting the value it got.

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/types.h"

namespace idem::kit {

// No upper bound for whole_number() and milliseconds().
inline constexpr std::int64_t kUnbounded = std::numeric_limits<std::int64_t>::max();

// A whole number from `min` to `max` in decimal digits ("must be a whole number from 1 to
// 512"; with max kUnbounded, "a whole number, at least 1").
std::int64_t whole_number(std::string_view name, std::string_view value, std::int64_t min,
                          std::int64_t max = kUnbounded);

// A duration written as a whole number of milliseconds from `min` to `max`.
Duration milliseconds(std::string_view name, std::string_view value, std::int64_t min,
                      std::int64_t max = kUnbounded);

// "parameter 'name' must be 'a', 'b' or 'c', got 'value'".
[[noreturn]] void refuse_choice(std::string_view name, std::string_view value,
                                const std::vector<std::string_view>& words);

// The value of an enumerated parameter: the one of `choices` (word, value) whose word it
// is ("must be 'a', 'b' or 'c'"); with ignore_case, ASCII case does not count.
template <typename T>
T choice(std::string_view name, std::string_view value,
         std::initializer_list<std::pair<std::string_view, T>> choices, bool ignore_case = false);

// "unknown parameter 'name' for scheme: (known: a, b, c)"; `known` is that list.
[[noreturn]] void refuse_unknown(std::string_view name, std::string_view scheme,
                                 std::string_view known);

// a == b, or with ignore_case equal but for ASCII case.
bool same_word(std::string_view a, std::string_view b, bool ignore_case);

template <typename T>
T choice(std::string_view name, std::string_view value,
         std::initializer_list<std::pair<std::string_view, T>> choices, bool ignore_case) {
  for (const auto& [word, result] : choices) {
    if (same_word(value, word, ignore_case)) return result;
  }
  std::vector<std::string_view> words;
  for (const auto& c : choices) words.push_back(c.first);
  refuse_choice(name, value, words);
}

}  // namespace idem::kit
