#pragma once

// What the PostgreSQL store checks about its server when it opens (docs/stores/postgres.md,
// "Deploying"): that it is PostgreSQL 12 or later, not a product that only speaks its
// protocol. The store's per-key token order rests on PostgreSQL's advisory locks and its
// READ COMMITTED upserts; CockroachDB, for one, accepts the advisory-lock functions and
// locks nothing, so the order would be lost without an error.

#include <optional>
#include <string>
#include <string_view>

namespace idem::postgres {

// The oldest server the statements run on (WITH ... AS MATERIALIZED).
inline constexpr int kMinServerVersion = 120000;

// Why a server whose version() is `version` and whose server_version_num is `version_num`
// (0: not known) must not be used, or nullopt when it may.
std::optional<std::string> refused_server(std::string_view version, int version_num);

}  // namespace idem::postgres
