// The SQLite store when its database file is damaged behind its back while it is open
// (docs/RELIABILITY.md, "Hostile input"): truncated to nothing or to half, or filled with
// garbage (the header too, or only the pages after it). Every call afterwards either
// answers truthfully (a replay returns exactly the payload that was stored, never bytes
// read from garbage) or throws idem::StoreUnavailable naming the file; nothing crashes,
// hangs or throws anything else. Opening the damaged file again behaves the same.

#include <fcntl.h>
#include <gmock/gmock.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "idem/error.h"
#include "idem/stores/sqlite_store.h"
#include "idem/testing/matchers.h"  // gtest printers for the store results (ODR)
#include "stores/sqlite/sqlite_test_util.h"
#include "testing/conformance/test_data.h"

namespace idem::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kRecords = 12;
constexpr std::size_t kPayloadBytes = 20'000;  // several overflow pages each

std::string payload_of(int i) { return binary_payload(kPayloadBytes, 100 + i); }

enum class Damage { kTruncateToZero, kTruncateToHalf, kGarbageEverywhere, kGarbageAfterHeader };

std::string to_string(Damage d) {
  switch (d) {
    case Damage::kTruncateToZero:
      return "TruncatedToZero";
    case Damage::kTruncateToHalf:
      return "TruncatedToHalf";
    case Damage::kGarbageEverywhere:
      return "GarbageEverywhere";
    case Damage::kGarbageAfterHeader:
      return "GarbageAfterHeader";
  }
  return "?";
}

void damage(const std::string& path, Damage d) {
  const auto size = static_cast<off_t>(std::filesystem::file_size(path));
  ASSERT_GT(size, 4096) << "the records were not checkpointed into " << path;
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  switch (d) {
    case Damage::kTruncateToZero:
      ASSERT_EQ(::ftruncate(fd, 0), 0);
      break;
    case Damage::kTruncateToHalf:
      ASSERT_EQ(::ftruncate(fd, size / 2), 0);
      break;
    case Damage::kGarbageEverywhere:
    case Damage::kGarbageAfterHeader: {
      const off_t start = d == Damage::kGarbageEverywhere ? 0 : 4096;
      const std::string garbage = binary_payload(static_cast<std::size_t>(size - start), 7);
      ASSERT_EQ(::pwrite(fd, garbage.data(), garbage.size(), start),
                static_cast<ssize_t>(garbage.size()));
      break;
    }
  }
  ::close(fd);
}

// Runs `call`; a StoreUnavailable must name the file. Returns false when it threw.
template <typename Call>
bool answers(const std::string& path, Call&& call) {
  try {
    call();
    return true;
  } catch (const StoreUnavailable& e) {
    EXPECT_THAT(e.what(), HasSubstr(path));
    EXPECT_THAT(e.store(), HasSubstr(path));
    return false;
  }
}

// Every operation on every record; each answer is true to what was stored, or an error.
void exercise(Store& store, const std::string& path) {
  int errors = 0;
  for (int i = 0; i < kRecords; ++i) {
    const std::string key = "k" + std::to_string(i);
    errors += !answers(path, [&] {
      const AcquireResult r = store.acquire("s", key, Duration{60'000}, Duration{60'000});
      if (const auto* replay = std::get_if<Replay>(&r)) {
        EXPECT_TRUE(replay->payload == payload_of(i))
            << key << ": replayed " << replay->payload.size() << " bytes that were never stored";
      } else if (const auto* acquired = std::get_if<Acquired>(&r)) {
        (void)store.complete("s", key, acquired->lease.token, payload_of(i), Duration{60'000});
      } else {
        ADD_FAILURE() << key << ": busy, but no lease was ever taken on it";
      }
    });
    errors += !answers(path, [&] {
      if (const std::optional<Record> rec = store.get("s", key);
          rec && rec->state == RecordState::kComplete) {
        EXPECT_TRUE(rec->payload == payload_of(i)) << key;
      }
    });
  }
  errors += !answers(path, [&] { (void)store.purge(100); });
  errors += !answers(path, [&] { (void)store.forget("s", "k0"); });
  // Either way is honest; the count shows which in the log.
  std::cout << "  " << errors << " calls failed with StoreUnavailable\n";
}

class SqliteDamagedFile : public ::testing::TestWithParam<Damage> {};

TEST_P(SqliteDamagedFile, EveryCallAnswersTruthfullyOrNamesTheFile) {
  const std::string path = fresh_db_path("damaged");
  auto store = std::make_shared<SqliteStore>(SqliteStoreOptions{.path = path});
  for (int i = 0; i < kRecords; ++i) {
    const std::string key = "k" + std::to_string(i);
    const AcquireResult r = store->acquire("s", key, Duration{60'000}, Duration{60'000});
    ASSERT_TRUE(std::holds_alternative<Acquired>(r));
    ASSERT_EQ(store->complete("s", key, std::get<Acquired>(r).lease.token, payload_of(i),
                              Duration{60'000}),
              WriteResult::kDone);
  }
  // Move every record from the write-ahead log into the file, then damage the file.
  RawDb(path).exec("PRAGMA wal_checkpoint(TRUNCATE)");
  damage(path, GetParam());

  exercise(*store, path);
  store.reset();
  // A store opened on the damaged file afterwards: refused naming the file, or working.
  std::shared_ptr<SqliteStore> reopened;
  if (answers(path, [&] {
        reopened = std::make_shared<SqliteStore>(SqliteStoreOptions{.path = path});
      })) {
    exercise(*reopened, path);
  }
}

INSTANTIATE_TEST_SUITE_P(Damage, SqliteDamagedFile,
                         ::testing::Values(Damage::kTruncateToZero, Damage::kTruncateToHalf,
                                           Damage::kGarbageEverywhere, Damage::kGarbageAfterHeader),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace idem::testing
