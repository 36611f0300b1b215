// The PostgreSQL store measured beside a raw libpq program doing the least each step needs,
// in the same process and run, on one table (docs/stores/postgres.md has the figures):
//
//   fresh run: Executor::run on a new key   vs  raw: one prepared upsert that takes the
//              lease (INSERT ... ON CONFLICT DO UPDATE ... WHERE expired, RETURNING the
//              token) and one prepared UPDATE that completes it
//   replay:    Executor::run on a completed key  vs  raw: one prepared SELECT
//
// at 1 caller (raw: 1 connection) and 16 concurrent callers (raw: 8 connections, one per
// thread), with synchronous_commit on and off (the store's synchronous_commit=off option;
// the raw side's session setting). And the batched heartbeat: N leases of 3 s, extended
// every 1 s by one heartbeat thread, held for S seconds, none lost, with the statements and
// the server's commits per second (pg_stat_database.xact_commit) it costs.
//
// The server comes from IDEM_BENCH_POSTGRES_URL, else IDEM_TEST_POSTGRES_URL. The heartbeat
// size comes from IDEM_BENCH_HEARTBEAT_LEASES (default 1000) and
// IDEM_BENCH_HEARTBEAT_SECONDS (default 4); the figures in the docs use 10000 and 30.
// IDEM_BENCH_RAW_STATEMENTS=unnamed makes the raw side send its statements' texts instead of
// preparing them: what a plain libpq program can do behind PgBouncer 1.18 in transaction
// pooling, where a statement prepared on one server connection is missing on the next.
//
//   build/release/bench/postgres_bench --benchmark_repetitions=3
//       --benchmark_enable_random_interleaving=true
//       --benchmark_report_aggregates_only=true   (one command line)

#include <benchmark/benchmark.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/heartbeat.h"
#include "idem/executor.h"
#include "idem/open_store.h"
#include "idem/store_wrapper.h"
#include "idem/stores/postgres_store.h"
#include "stores/postgres/postgres_schema.h"
#include "taking_turns.h"

namespace {

using namespace std::chrono_literals;

constexpr int kPopulated = 20'000;
// Replays cycle over the most recently completed records (a duplicate usually arrives soon
// after the original).
constexpr int kReplayed = 2'000;
constexpr const char* kScope = "bench";
const std::string kPayload(32, 'p');

std::string g_url;
std::string g_table;  // unqualified; in the connection's current schema

std::string env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

std::string url_with(const std::string& query) {
  return g_url + (g_url.find('?') == std::string::npos ? "?" : "&") + query;
}

[[noreturn]] void die(PGconn* c, const std::string& what) {
  std::fprintf(stderr, "postgres_bench: %s: %s\n", what.c_str(), c ? PQerrorMessage(c) : "?");
  std::abort();
}

std::string be64(std::int64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[static_cast<std::size_t>(i)] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  return out;
}

// A raw connection with the statements prepared (or, with IDEM_BENCH_RAW_STATEMENTS=unnamed,
// sent as text every time): the least each step needs.
class Raw {
 public:
  explicit Raw(bool synchronous)
      : c_(PQconnectdb(g_url.c_str())), unnamed_(env("IDEM_BENCH_RAW_STATEMENTS") == "unnamed") {
    if (PQstatus(c_) != CONNECTION_OK) die(c_, "connect");
    exec(synchronous ? "SET synchronous_commit = on" : "SET synchronous_commit = off");
    const idem::postgres::TableNames names{current_schema(), g_table};
    const idem::postgres::Sql sql(names);
    // The same record the store writes, with the token drawn in the VALUES list: no
    // per-key lock, no read first, no answer for a live record.
    const std::string upsert =
        "INSERT INTO " + names.table() +
        " AS r (scope, key, state, token, attempt, acquired_at, lease_expires_at, completed_at, "
        "expires_at, purge_after, fingerprint, payload) VALUES ($1, $2, 0, nextval('" +
        names.sequence() +
        "'), 1, statement_timestamp(), statement_timestamp() + $3 * interval '1 millisecond', "
        "NULL, statement_timestamp() + $4 * interval '1 millisecond', statement_timestamp() + "
        "greatest($3, $4) * interval '1 millisecond', NULL, NULL) ON CONFLICT (scope, key) DO "
        "UPDATE SET state = 0, token = excluded.token, attempt = r.attempt + 1, acquired_at = "
        "excluded.acquired_at, lease_expires_at = excluded.lease_expires_at, expires_at = "
        "excluded.expires_at, purge_after = excluded.purge_after, payload = NULL WHERE CASE "
        "WHEN r.state = 1 THEN r.expires_at <= statement_timestamp() ELSE r.lease_expires_at <= "
        "statement_timestamp() END RETURNING r.token";
    const Oid bytea = 17, int8 = 20;
    prepare("upsert", upsert, {bytea, bytea, int8, int8});
    prepare("complete", sql.complete, {bytea, bytea, int8, bytea, int8});
    prepare("select", sql.select_record, {bytea, bytea});
  }
  ~Raw() { PQfinish(c_); }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;

