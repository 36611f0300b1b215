// The SQLite store measured beside a raw SQLite program doing the same statements and
// transactions, in the same process and run (docs/stores/sqlite.md has the figures).
//
//   fresh run: SELECT (autocommit read); BEGIN IMMEDIATE; SELECT; UPDATE idem_meta ...
//              RETURNING; INSERT ... ON CONFLICT; COMMIT; then BEGIN IMMEDIATE; UPDATE
//              (complete); COMMIT.
//   replay:    one SELECT in autocommit.
//
// Both sides use one file (schema created by the store, WAL, synchronous=NORMAL), populated
// with completed records first, so they read and grow the very same table and index.

#include <benchmark/benchmark.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <variant>

#include "idem/executor.h"
#include "idem/stores/sqlite_store.h"
#include "stores/sqlite/sqlite_schema.h"

namespace {

using namespace std::chrono_literals;

constexpr int kPopulated = 20'000;
// Replays cycle over the most recently completed records: a duplicate usually arrives soon
// after the original. This hot set fits SQLite's default page cache, so both sides measure
// SQLite and idem rather than the kernel's read path (a cold read costs both the same).
constexpr int kReplayed = 2'000;
constexpr std::string_view kScope = "bench";

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void die(sqlite3* db, const char* what) {
  fprintf(stderr, "sqlite_bench: %s: %s\n", what, db ? sqlite3_errmsg(db) : "?");
  abort();
}

void ok(sqlite3* db, int rc, const char* what) {
  if (rc != SQLITE_OK && rc != SQLITE_ROW && rc != SQLITE_DONE) die(db, what);
}

struct Stmt {
  sqlite3_stmt* s = nullptr;
  Stmt(sqlite3* db, const char* sql) {
    ok(db, sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, nullptr), sql);
  }
  ~Stmt() { sqlite3_finalize(s); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
};

// A raw connection preparing the very statements the store prepares (sqlite_schema.h).
struct Raw {
  sqlite3* db = nullptr;
  std::unique_ptr<Stmt> select, next_token, write_lease, complete, begin, commit;

  explicit Raw(const std::string& path) {
    ok(db, sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr),
       "open");
    sqlite3_busy_timeout(db, 5000);
    ok(db, sqlite3_exec(db, "PRAGMA synchronous = NORMAL", nullptr, nullptr, nullptr), "sync");
    select = std::make_unique<Stmt>(db, idem::sqlite::kSqlSelectRecord);
    next_token = std::make_unique<Stmt>(db, idem::sqlite::kSqlNextToken);
    write_lease = std::make_unique<Stmt>(db, idem::sqlite::kSqlWriteLease);
    complete = std::make_unique<Stmt>(db, idem::sqlite::kSqlComplete);
    begin = std::make_unique<Stmt>(db, "BEGIN IMMEDIATE");
    commit = std::make_unique<Stmt>(db, "COMMIT");
  }
  ~Raw() {
    select.reset();
    next_token.reset();
    write_lease.reset();
    complete.reset();
    begin.reset();
    commit.reset();
    sqlite3_close_v2(db);
  }

