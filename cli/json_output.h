#pragma once

// JSON rendering shared by `idem show` and `idem bench`.

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "idem/types.h"

namespace idem::cli {

// The record as `idem show` prints it (docs/cli.md lists the fields). `record` empty means
// the key is absent.
nlohmann::ordered_json record_json(std::string_view store, std::string_view scope,
                                   std::string_view key, const std::optional<Record>& record);

// Dumps `value` with two-space indentation and a final newline. Bytes that are not UTF-8
// (scope, key or fingerprint are arbitrary bytes) are replaced with U+FFFD, not thrown on.
std::string dump_json(const nlohmann::ordered_json& value);

}  // namespace idem::cli
