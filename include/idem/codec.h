#pragma once

// Codec<T> turns a typed result into the bytes a store keeps, and back (SPEC §5). The
// primary template is deliberately incomplete, so run<T> with a type that has no codec
// fails to compile. To store your own type, specialise it:
//
//   template <>
//   struct idem::Codec<Invoice> {
//     static std::string encode(const Invoice& v) { return v.to_json(); }
//     static Invoice decode(std::string_view bytes) { return Invoice::from_json(bytes); }
//   };
//
// decode must accept every string encode produced, including one stored by an earlier
// version of your program if records outlive a deploy.

#include <cstddef>
#include <string>
#include <string_view>
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

}  // namespace idem
