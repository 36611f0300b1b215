// The Redis store measured beside a raw hiredis program doing the least each step needs, in
// the same process and run, on the same server (docs/stores/redis.md has the figures):
//
//   raw fresh run: EVALSHA of a short acquire script (GET; TIME; SET PX), then of a short
//                  complete script (GET, compare, SET PX): one at a time, or 16 keys deep
//                  over one connection (16 acquires in one write, then 16 completes).
//   raw replay:    EVALSHA of the acquire script on a completed key, which returns it.
//   idem:          Executor::run on a RedisStore, fresh keys and replays, 1 caller and 32
//                  concurrent callers; with acquire as one script (replay=script) and with
//                  a plain GET first (replay=get).
//
// Each benchmark also reports the server's cost per operation, from the server itself:
// srv_cpu_us (INFO cpu: user + system CPU of redis-server), srv_script_us (INFO
// commandstats: time inside EVALSHA/EVAL) and srv_get_us (time in GET, top-level and
// inside scripts alike).
//
// And what publishing costs (BM_PublishCost): fresh runs with notify=on against notify=off,
// taking turns.
//
// And the batched heartbeat: N leases held for a while by one heartbeat thread over the
// store (IDEM_BENCH_HEARTBEAT="leases,lease_ms,hold_s", default 10000,3000,30); it reports
// leases lost (must be 0), extends per second and per round trip.
//
// Needs a server: IDEM_TEST_REDIS_URL (scripts/servers.sh starts one). Without it the
// benchmark exits 77 (skipped), or 1 when IDEM_REQUIRE_SERVERS=1.
//
//   build/release/bench/redis_bench --benchmark_repetitions=3
//       --benchmark_report_aggregates_only=true   (one command line)

#include <benchmark/benchmark.h>
#include <hiredis/hiredis.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/heartbeat.h"
#include "idem/executor.h"
#include "idem/open_store.h"
#include "idem/stores/redis_store.h"
#include "taking_turns.h"

namespace {

using namespace std::chrono_literals;

// The hot set of completed keys the replays cycle over (IDEM_BENCH_REPLAY_KEYS, default 1000).
int g_replay_keys = 1000;
constexpr int kDepth = 16;
constexpr long long kTtlMs = 120'000;  // keys expire on their own after the run
const std::string kPayload(32, 'p');

std::string g_host;
int g_port = 0;
std::string g_prefix;

// --- the raw side ---------------------------------------------------------------------------

constexpr const char* kRawAcquire = R"lua(
local v = redis.call('GET', KEYS[1])
if v then return v end
local t = redis.call('TIME')
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return tonumber(t[1])
)lua";

constexpr const char* kRawComplete = R"lua(
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
)lua";

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "redis_bench: %s\n", what.c_str());
  std::abort();
}

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using RawReply = std::unique_ptr<redisReply, ReplyFree>;

class RawConn {
 public:
  RawConn() : c_(redisConnect(g_host.c_str(), g_port)) {
    if (c_ == nullptr || c_->err != 0) die("cannot connect");
    acquire_ = text(command({"SCRIPT", "LOAD", kRawAcquire}));
    complete_ = text(command({"SCRIPT", "LOAD", kRawComplete}));
  }
  ~RawConn() { redisFree(c_); }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  void append(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(c_, static_cast<int>(args.size()), argv.data(), lens.data()) !=
        REDIS_OK) {
      die("append failed");
    }
  }
  RawReply reply() {
    void* r = nullptr;
    if (redisGetReply(c_, &r) != REDIS_OK) die(std::string("reply failed: ") + c_->errstr);
    RawReply out(static_cast<redisReply*>(r));
    if (out->type == REDIS_REPLY_ERROR) die(std::string(out->str, out->len));
    return out;
  }
  RawReply command(const std::vector<std::string>& args) {
    append(args);
    return reply();
  }
  static std::string text(const RawReply& r) { return std::string(r->str, r->len); }

  // The fresh run's two steps, appended (send with reply()).
  void append_acquire(const std::string& key, const std::string& lease) {
    append({"EVALSHA", acquire_, "1", key, lease, "30000"});
  }
  void append_complete(const std::string& key, const std::string& lease) {
    append({"EVALSHA", complete_, "1", key, lease, kPayload, std::to_string(kTtlMs)});
  }

 private:
  redisContext* c_;
  std::string acquire_;
  std::string complete_;
};