  void bind_id(sqlite3_stmt* s, const std::string& key) {
    sqlite3_bind_blob(s, 1, kScope.data(), static_cast<int>(kScope.size()), SQLITE_STATIC);
    sqlite3_bind_blob(s, 2, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
  }
  // Steps to the end and resets; returns whether a row came back.
  bool run(Stmt& st) {
    int rc = sqlite3_step(st.s);
    const bool row = rc == SQLITE_ROW;
    while (rc == SQLITE_ROW) rc = sqlite3_step(st.s);
    ok(db, rc, "step");
    sqlite3_reset(st.s);
    return row;
  }

  bool read(const std::string& key, std::string* payload) {
    bind_id(select->s, key);
    int rc = sqlite3_step(select->s);
    ok(db, rc, "select");
    const bool found = rc == SQLITE_ROW;
    if (found && payload != nullptr) {
      payload->assign(static_cast<const char*>(sqlite3_column_blob(select->s, 8)),
                      static_cast<std::size_t>(sqlite3_column_bytes(select->s, 8)));
    }
    sqlite3_reset(select->s);
    return found;
  }

  // acquire and complete, each its own write transaction, exactly as the store does them.
  void fresh_run(const std::string& key, const std::string& payload) {
    if (read(key, nullptr)) abort();
    run(*begin);
    if (read(key, nullptr)) abort();
    const std::int64_t token = lease(key);
    run(*commit);
    run(*begin);
    finish(key, token, payload);
    run(*commit);
  }

  // Both writes of a fresh run inside the caller's transaction (to populate the file).
  void write(const std::string& key, const std::string& payload) {
    finish(key, lease(key), payload);
  }

  std::int64_t lease(const std::string& key) {
    const std::int64_t now = now_ms();
    ok(db, sqlite3_step(next_token->s), "next token");
    const std::int64_t token = sqlite3_column_int64(next_token->s, 0);
    run(*next_token);
    sqlite3_stmt* w = write_lease->s;
    bind_id(w, key);
    sqlite3_bind_int64(w, 3, token);
    sqlite3_bind_int64(w, 4, 1);
    sqlite3_bind_int64(w, 5, now);
    sqlite3_bind_int64(w, 6, now + 30'000);
    sqlite3_bind_int64(w, 7, now + 86'400'000);
    sqlite3_bind_null(w, 8);
    run(*write_lease);
    return token;
  }

  void finish(const std::string& key, std::int64_t token, const std::string& payload) {
    const std::int64_t now = now_ms();
    sqlite3_stmt* c = complete->s;
    bind_id(c, key);
    sqlite3_bind_int64(c, 3, token);
    sqlite3_bind_blob(c, 4, payload.data(), static_cast<int>(payload.size()), SQLITE_STATIC);
    sqlite3_bind_int64(c, 5, now);
    sqlite3_bind_int64(c, 6, now + 86'400'000);
    run(*complete);
    if (sqlite3_changes(db) != 1) abort();
  }
};

std::string populated_key(int i) { return "key-" + std::to_string(i); }
std::string replayed_key(int i) { return populated_key(kPopulated - kReplayed + i % kReplayed); }

// Creates a store file with the schema and kPopulated completed records, so the statements
// run against a realistic index rather than an empty table.
std::string make_populated_file(const std::filesystem::path& dir, const char* name) {
  const std::string path = (dir / name).string();
  { idem::SqliteStore schema(idem::SqliteStoreOptions{.path = path}); }
  Raw raw(path);
  ok(raw.db, sqlite3_exec(raw.db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), "begin");
  for (int i = 0; i < kPopulated; ++i)
    raw.write(populated_key(i), "stored result " + std::to_string(i));
  ok(raw.db, sqlite3_exec(raw.db, "COMMIT", nullptr, nullptr, nullptr), "commit");
  return path;
}

// The file, in a temporary directory removed at exit.
struct Files {
  std::filesystem::path dir;
  std::string path;
  Files() {
    std::string pattern = (std::filesystem::temp_directory_path() / "idem-bench-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) abort();
    dir = pattern;
    path = make_populated_file(dir, "bench.db");
  }
  ~Files() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

Files& files() {
  static Files f;
  return f;
}

idem::Executor make_executor() {
  return idem::Executor(std::make_shared<idem::SqliteStore>(
      idem::SqliteStoreOptions{.path = files().path, .synchronous = "normal"}));
}

std::string fresh_key() {
  static std::uint64_t next = 0;
  return "fresh-" + std::to_string(next++);
}

const std::string kResult = "a result of about the size of a small JSON reply: {\"id\":12345}";

// --- fresh runs: acquire + action + complete ---

void BM_RawFreshRun(benchmark::State& state) {
  Raw raw(files().path);
  for (auto _ : state) raw.fresh_run(fresh_key(), kResult);
  state.SetItemsProcessed(state.iterations());
}

void BM_StoreFreshRun(benchmark::State& state) {
  idem::SqliteStore store(idem::SqliteStoreOptions{.path = files().path});
  for (auto _ : state) {
    const std::string key = fresh_key();
    auto r = store.acquire(kScope, key, 30s, 24h);
    const auto& a = std::get<idem::Acquired>(r);
    if (store.complete(kScope, key, a.lease.token, kResult, 24h) != idem::WriteResult::kDone) {
      abort();
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_ExecutorFreshRun(benchmark::State& state) {
  idem::Executor exec = make_executor();
  for (auto _ : state) {
    auto r = exec.run(kScope, fresh_key(), [](const idem::Attempt&) { return kResult; });
    if (r.replayed) abort();
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations());
}

// --- replays of populated records ---

void BM_RawReplay(benchmark::State& state) {
  Raw raw(files().path);
  std::string payload;
  int i = 0;
  for (auto _ : state) {
    if (!raw.read(replayed_key(i++), &payload)) abort();
    benchmark::DoNotOptimize(payload);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_StoreReplay(benchmark::State& state) {
  idem::SqliteStore store(idem::SqliteStoreOptions{.path = files().path});
  int i = 0;
  for (auto _ : state) {
    auto r = store.acquire(kScope, replayed_key(i++), 30s, 24h);
    if (!std::holds_alternative<idem::Replay>(r)) abort();
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_ExecutorReplay(benchmark::State& state) {
  idem::Executor exec = make_executor();
  int i = 0;
  for (auto _ : state) {
    auto r =
        exec.run(kScope, replayed_key(i++), [](const idem::Attempt&) -> std::string { abort(); });
    if (!r.replayed) abort();
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_RawFreshRun)->UseRealTime();
BENCHMARK(BM_StoreFreshRun)->UseRealTime();
BENCHMARK(BM_ExecutorFreshRun)->UseRealTime();
BENCHMARK(BM_RawReplay)->UseRealTime();
BENCHMARK(BM_StoreReplay)->UseRealTime();
BENCHMARK(BM_ExecutorReplay)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
