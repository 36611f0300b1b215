// What the PostgreSQL store decides without a server: which servers it refuses by their
// version() (real strings, as each product prints them), and the names of its statements.
// The refusal of a look-alike cannot be shown against the look-alike itself here (none is
// installed); the server tests show that real PostgreSQL passes the same check.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "stores/postgres/postgres_connection.h"
#include "stores/postgres/postgres_schema.h"
#include "stores/postgres/postgres_server.h"

namespace idem::postgres {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

TEST(PostgresServerCheck, RefusesLookalikesByWhatTheirVersionSays) {
  // (version() as the product prints it, its server_version_num, the product named)
  const std::vector<std::tuple<std::string, int, std::string>> lookalikes = {
      {"CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)",
       130000, "CockroachDB"},
      {"PostgreSQL 11.2-YB-2.20.1.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 16.0.6",
       110002, "YugabyteDB"},
      {"PostgreSQL 15.12-YB-2025.1.0.0-b0 on x86_64-pc-linux-gnu, compiled by clang", 150012,
       "YugabyteDB"},
      {"PostgreSQL 8.0.2 on i686-pc-linux-gnu, compiled by GCC gcc (GCC) 3.4.2 20041017 (Red "
       "Hat 3.4.2-6.fc3), Redshift 1.0.48805",
       80002, "Redshift"},
      {"PostgreSQL 12.12 (Greenplum Database 7.0.0 build commit:abc) on x86_64", 120012,
       "Greenplum"},
      {"PostgreSQL 12.3, compiled by Visual C++ build 1914, 64-bit, QuestDB", 120003, "QuestDB"},
  };
  for (const auto& [version, num, product] : lookalikes) {
    std::optional<std::string> why = refused_server(version, num);
    ASSERT_TRUE(why.has_value()) << version;
    EXPECT_THAT(*why, AllOf(HasSubstr(product), HasSubstr("not PostgreSQL"))) << version;
  }
  std::optional<std::string> other = refused_server("SomeDB 1.0 (wire compatible)", 0);
  ASSERT_TRUE(other.has_value());
  EXPECT_THAT(*other, AllOf(HasSubstr("not PostgreSQL"), HasSubstr("SomeDB 1.0")));
}

TEST(PostgresServerCheck, AcceptsPostgresqlTwelveAndLaterAndRefusesOlder) {
  EXPECT_EQ(refused_server("PostgreSQL 15.18 (Debian 15.18-0+deb12u1) on x86_64-pc-linux-gnu, "
                           "compiled by gcc (Debian 12.2.0-14+deb12u1) 12.2.0, 64-bit",
                           150018),
            std::nullopt);
  EXPECT_EQ(refused_server("PostgreSQL 12.0 on x86_64-pc-linux-gnu", 120000), std::nullopt);
  std::optional<std::string> old =
      refused_server("PostgreSQL 11.22 on x86_64-pc-linux-gnu", 110022);
  ASSERT_TRUE(old.has_value());
  EXPECT_THAT(*old, HasSubstr("PostgreSQL 12 or later"));
}

TEST(PostgresStatementNames, OneNameIsOneTextOnOneTable) {
  const TableNames a{"public", "a"};
  const TableNames b{"public", "b"};
  const Statement acquire_a(a.display(), Sql(a).acquire, {kByteaOid});
  const Statement acquire_a_again(a.display(), Sql(a).acquire, {kByteaOid});
  const Statement acquire_b(b.display(), Sql(b).acquire, {kByteaOid});
  const Statement complete_a(a.display(), Sql(a).complete, {kByteaOid});
  EXPECT_EQ(acquire_a.name, acquire_a_again.name);
  EXPECT_NE(acquire_a.name, acquire_b.name);
  EXPECT_NE(acquire_a.name, complete_a.name);
  // The same text for two tables (a statement that names no table) still differs by table.
  EXPECT_NE(Statement(a.display(), "COMMIT").name, Statement(b.display(), "COMMIT").name);
  // Within PostgreSQL's 63 bytes for a name.
  EXPECT_THAT(acquire_a.name, MatchesRegex("idem_[0-9a-f]{16}"));
}

}  // namespace
}  // namespace idem::postgres