  void fresh(const std::string& key) {
    const std::string lease = be64(30'000), ttl = be64(86'400'000);
    const char* v1[] = {kScope, key.data(), lease.data(), ttl.data()};
    const int l1[] = {5, static_cast<int>(key.size()), 8, 8};
    const int f[] = {1, 1, 1, 1, 1};
    PGresult* r = run("upsert", 4, v1, l1, f);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) die(c_, "upsert");
    const std::string token(PQgetvalue(r, 0, 0), 8);
    PQclear(r);
    const char* v2[] = {kScope, key.data(), token.data(), kPayload.data(), ttl.data()};
    const int l2[] = {5, static_cast<int>(key.size()), 8, static_cast<int>(kPayload.size()), 8};
    r = run("complete", 5, v2, l2, f);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) die(c_, "complete");
    PQclear(r);
  }

  void replay(const std::string& key) {
    const char* v[] = {kScope, key.data()};
    const int l[] = {5, static_cast<int>(key.size())};
    const int f[] = {1, 1};
    PGresult* r = run("select", 2, v, l, f);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) die(c_, "select");
    PQclear(r);
  }

  void exec(const std::string& sql) {
    PGresult* r = PQexec(c_, sql.c_str());
    const ExecStatusType s = PQresultStatus(r);
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) die(c_, sql);
    PQclear(r);
  }

  std::string value(const std::string& sql) {
    PGresult* r = PQexec(c_, sql.c_str());
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) die(c_, sql);
    std::string out = PQgetvalue(r, 0, 0);
    PQclear(r);
    return out;
  }

 private:
  std::string current_schema() { return value("SELECT current_schema()"); }

  void prepare(const char* name, const std::string& sql, const std::vector<Oid>& types) {
    statements_[name] = {sql, types};
    if (unnamed_) return;
    PGresult* r = PQprepare(c_, name, sql.c_str(), static_cast<int>(types.size()), types.data());
    if (PQresultStatus(r) != PGRES_COMMAND_OK) die(c_, std::string("prepare ") + name);
    PQclear(r);
  }

  PGresult* run(const char* name, int n, const char* const* values, const int* lengths,
                const int* formats) {
    if (!unnamed_) return PQexecPrepared(c_, name, n, values, lengths, formats, 1);
    const auto& [sql, types] = statements_.at(name);
    return PQexecParams(c_, sql.c_str(), n, types.data(), values, lengths, formats, 1);
  }

  PGconn* c_;
  bool unnamed_;
  std::map<std::string, std::pair<std::string, std::vector<Oid>>> statements_;
};

std::string replay_key(std::int64_t i) { return "populated-" + std::to_string(i); }

