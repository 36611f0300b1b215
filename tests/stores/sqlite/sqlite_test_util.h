#pragma once

// Helpers for the SQLite store tests: a temporary directory removed at exit, fresh database
// paths in it, and a raw SQLite connection to inspect or tamper with a file behind the
// store's back.

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

namespace idem::testing {

// The directory every test of this executable puts its files in; removed when the
// process exits.
inline const std::filesystem::path& temp_dir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      std::string pattern =
          (std::filesystem::temp_directory_path() / "idem-sqlite-XXXXXX").string();
      if (mkdtemp(pattern.data()) == nullptr) std::abort();
      path = pattern;
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

// A database path nobody has used yet (the file does not exist).
inline std::string fresh_db_path(const std::string& stem = "store") {
  static std::atomic<int> counter{0};
  return (temp_dir() / (stem + "-" + std::to_string(counter.fetch_add(1)) + ".db")).string();
}

// A raw connection for tests: runs SQL directly against the file.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    sqlite3* raw = nullptr;
    const int rc =
        sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
    db_.reset(raw);
    if (rc != SQLITE_OK) ADD_FAILURE() << "cannot open " << path << ": " << sqlite3_errstr(rc);
  }

  // Runs statements; returns the SQLite result code and records a failure if it is not OK
  // unless `expect_ok` is false.
  int exec(const std::string& sql, bool expect_ok = true) {
    char* err = nullptr;
    const int rc = sqlite3_exec(db_.get(), sql.c_str(), nullptr, nullptr, &err);
    if (expect_ok && rc != SQLITE_OK) ADD_FAILURE() << sql << ": " << (err ? err : "?");
    sqlite3_free(err);
    return rc;
  }

  std::string query_text(const std::string& sql) {
    sqlite3_stmt* raw = nullptr;
    if (sqlite3_prepare_v2(db_.get(), sql.c_str(), -1, &raw, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db_.get());
      return {};
    }
    std::unique_ptr<sqlite3_stmt, decltype(&sqlite3_finalize)> stmt(raw, &sqlite3_finalize);
    if (sqlite3_step(raw) != SQLITE_ROW) return {};
    const auto* text = sqlite3_column_text(raw, 0);
    return text ? reinterpret_cast<const char*>(text) : "";
  }

  std::int64_t query_int(const std::string& sql) {
    const std::string text = query_text(sql);
    return text.empty() ? -1 : std::stoll(text);
  }

 private:
  struct Closer {
    void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
  };
  std::unique_ptr<sqlite3, Closer> db_;
};

}  // namespace idem::testing
