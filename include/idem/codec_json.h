#pragma once

// Opt-in JSON results through nlohmann-json (Debian: nlohmann-json3-dev). Including this
// header is the only place idem needs nlohmann-json; nothing else depends on it.
//
//   #include <idem/codec_json.h>
//
//   // nlohmann::json itself has a codec:
//   auto r = executor.run<nlohmann::json>(scope, key, [&](const idem::Attempt&) {
//     return nlohmann::json{{"status", "paid"}, {"id", 42}};
//   });
//
//   // Any type with to_json/from_json opts in with one line:
//   template <>
//   struct idem::Codec<Invoice> : idem::JsonCodec<Invoice> {};
//
// A stored result that is not valid JSON, or does not convert to T, makes the caller get
// idem::DecodeFailed with the stored bytes.

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "idem/codec.h"

namespace idem {

template <typename T>
struct JsonCodec {
  static std::string encode(const T& value) { return nlohmann::json(value).dump(); }
  static T decode(std::string_view bytes) { return nlohmann::json::parse(bytes).get<T>(); }
};

template <>
struct Codec<nlohmann::json> {
  static std::string encode(const nlohmann::json& value) { return value.dump(); }
  static nlohmann::json decode(std::string_view bytes) { return nlohmann::json::parse(bytes); }
};

}  // namespace idem