// The i-th replayed key of a thread: threads start far apart in the hot set, so no two
// callers ask for one key at once (the executor would let the second wait in memory for the
// first instead of asking the store).
std::string hot_key(const benchmark::State& state, std::int64_t i) {
  const std::int64_t start = state.thread_index() * (kReplayed / 16);
  return replay_key(kPopulated - 1 - ((start + i) % kReplayed));
}

// Fresh keys, unique across threads, runs and processes.
std::string fresh_key() {
  static std::atomic<long> counter{0};
  static const std::string prefix = "fresh-" + std::to_string(::getpid()) + "-";
  return prefix + std::to_string(counter.fetch_add(1));
}

// One store and executor per synchronous_commit setting, kept for the whole process so every
// benchmark finds its connections open (as a long-running service does).
idem::Executor& executor(bool synchronous) {
  static std::mutex mu;
  static std::map<bool, std::unique_ptr<idem::Executor>> executors;
  std::lock_guard lock(mu);
  auto& e = executors[synchronous];
  if (!e) {
    std::string query = "table=" + g_table + (synchronous ? "" : "&synchronous_commit=off");
    if (const std::string extra = env("IDEM_BENCH_STORE_OPTIONS"); !extra.empty()) {
      query += "&" + extra;
    }
    e = std::make_unique<idem::Executor>(idem::open_store(url_with(query)));
  }
  return *e;
}

void set_up_table() {
  g_table = "idem_bench_" + std::to_string(::getpid());
  (void)idem::open_store(url_with("table=" + g_table));  // creates the schema
  Raw raw(true);
  // Completed records, so both sides read and grow a populated table and index.
  raw.exec("INSERT INTO " + g_table +
           " SELECT 'bench'::bytea, convert_to('populated-' || i, 'UTF8'), 1, nextval('" + g_table +
           "_token_seq'), 1, NULL, NULL, statement_timestamp(), statement_timestamp() "
           "+ interval '1 day', statement_timestamp() + interval '1 day', NULL, '" +
           kPayload + "'::bytea FROM generate_series(0, " + std::to_string(kPopulated - 1) + ") i");
  raw.exec("ANALYZE " + g_table);
}

void tear_down_table() {
  Raw raw(true);
  raw.exec("DROP TABLE IF EXISTS " + g_table + "; DROP SEQUENCE IF EXISTS " + g_table +
           "_token_seq");
}

// --- fresh runs and replays ---

void BM_RawFresh(benchmark::State& state) {
  Raw raw(state.range(0) == 1);
  for (auto _ : state) raw.fresh(fresh_key());
  state.SetItemsProcessed(state.iterations());
}

void BM_StoreFresh(benchmark::State& state) {
  idem::Executor& exec = executor(state.range(0) == 1);
  for (auto _ : state) {
    auto r = exec.run(kScope, fresh_key(), [](const idem::Attempt&) { return kPayload; });
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations());
}

