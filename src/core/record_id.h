#pragma once

// One string for a (scope, key) pair, for in-process tables: one byte for the scope's
// length (at most 255 bytes, SPEC §10), the scope, then the key. Injective, so ("a:b", "c")
// and ("a", "b:c") never share an id (SPEC §2).

#include <string>
#include <string_view>

namespace idem::detail {

inline void encode_record_id(std::string& out, std::string_view scope, std::string_view key) {
  out.clear();
  out.reserve(1 + scope.size() + key.size());
  out.push_back(static_cast<char>(static_cast<unsigned char>(scope.size())));
  out.append(scope);
  out.append(key);
}

inline std::string_view record_id_scope(std::string_view id) {
  return id.substr(1, static_cast<unsigned char>(id[0]));
}

inline std::string_view record_id_key(std::string_view id) {
  return id.substr(1 + std::size_t{static_cast<unsigned char>(id[0])});
}

}  // namespace idem::detail