// --- the server's own accounting -----------------------------------------------------------

struct ServerCost {
  double cpu_s = 0;
  double script_us = 0;
  double get_us = 0;
};

ServerCost server_cost(RawConn& c) {
  ServerCost cost;
  std::istringstream info(RawConn::text(c.command({"INFO", "all"})));
  std::string line;
  auto field = [](const std::string& l, const std::string& name) {
    const std::size_t at = l.find(name + "=");
    return at == std::string::npos ? 0.0 : std::atof(l.c_str() + at + name.size() + 1);
  };
  while (std::getline(info, line)) {
    if (line.rfind("used_cpu_user:", 0) == 0 || line.rfind("used_cpu_sys:", 0) == 0) {
      cost.cpu_s += std::atof(line.c_str() + line.find(':') + 1);
    } else if (line.rfind("cmdstat_evalsha:", 0) == 0 || line.rfind("cmdstat_eval:", 0) == 0) {
      cost.script_us += field(line, "usec");
    } else if (line.rfind("cmdstat_get:", 0) == 0) {
      cost.get_us += field(line, "usec");
    }
  }
  return cost;
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Measures the server's cost, and this process's CPU (cli_cpu_us: every thread, the
// store's I/O loops included), between construction and report(); one per benchmark run,
// made and reported by thread 0 outside the timed loop.
class ServerMeter {
 public:
  ServerMeter() : before_(server_cost(conn_)), cpu_before_(process_cpu_seconds()) {}
  void report(benchmark::State& state, double ops) {
    const double cpu = process_cpu_seconds() - cpu_before_;
    const ServerCost after = server_cost(conn_);
    ops = ops > 0 ? ops : 1;
    state.counters["cli_cpu_us"] = cpu * 1e6 / ops;
    state.counters["srv_cpu_us"] = (after.cpu_s - before_.cpu_s) * 1e6 / ops;
    state.counters["srv_script_us"] = (after.script_us - before_.script_us) / ops;
    state.counters["srv_get_us"] = (after.get_us - before_.get_us) / ops;
  }

 private:
  RawConn conn_;
  ServerCost before_;
  double cpu_before_;
};

// Keys unique to the run, the benchmark and the thread.
class Keys {
 public:
  Keys(const std::string& name, int thread)
      : prefix_(g_prefix + name + ":t" + std::to_string(thread) + ":" +
                std::to_string(runs_.fetch_add(1)) + ":") {}
  Keys(const std::string& name, const benchmark::State& state) : Keys(name, state.thread_index()) {}
  std::string next() { return prefix_ + std::to_string(n_++); }

 private:
  static inline std::atomic<long> runs_{0};
  std::string prefix_;
  long n_ = 0;
};

std::string raw_replay_key(int i) { return g_prefix + "raw-replay:" + std::to_string(i); }

void populate_raw_replays(RawConn& c) {
  for (int i = 0; i < g_replay_keys; ++i) {
    c.command({"SET", raw_replay_key(i), kPayload, "PX", std::to_string(kTtlMs)});
  }
}

// `depth` fresh runs on new keys: the acquires in one write, then the completes in another.
// Returns depth.
int raw_fresh(RawConn& c, Keys& keys, int depth) {
  static const std::string lease = "lease-0123456789";
  std::vector<std::string> batch(static_cast<std::size_t>(depth));
  for (auto& k : batch) k = keys.next();
  for (const auto& k : batch) c.append_acquire(k, lease);
  for (int i = 0; i < depth; ++i) {
    if (c.reply()->type != REDIS_REPLY_INTEGER) die("raw acquire found the key");
  }
  for (const auto& k : batch) c.append_complete(k, lease);
  for (int i = 0; i < depth; ++i) {
    if (c.reply()->integer != 1) die("raw complete was fenced");
  }
  return depth;
}

// `depth` replays of completed keys in one write. Returns depth.
int raw_replay(RawConn& c, long& next, int depth) {
  for (int i = 0; i < depth; ++i) {
    c.append_acquire(raw_replay_key(static_cast<int>(next++ % g_replay_keys)), "x");
  }
  for (int i = 0; i < depth; ++i) {
    if (c.reply()->type != REDIS_REPLY_STRING) die("raw replay found no result");
  }
  return depth;
}

void BM_RawFresh(benchmark::State& state) {
  const int depth = static_cast<int>(state.range(0));
  RawConn c;
  ServerMeter meter;
  Keys keys("raw-fresh", state);
  for (auto _ : state) raw_fresh(c, keys, depth);
  const double ops = static_cast<double>(state.iterations()) * depth;
  state.SetItemsProcessed(static_cast<std::int64_t>(ops));
  meter.report(state, ops);
}

void BM_RawReplay(benchmark::State& state) {
  const int depth = static_cast<int>(state.range(0));
  RawConn c;
  populate_raw_replays(c);
  ServerMeter meter;
  long next = 0;
  for (auto _ : state) raw_replay(c, next, depth);
  const double ops = static_cast<double>(state.iterations()) * depth;
  state.SetItemsProcessed(static_cast<std::int64_t>(ops));
  meter.report(state, ops);
}

// --- idem --------------------------------------------------------------------------------------

std::shared_ptr<idem::RedisStore> g_store;
std::unique_ptr<idem::Executor> g_executor;
std::unique_ptr<ServerMeter> g_meter;
std::string g_scope;
std::uint64_t g_commands_before = 0;
std::uint64_t g_trips_before = 0;

// Replay orders by benchmark argument: 0 script, 1 get.
idem::RedisStoreOptions store_options(std::int64_t path, std::int64_t connections) {
  constexpr idem::RedisReplayPath kPaths[] = {idem::RedisReplayPath::kScript,
                                              idem::RedisReplayPath::kGet};
  idem::RedisStoreOptions o;
  o.host = g_host;
  o.port = g_port;
  o.prefix = g_prefix;
  o.replay = kPaths[path];
  o.connections = static_cast<std::size_t>(connections);
  return o;
}

std::string idem_replay_key(long i) { return "replay-" + std::to_string(i % g_replay_keys); }

void populate_idem_replays(idem::Executor& executor, const std::string& scope) {
  for (int i = 0; i < g_replay_keys; ++i) {
    (void)executor.run(scope, idem_replay_key(i), [](const idem::Attempt&) { return kPayload; });
  }
}

void set_up(const benchmark::State& state, bool replays) {
  if (state.thread_index() != 0) return;
  static std::atomic<int> runs{0};
  g_scope = "bench-" + std::to_string(runs.fetch_add(1));
  g_store = std::make_shared<idem::RedisStore>(store_options(state.range(0), state.range(1)));
  g_executor = std::make_unique<idem::Executor>(
      g_store, idem::ExecutorOptions{.ttl = idem::Duration{kTtlMs}});
  if (replays) populate_idem_replays(*g_executor, g_scope);
  g_meter = std::make_unique<ServerMeter>();
  g_commands_before = g_store->stats().commands;
  g_trips_before = g_store->stats().round_trips;
}

void tear_down(benchmark::State& state) {
  if (state.thread_index() != 0) return;
  // All threads have left the loop (it ends with a barrier), so the count is complete.
  const double ops = static_cast<double>(state.iterations()) * state.threads();
  g_meter->report(state, ops);
  const idem::RedisStats s = g_store->stats();
  const double commands = static_cast<double>(s.commands - g_commands_before);
  const double trips = static_cast<double>(s.round_trips - g_trips_before);
  state.counters["cmds_per_trip"] = commands / (trips > 0 ? trips : 1);
  state.counters["cmds_per_op"] = commands / ops;
  g_meter.reset();
  g_executor.reset();
  g_store.reset();
}

void BM_IdemFresh(benchmark::State& state) {
  set_up(state, false);
  Keys keys("idem-fresh", state);
  for (auto _ : state) {
    auto r = g_executor->run(g_scope, keys.next(), [](const idem::Attempt&) { return kPayload; });
    if (r.replayed) die("a fresh key replayed");
  }
  state.SetItemsProcessed(state.iterations());
  tear_down(state);
}

void BM_IdemReplay(benchmark::State& state) {
  set_up(state, true);
  long next = state.thread_index() * 31;
  for (auto _ : state) {
    auto r = g_executor->run(g_scope, idem_replay_key(next++),
                             [](const idem::Attempt&) -> std::string { die("replay ran"); });
    benchmark::DoNotOptimize(r.value.data());
  }
  state.SetItemsProcessed(state.iterations());
  tear_down(state);
}

// Args: {replay path (0: script, 1: get), connections}.
void idem_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"path", "conns"});
  for (int path : {0, 1}) b->Args({path, 2});
  b->Threads(1)->Threads(32)->UseRealTime();
}