// The store's own calls for a fresh run, without the executor (acquire, then complete), to
// tell the store's cost from the executor's.
void BM_StoreCallsFresh(benchmark::State& state) {
  idem::Store& store = executor(state.range(0) == 1).store();
  for (auto _ : state) {
    const std::string key = fresh_key();
    auto a = std::get<idem::Acquired>(store.acquire(kScope, key, 30s, 24h));
    if (store.complete(kScope, key, a.lease.token, kPayload, 24h) != idem::WriteResult::kDone) {
      std::abort();
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_RawReplay(benchmark::State& state) {
  Raw raw(state.range(0) == 1);
  std::int64_t i = 0;
  for (auto _ : state) raw.replay(hot_key(state, i++));
  state.SetItemsProcessed(state.iterations());
}

void BM_StoreReplay(benchmark::State& state) {
  idem::Executor& exec = executor(state.range(0) == 1);
  std::int64_t i = 0;
  for (auto _ : state) {
    auto r = exec.run(kScope, hot_key(state, i++),
                      [](const idem::Attempt&) -> std::string { std::abort(); });
    if (!r.replayed) std::abort();
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_RawFresh)->ArgName("sync")->Arg(1)->Arg(0)->Threads(1)->Threads(8)->UseRealTime();
BENCHMARK(BM_StoreFresh)->ArgName("sync")->Arg(1)->Arg(0)->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK(BM_StoreCallsFresh)->ArgName("sync")->Arg(1)->Arg(0)->Threads(1)->UseRealTime();
BENCHMARK(BM_RawReplay)->ArgName("sync")->Arg(1)->Arg(0)->Threads(1)->Threads(8)->UseRealTime();
BENCHMARK(BM_StoreReplay)->ArgName("sync")->Arg(1)->Arg(0)->Threads(1)->Threads(16)->UseRealTime();

// --- raw and store taking turns ---

// The machine these figures come from is shared, and its load moves by a factor of two
// within a minute. So besides the runs above, raw and store also take turns in slices of
// 250 ms (taking_turns.h; IDEM_BENCH_SLICES each, default 2), so both see the same
// machine, and the ratio comes from the same minutes.
using idem::bench::slice;

// Arguments: fresh (1) or replay (0); synchronous_commit on (1) or off (0); 1 caller (0) or
// 16 callers against 8 raw connections (1).
void BM_TakingTurns(benchmark::State& state) {
  const bool fresh = state.range(0) == 1;
  const bool synchronous = state.range(1) == 1;
  const bool concurrent = state.range(2) == 1;
  const int raw_threads = concurrent ? 8 : 1;
  const int store_threads = concurrent ? 16 : 1;
  const int slices = std::stoi(env("IDEM_BENCH_SLICES", "2"));
  std::vector<std::unique_ptr<Raw>> raws;
  for (int t = 0; t < raw_threads; ++t) raws.push_back(std::make_unique<Raw>(synchronous));
  idem::Executor& exec = executor(synchronous);
  auto hot = [](int thread, long i) {
    return replay_key(kPopulated - 1 - ((thread * (kReplayed / 16) + i) % kReplayed));
  };
  auto raw_op = [&](int t, long i) {
    if (fresh) {
      raws[static_cast<std::size_t>(t)]->fresh(fresh_key());
    } else {
      raws[static_cast<std::size_t>(t)]->replay(hot(t, i));
    }
  };
  auto store_op = [&](int t, long i) {
    auto r = fresh ? exec.run(kScope, fresh_key(), [](const idem::Attempt&) { return kPayload; })
                   : exec.run(kScope, hot(t, i),
                              [](const idem::Attempt&) -> std::string { std::abort(); });
    benchmark::DoNotOptimize(r);
  };
  long raw_ops = 0, store_ops = 0;
  double raw_s = 0, store_s = 0;
  // Not counted: connections opened, statements prepared, the adaptive mode settled.
  slice(raw_threads, raw_op);
  slice(store_threads, store_op);
  for (auto _ : state) {
    for (int i = 0; i < slices; ++i) {
      auto [rn, rs] = slice(raw_threads, raw_op);
      auto [sn, ss] = slice(store_threads, store_op);
      raw_ops += rn;
      raw_s += rs;
      store_ops += sn;
      store_s += ss;
    }
  }
  state.counters["raw_per_s"] = static_cast<double>(raw_ops) / raw_s;
  state.counters["store_per_s"] = static_cast<double>(store_ops) / store_s;
  state.counters["ratio"] =
      (static_cast<double>(store_ops) / store_s) / (static_cast<double>(raw_ops) / raw_s);
}

BENCHMARK(BM_TakingTurns)
    ->ArgNames({"fresh", "sync", "concurrent"})
    ->ArgsProduct({{1, 0}, {1, 0}, {0, 1}})
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kSecond);

// --- the batched heartbeat ---

// Counts the heartbeat's statements: each extend_many is one statement, one commit.
class CountingStore : public idem::StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  std::atomic<long> batches{0};
  std::atomic<long> extends{0};

 protected:
  std::vector<idem::ExtendResult> do_extend_many(
      std::span<const idem::ExtendRequest> requests) override {
    ++batches;
    extends += static_cast<long>(requests.size());
    return StoreWrapper::do_extend_many(requests);
  }
};

long xact_commit(Raw& raw) {
  raw.exec("SELECT pg_stat_clear_snapshot()");
  return std::stol(
      raw.value("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"));
}

void BM_Heartbeat(benchmark::State& state) {
  const int leases = std::stoi(env("IDEM_BENCH_HEARTBEAT_LEASES", "1000"));
  const int seconds = std::stoi(env("IDEM_BENCH_HEARTBEAT_SECONDS", "4"));
  const idem::Duration lease = 3s;
  const idem::Duration interval = 1s;
  // The heartbeat's own store (one statement at a time), apart from the one that acquires.
  auto counting = std::make_shared<CountingStore>(idem::open_store(url_with("table=" + g_table)));
  Raw raw(true);
  for (auto _ : state) {
    idem::detail::Heartbeat heartbeat(*counting, nullptr);
    std::vector<std::shared_ptr<idem::detail::HeartbeatLease>> held(leases);
    {
      // Acquired by 16 threads; each lease joins the heartbeat as soon as it is granted.
      auto acquirer = idem::open_store(url_with("table=" + g_table));
      std::mutex mu;
      std::atomic<int> next{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < 16; ++t) {
        threads.emplace_back([&] {
          for (int i = next++; i < leases; i = next++) {
            const std::string key = "lease-" + std::to_string(::getpid()) + "-" + std::to_string(i);
            const auto sent = idem::detail::SteadyClock::now();
            auto a = std::get<idem::Acquired>(acquirer->acquire(kScope, key, lease, 1h));
            auto l = std::make_shared<idem::detail::HeartbeatLease>(
                kScope, key, a.lease.token, lease, interval, sent + a.lease.lease_remaining,
                a.lease.lease_expires_at);
            heartbeat.add(l);
            std::lock_guard lock(mu);
            held[static_cast<std::size_t>(i)] = std::move(l);
          }
        });
      }
      for (auto& t : threads) t.join();
    }  // the acquiring store's connections close, so their statistics reach the server
    std::this_thread::sleep_for(2s);
    const long batches0 = counting->batches;
    const long extends0 = counting->extends;
    const long commits0 = xact_commit(raw);
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const long commits = xact_commit(raw) - commits0 - 2;  // less this connection's own two
    int lost = 0;
    for (const auto& l : held) {
      lost += l->lost() ? 1 : 0;
      heartbeat.remove(*l);
    }
    state.counters["leases"] = leases;
    state.counters["lost"] = lost;
    state.counters["extends_per_s"] = static_cast<double>(counting->extends - extends0) / wall;
    state.counters["statements_per_s"] = static_cast<double>(counting->batches - batches0) / wall;
    state.counters["server_commits_per_s"] = static_cast<double>(commits) / wall;
  }
}

BENCHMARK(BM_Heartbeat)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

}  // namespace

int main(int argc, char** argv) {
  g_url = env("IDEM_BENCH_POSTGRES_URL", env("IDEM_TEST_POSTGRES_URL").c_str());
  if (g_url.empty()) {
    const bool required = env("IDEM_REQUIRE_SERVERS") == "1";
    std::fprintf(stderr,
                 "postgres_bench: set IDEM_BENCH_POSTGRES_URL or IDEM_TEST_POSTGRES_URL%s\n",
                 required ? " (IDEM_REQUIRE_SERVERS=1)" : "; skipped");
    return required ? 1 : 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  set_up_table();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  tear_down_table();
  return 0;
}
