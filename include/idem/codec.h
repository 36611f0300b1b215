#pragma once

// Codec<T> turns a typed result into the bytes a store keeps, and back (SPEC §5). The
// primary template is deliberately left undefined: run<T> or begin<T> with a type that has
// no codec stops at a static_assert that says so. To store your own type, specialise it:
//
//   template <>
//   struct idem::Codec<Invoice> {
//     static std::string encode(const Invoice& v) { return v.to_json(); }
//     static Invoice decode(std::string_view bytes) { return Invoice::from_json(bytes); }
//   };
//
// decode must accept every string encode produced, including one stored by an earlier
// version of your program if records outlive a deploy. If decode throws, the caller gets
// idem::DecodeFailed carrying the stored bytes. A fresh run returns the action's own value;
// only replays go through decode, so a lossy codec shows only on replays.
//
// Ready codecs: std::string, std::vector<char>, std::vector<unsigned char>,
// std::vector<std::byte> (the bytes as they are); integers and bool (decimal text); enums
// (their underlying integer); std::optional<T> of any type with a codec. A JSON codec for
// nlohmann::json and for types with to_json/from_json is in idem/codec_json.h (opt-in).

#include <charconv>
#include <concepts>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace idem {

template <typename T>
struct Codec;

template <>
struct Codec<std::string> {
  static std::string encode(const std::string& value) { return value; }
  static std::string decode(std::string_view bytes) { return std::string(bytes); }
};

template <>
struct Codec<std::vector<char>> {
  static std::string encode(const std::vector<char>& value) {
    return std::string(value.begin(), value.end());
  }
  static std::vector<char> decode(std::string_view bytes) {
    return std::vector<char>(bytes.begin(), bytes.end());
  }
};

template <>
struct Codec<std::vector<std::byte>> {
  static std::string encode(const std::vector<std::byte>& value) {
    return std::string(reinterpret_cast<const char*>(value.data()), value.size());
  }
  static std::vector<std::byte> decode(std::string_view bytes) {
    const auto* p = reinterpret_cast<const std::byte*>(bytes.data());
    return std::vector<std::byte>(p, p + bytes.size());
  }
};

template <>
struct Codec<std::vector<unsigned char>> {
  static std::string encode(const std::vector<unsigned char>& value) {
    return std::string(value.begin(), value.end());
  }
  static std::vector<unsigned char> decode(std::string_view bytes) {
    return std::vector<unsigned char>(bytes.begin(), bytes.end());
  }
};

// Integers as decimal text, so `idem show` prints them readably. decode accepts exactly
// what encode produces: an optional '-' and digits, nothing else, within T's range.
template <typename T>
requires(std::is_integral_v<T> && !std::is_same_v<T, bool>) struct Codec<T> {
  static std::string encode(T value) {
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, value);
    return std::string(buf, r.ptr);
  }
  static T decode(std::string_view bytes) {
    T value{};
    const char* end = bytes.data() + bytes.size();
    const auto r = std::from_chars(bytes.data(), end, value);
    if (bytes.empty() || r.ec != std::errc() || r.ptr != end) {
      throw std::invalid_argument("not a decimal integer in range: \"" + std::string(bytes) + "\"");
    }
    return value;
  }
};

template <>
struct Codec<bool> {
  static std::string encode(bool value) { return value ? "true" : "false"; }
  static bool decode(std::string_view bytes) {
    if (bytes == "true") return true;
    if (bytes == "false") return false;
    throw std::invalid_argument("not true or false: \"" + std::string(bytes) + "\"");
  }
};

// Enums as their underlying integer, so renaming an enumerator keeps stored results valid
// (renumbering does not).
template <typename T>
requires std::is_enum_v<T>
struct Codec<T> {
  using Underlying = std::underlying_type_t<T>;
  static std::string encode(T value) {
    return Codec<Underlying>::encode(static_cast<Underlying>(value));
  }
  static T decode(std::string_view bytes) {
    return static_cast<T>(Codec<Underlying>::decode(bytes));
  }
};

// An empty string for nullopt, else '=' followed by the value's own encoding.
template <typename T>
struct Codec<std::optional<T>> {
  static std::string encode(const std::optional<T>& value) {
    return value ? "=" + Codec<T>::encode(*value) : std::string();
  }
  static std::optional<T> decode(std::string_view bytes) {
    if (bytes.empty()) return std::nullopt;
    if (bytes.front() != '=') {
      throw std::invalid_argument("not an encoded std::optional (no leading '=')");
    }
    return Codec<T>::decode(bytes.substr(1));
  }
};

}  // namespace idem