BENCHMARK(BM_RawFresh)->ArgName("depth")->Arg(1)->Arg(kDepth)->UseRealTime();
BENCHMARK(BM_RawReplay)->ArgName("depth")->Arg(1)->Arg(kDepth)->UseRealTime();
BENCHMARK(BM_IdemFresh)->Apply(idem_args);
BENCHMARK(BM_IdemReplay)->Apply(idem_args);
// The number of connections at 32 callers.
BENCHMARK(BM_IdemFresh)
    ->ArgNames({"path", "conns"})
    ->Args({0, 1})
    ->Args({0, 4})
    ->Threads(32)
    ->UseRealTime();
BENCHMARK(BM_IdemReplay)
    ->ArgNames({"path", "conns"})
    ->Args({0, 1})
    ->Args({0, 4})
    ->Threads(32)
    ->UseRealTime();

// --- raw and idem taking turns ---

// The machine these figures come from is shared and its load moves by a factor of two
// within a minute, so the ratios that the targets are about come from raw and idem taking
// turns in 250 ms slices (taking_turns.h; IDEM_BENCH_SLICES each, default 4): both sides see
// the same machine. Arguments: fresh (1) or replay (0); 1 caller, against raw scripts one at
// a time (0), or 32 callers, against raw scripts pipelined 16 deep over one connection (1);
// the replay order (0 script, 1 get).
void BM_TakingTurns(benchmark::State& state) {
  const bool fresh = state.range(0) == 1;
  const bool concurrent = state.range(1) == 1;
  const int depth = concurrent ? kDepth : 1;
  const int callers = concurrent ? 32 : 1;
  const char* slices_env = std::getenv("IDEM_BENCH_SLICES");
  const int slices = slices_env != nullptr ? std::atoi(slices_env) : 4;

  RawConn raw;
  populate_raw_replays(raw);
  Keys raw_keys("turns-raw", 0);
  long raw_next = 0;
  auto raw_op = [&](int, long) {
    return fresh ? raw_fresh(raw, raw_keys, depth) : raw_replay(raw, raw_next, depth);
  };

  auto store = std::make_shared<idem::RedisStore>(store_options(state.range(2), 2));
  idem::Executor executor(store, idem::ExecutorOptions{.ttl = idem::Duration{kTtlMs}});
  static std::atomic<int> runs{0};
  const std::string scope = "turns-" + std::to_string(runs.fetch_add(1));
  if (!fresh) populate_idem_replays(executor, scope);
  std::vector<std::unique_ptr<Keys>> keys;
  for (int t = 0; t < callers; ++t) keys.push_back(std::make_unique<Keys>("turns-idem", t));
  auto idem_op = [&](int t, long i) {
    if (fresh) {
      auto r = executor.run(scope, keys[static_cast<std::size_t>(t)]->next(),
                            [](const idem::Attempt&) { return kPayload; });
      if (r.replayed) die("a fresh key replayed");
    } else {
      auto r = executor.run(scope, idem_replay_key(t * 31 + i),
                            [](const idem::Attempt&) -> std::string { die("replay ran"); });
      benchmark::DoNotOptimize(r.value.data());
    }
  };

  // Not counted: connections warmed up, scripts cached, the hot set read once.
  idem::bench::slice(1, raw_op);
  idem::bench::slice(callers, idem_op);
  double raw_rate = 0, idem_rate = 0;
  for (auto _ : state) {
    std::tie(raw_rate, idem_rate) = idem::bench::taking_turns(slices, 1, raw_op, callers, idem_op);
  }
  state.counters["raw_per_s"] = raw_rate;
  state.counters["idem_per_s"] = idem_rate;
  state.counters["ratio"] = idem_rate / raw_rate;
}

