#include "stores/postgres/postgres_server.h"

namespace idem::postgres {
namespace {

// Products that answer the PostgreSQL protocol, by what their version() contains. Each
// string is from the product's own version() output (docs/stores/postgres.md lists them).
struct Lookalike {
  std::string_view marker;
  std::string_view product;
};
constexpr Lookalike kLookalikes[] = {
    {"CockroachDB", "CockroachDB"},  // "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, ...)"
    {"-YB-", "YugabyteDB"},          // "PostgreSQL 11.2-YB-2.20.1.0-b0 on x86_64-pc-linux-gnu, ..."
    {"Redshift",
     "Amazon Redshift"},         // "PostgreSQL 8.0.2 on i686-pc-linux-gnu, ..., Redshift 1.0.48805"
    {"Greenplum", "Greenplum"},  // "PostgreSQL 12.12 (Greenplum Database 7.0.0 build ...) on ..."
    {"QuestDB",
     "QuestDB"},  // "PostgreSQL 12.3, compiled by Visual C++ build 1914, 64-bit, QuestDB"
};

// The version text as shown in a message: its first line, at most 100 characters.
std::string shown(std::string_view version) {
  std::string_view line = version.substr(0, version.find('\n'));
  std::string out(line.substr(0, 100));
  if (line.size() > 100) out += "...";
  return "version() says '" + out + "'";
}

}  // namespace

std::optional<std::string> refused_server(std::string_view version, int version_num) {
  for (const Lookalike& l : kLookalikes) {
    if (version.find(l.marker) != std::string_view::npos) {
      return "the server is " + std::string(l.product) +
             ", which speaks PostgreSQL's protocol but is not PostgreSQL (" + shown(version) + ")";
    }
  }
  if (version.rfind("PostgreSQL ", 0) != 0) {
    return "the server is not PostgreSQL (" + shown(version) + ")";
  }
  if (version_num != 0 && version_num < kMinServerVersion) {
    return "PostgreSQL 12 or later is needed (" + shown(version) + ")";
  }
  return std::nullopt;
}

}  // namespace idem::postgres