BENCHMARK(BM_TakingTurns)
    ->ArgNames({"fresh", "callers32", "path"})
    ->ArgsProduct({{1, 0}, {0, 1}, {0, 1}})
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kSecond);

// --- what publishing costs --------------------------------------------------------------------

// SPEC §7: fresh runs (acquire, then complete with its SPUBLISH) on a store that publishes
// (notify=on, the default) and on one that does not (notify=off), taking turns in 250 ms
// slices like BM_TakingTurns. Nobody subscribes, the common case: the publish is paid by
// every complete whether or not anyone waits. Argument: callers (1 or 32).
void BM_PublishCost(benchmark::State& state) {
  const int callers = static_cast<int>(state.range(0));
  const char* slices_env = std::getenv("IDEM_BENCH_SLICES");
  const int slices = slices_env != nullptr ? std::atoi(slices_env) : 4;
  static std::atomic<int> runs{0};
  const std::string scope = "publish-" + std::to_string(runs.fetch_add(1));
  struct Side {
    std::shared_ptr<idem::RedisStore> store;
    std::unique_ptr<idem::Executor> executor;
    std::vector<std::unique_ptr<Keys>> keys;
  };
  auto make = [&](bool notify, const char* name) {
    idem::RedisStoreOptions o = store_options(0, 2);
    o.notify = notify;
    Side side;
    side.store = std::make_shared<idem::RedisStore>(o);
    if (side.store->stats().notify != notify) die("the store's notify is not as asked");
    side.executor = std::make_unique<idem::Executor>(
        side.store, idem::ExecutorOptions{.ttl = idem::Duration{kTtlMs}});
    for (int t = 0; t < callers; ++t) side.keys.push_back(std::make_unique<Keys>(name, t));
    return side;
  };
  Side on = make(true, "publish-on");
  Side off = make(false, "publish-off");
  auto op_of = [&](Side& side) {
    return [&side, &scope](int t, long) {
      auto r = side.executor->run(scope, side.keys[static_cast<std::size_t>(t)]->next(),
                                  [](const idem::Attempt&) { return kPayload; });
      if (r.replayed) die("a fresh key replayed");
    };
  };
  const auto on_op = op_of(on);
  const auto off_op = op_of(off);
  idem::bench::slice(callers, on_op);  // not counted: connections and scripts warmed up
  idem::bench::slice(callers, off_op);
  double off_rate = 0, on_rate = 0;
  for (auto _ : state) {
    std::tie(off_rate, on_rate) =
        idem::bench::taking_turns(slices, callers, off_op, callers, on_op);
  }
  state.counters["on_per_s"] = on_rate;
  state.counters["off_per_s"] = off_rate;
  state.counters["ratio"] = on_rate / off_rate;
}

BENCHMARK(BM_PublishCost)
    ->ArgName("callers")
    ->Arg(1)
    ->Arg(32)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kSecond);

// --- the batched heartbeat -------------------------------------------------------------------

void BM_Heartbeat(benchmark::State& state) {
  int leases = 10000;
  long lease_ms = 3000;
  long hold_s = 30;
  if (const char* spec = std::getenv("IDEM_BENCH_HEARTBEAT")) {
    if (std::sscanf(spec, "%d,%ld,%ld", &leases, &lease_ms, &hold_s) != 3) {
      die("IDEM_BENCH_HEARTBEAT must be leases,lease_ms,hold_s");
    }
  }
  const idem::Duration lease{lease_ms};
  idem::RedisStoreOptions o;
  o.host = g_host;
  o.port = g_port;
  o.prefix = g_prefix + "heartbeat:";
  auto store = std::make_shared<idem::RedisStore>(o);
  std::atomic<int> errors{0};
  idem::detail::Heartbeat heartbeat(*store, [&](const std::exception&) { ++errors; });
  std::vector<std::shared_ptr<idem::detail::HeartbeatLease>> held;
  // Acquired from 32 threads, so setting up 10 000 leases takes well under one lease.
  std::vector<std::vector<std::shared_ptr<idem::detail::HeartbeatLease>>> parts(32);
  std::vector<std::thread> starters;
  for (int t = 0; t < 32; ++t) {
    starters.emplace_back([&, t] {
      for (int i = t; i < leases; i += 32) {
        const std::string key = "lease-" + std::to_string(i);
        const auto sent = idem::detail::SteadyClock::now();
        auto a = std::get<idem::Acquired>(store->acquire("hb", key, lease, 1h));
        auto l = std::make_shared<idem::detail::HeartbeatLease>(
            "hb", key, a.lease.token, lease, lease / 3, sent + a.lease.lease_remaining,
            a.lease.lease_expires_at);
        heartbeat.add(l);
        parts[t].push_back(std::move(l));
      }
    });
  }
  for (auto& t : starters) t.join();
  for (auto& p : parts) held.insert(held.end(), p.begin(), p.end());
  ServerMeter meter;
  const idem::RedisStats before = store->stats();
  double cpu = 0;
  double wall = 0;
  for (auto _ : state) {
    const double cpu0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(hold_s));
    wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cpu += process_cpu_seconds() - cpu0;
  }
  const idem::RedisStats after = store->stats();
  std::uint64_t extends = 0;
  int lost = 0;
  for (const auto& l : held) {
    extends += l->extends();
    lost += l->lost() ? 1 : 0;
  }
  // The server agrees: every lease is still held, by its token (checked while the heartbeat
  // still runs, since reading 10 000 records one by one takes a while).
  int held_by_server = 0;
  for (const auto& l : held) {
    const std::optional<idem::Record> r = store->get("hb", l->key());
    held_by_server += r && r->state == idem::RecordState::kInProgress && r->token == l->token() &&
                      r->lease_expires_at > r->now;
  }
  for (const auto& l : held) heartbeat.remove(*l);
  const double trips = static_cast<double>(after.round_trips - before.round_trips);
  meter.report(state, static_cast<double>(extends));
  state.counters["leases"] = leases;
  state.counters["lost"] = lost;
  state.counters["held_by_server"] = held_by_server;
  state.counters["errors"] = errors.load();
  state.counters["extends_per_s"] = static_cast<double>(extends) / wall;
  state.counters["extends_per_trip"] = static_cast<double>(extends) / (trips > 0 ? trips : 1);
  state.counters["cpu_us_per_extend"] = cpu * 1e6 / static_cast<double>(extends ? extends : 1);
  if (lost > 0 || held_by_server != leases) {
    std::fprintf(stderr, "redis_bench: %d of %d leases lost, %d held by the server, %d errors\n",
                 lost, leases, held_by_server, errors.load());
    state.SkipWithError("leases were lost");
  }
}

BENCHMARK(BM_Heartbeat)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

}  // namespace

int main(int argc, char** argv) {
  const char* url = std::getenv("IDEM_TEST_REDIS_URL");
  if (url == nullptr || *url == '\0') {
    const char* required = std::getenv("IDEM_REQUIRE_SERVERS");
    if (required != nullptr && std::string(required) == "1") {
      std::fprintf(stderr,
                   "redis_bench: IDEM_REQUIRE_SERVERS=1 but IDEM_TEST_REDIS_URL is not set\n");
      return 1;
    }
    std::fprintf(stderr, "redis_bench: IDEM_TEST_REDIS_URL is not set; skipped\n");
    return 77;
  }
  if (const char* n = std::getenv("IDEM_BENCH_REPLAY_KEYS"))
    g_replay_keys = std::max(1, std::atoi(n));
  const idem::Url parsed = idem::parse_url(url);
  g_host = parsed.host.empty() ? "127.0.0.1" : parsed.host;
  g_port = parsed.port != 0 ? parsed.port : 6379;
  g_prefix = "idem-bench:" + std::to_string(::getpid()) + ":" +
             std::to_string(std::chrono::system_clock::now().time_since_epoch().count()) + ":";
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
