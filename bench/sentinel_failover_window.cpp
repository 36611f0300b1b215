// Issue 36: what a forced Sentinel failover does to runs in flight, with and without
// wait_replicas=1 (docs/stores/redis.md, "What a failover can lose").
//
//   sentinel_failover_window [ROUNDS] [AFTER_MS]   (defaults: 3 rounds, 20000 ms)
//
// Each round, for each of three modes (wait_replicas=0; wait_replicas=1; wait_replicas=0
// with min-replicas-to-write 1 and min-replicas-max-lag 1 on both servers), on servers of
// its own (a primary, a replica of it and one sentinel, on free loopback ports, killed at
// the end): two store instances (two RedisStore objects behind the same sentinel, each with
// its own Executor, like two application processes) run the same fresh keys in pairs of
// threads, four pairs, in lockstep: both instances call Executor::run on key n at once, so
// one runs the action (20 ms) and the other replays it (lease 2 s, duplicates wait up to
// 5 s; after a StoreUnavailable a thread pauses 10 ms). After 1 s of that the sentinel is
// told SENTINEL FAILOVER; the runs go on until AFTER_MS after the sentinel names the replica
// as the primary, then stop. The sentinel makes the old primary a replica of the new one
// some 15 s after that: with a shorter AFTER_MS, the calls that need a replica in sync on
// the new primary are not seen failing until then. A last store reads every key back from
// the new primary. Counted per key:
//
//   ran twice   the action ran more than once; "untold" when no caller of that key was
//               told "may or may not have been recorded" (StoreUnavailable) before the
//               second run started: SPEC §1's promise broken
//   two owners  two runs of the key overlapped in time (a second owner while the first ran)
//   lost        a caller was handed the key's result (fresh, or replayed), and later the key
//               ran again or its record is gone at the end
//
// and, for the keys in any of these, when their first run started, in ms from the moment
// SENTINEL FAILOVER was sent: the window. Bounded: a round gives up (exit 1) when the
// servers do not come up or the failover does not end within 30 s. Exit 77 without
// redis-server.

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.h"
#include "idem/executor.h"
#include "idem/open_store.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kPairs = 4;
constexpr auto kAction = 20ms;
constexpr auto kBound = 30s;

int unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// One command on a short-lived connection: the reply as text (status, string, error, or an
// integer as text; an array as its elements joined by spaces), empty when it failed.
std::string command(int port, const std::vector<std::string>& args) {
  std::unique_ptr<redisContext, void (*)(redisContext*)> c(redisConnect("127.0.0.1", port),
                                                           redisFree);
  if (!c || c->err != 0) return {};
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  std::unique_ptr<redisReply, void (*)(void*)> r(
      static_cast<redisReply*>(
          redisCommandArgv(c.get(), static_cast<int>(args.size()), argv.data(), lens.data())),
      freeReplyObject);
  if (!r) return {};
  auto text = [](const redisReply* e) {
    if (e->type == REDIS_REPLY_INTEGER) return std::to_string(e->integer);
    return e->str == nullptr ? std::string() : std::string(e->str, e->len);
  };
  if (r->type != REDIS_REPLY_ARRAY) return text(r.get());
  std::string out;
  for (std::size_t i = 0; i < r->elements; ++i) {
    if (i > 0) out += ' ';
    out += text(r->element[i]);
  }
  return out;
}

bool wait_until(const auto& done) {
  const auto give_up = Clock::now() + kBound;
  while (!done()) {
    if (Clock::now() > give_up) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// A redis-server of its own (a sentinel with `config`), killed by the destructor, and when
// this process dies.
class Server {
 public:
  Server(std::vector<std::string> args, const std::string& config = {}) {
    std::string pattern = (std::filesystem::temp_directory_path() / "idem-window-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) return;
    dir_ = pattern;
    port_ = unused_port();
    std::vector<std::string> full = {"redis-server"};
    if (!config.empty()) {
      full.push_back(dir_ + "/redis.conf");
      std::ofstream(full.back()) << config;
    }
    for (const std::string& a :
         {std::string("--bind"), std::string("127.0.0.1"), std::string("--port"),
          std::to_string(port_), std::string("--save"), std::string(""),
          std::string("--appendonly"), std::string("no"), std::string("--dir"), dir_,
          std::string("--logfile"), dir_ + "/redis.log"}) {
      full.push_back(a);
    }
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : full) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::execvp("redis-server", argv.data());
      ::_exit(127);
    }
    if (!wait_until([&] { return command(port_, {"PING"}) == "PONG"; })) stop();
  }
  ~Server() {
    stop();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  bool ok() const { return pid_ > 0; }
  int port() const { return port_; }

 private:
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

struct Run {
  Clock::time_point start, end;
};

struct KeyLog {
  std::vector<Run> runs;
  std::optional<Clock::time_point> handed;  // first time a caller got its result
  std::optional<Clock::time_point> told;    // first "may or may not have been recorded"
};

struct Figures {
  int keys = 0;
  int told = 0;         // calls told "may or may not have been recorded"
  int unavailable = 0;  // other StoreUnavailable (nothing ran)
  int other = 0;        // any other exception
  std::string first_other;
  int ran_twice = 0;
  int ran_twice_untold = 0;
  int two_owners = 0;
  int lost = 0;
  long long first_ms = 0, last_ms = 0;  // the window, from SENTINEL FAILOVER
  long long overlap_gap_ms = -1;        // the smallest gap between two overlapping owners
  long long switch_ms = 0;              // SENTINEL FAILOVER to the sentinel naming the replica
  long long demoted_ms = -1;            // ... to the old primary in sync as its replica
};

struct Mode {
  const char* name;
  int wait_replicas;
  bool min_replicas;  // min-replicas-to-write 1, min-replicas-max-lag 1 on both servers
};
constexpr Mode kModes[] = {{"wait_replicas=0", 0, false},
                           {"wait_replicas=1", 1, false},
                           {"wait_replicas=0, min-replicas-to-write 1", 0, true}};

// One failover under load; nullopt when the servers or the failover failed.
std::optional<Figures> round_of(const Mode& mode, std::chrono::milliseconds after) {
  std::vector<std::string> args;
  if (mode.min_replicas) {
    args = {"--min-replicas-to-write", "1", "--min-replicas-max-lag", "1"};
  }
  Server primary(args);
  args.insert(args.end(), {"--replicaof", "127.0.0.1", std::to_string(primary.port())});
  Server replica(args);
  if (!primary.ok() || !replica.ok()) {
    std::fputs("the primary or the replica did not start\n", stderr);
    return std::nullopt;
  }
  const std::string service = "window";
  Server sentinel({"--sentinel"}, "sentinel monitor " + service + " 127.0.0.1 " +
                                      std::to_string(primary.port()) +
                                      " 1\nsentinel down-after-milliseconds " + service +
                                      " 60000\nsentinel failover-timeout " + service + " 5000\n");
  if (!sentinel.ok()) {
    std::fputs("the sentinel did not start\n", stderr);
    return std::nullopt;
  }
  // The sentinel knows the replica, and the replica is in sync.
  if (!wait_until([&] {
        return command(sentinel.port(), {"INFO", "sentinel"}).find("slaves=1") !=
                   std::string::npos &&
               command(primary.port(), {"INFO", "replication"}).find("state=online") !=
                   std::string::npos;
      })) {
    std::fputs("the sentinel never saw the replica in sync\n", stderr);
    return std::nullopt;
  }
  const std::string url =
      "redis+sentinel://127.0.0.1:" + std::to_string(sentinel.port()) + "/" + service +
      "?prefix=window:&timeout=2000&wait_replicas=" + std::to_string(mode.wait_replicas) +
      "&wait_timeout=500";
  std::mutex mu;
  std::map<std::string, KeyLog> log;
  Figures f;
  std::atomic<bool> stop{false};
  {
    std::vector<std::unique_ptr<idem::Executor>> instances;
    for (int i = 0; i < 2; ++i) {
      instances.push_back(std::make_unique<idem::Executor>(
          idem::open_store(url),
          idem::ExecutorOptions{.lease = 2s, .wait = idem::WaitPolicy{.max_wait = 5s}}));
    }
    std::vector<std::unique_ptr<std::barrier<>>> barriers;
    for (int p = 0; p < kPairs; ++p) barriers.push_back(std::make_unique<std::barrier<>>(2));
    std::vector<std::thread> threads;
    for (int p = 0; p < kPairs; ++p) {
      for (int i = 0; i < 2; ++i) {
        threads.emplace_back([&, p, i] {
          idem::Executor& executor = *instances[i];
          for (int n = 0;; ++n) {
            barriers[p]->arrive_and_wait();
            // Both threads of the pair see the same flag: one stops, both stop.
            const bool done = stop.load();
            barriers[p]->arrive_and_wait();
            if (done) return;
            const std::string key = std::to_string(p) + ":" + std::to_string(n);
            try {
              const auto r = executor.run("s", key, [&](const idem::Attempt&) {
                Run run{Clock::now(), {}};
                std::this_thread::sleep_for(kAction);
                run.end = Clock::now();
                std::lock_guard lock(mu);
                log[key].runs.push_back(run);
                return key;
              });
              std::lock_guard lock(mu);
              KeyLog& k = log[key];
              if (!k.handed) k.handed = Clock::now();
            } catch (const idem::StoreUnavailable& e) {
              {
                std::lock_guard lock(mu);
                if (std::string(e.what()).find("may or may not") != std::string::npos) {
                  ++f.told;
                  KeyLog& k = log[key];
                  if (!k.told) k.told = Clock::now();
                } else {
                  ++f.unavailable;
                }
              }
              // A client that retries does not retry at once.
              std::this_thread::sleep_for(10ms);
            } catch (const std::exception& e) {
              std::lock_guard lock(mu);
              if (f.other++ == 0) f.first_other = e.what();
            }
          }
        });
      }
    }
    std::this_thread::sleep_for(1s);
    const auto failover_at = Clock::now();
    auto since_failover = [&] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - failover_at)
          .count();
    };
    // Switched: the sentinel names the replica. Demoted: the old primary is a replica of
    // it, in sync (only then does a new primary with one replica count one for WAIT and
    // min-replicas-to-write); seen only when it happens within AFTER_MS of the switch.
    const std::string new_primary = "127.0.0.1 " + std::to_string(replica.port());
    const bool switched =
        command(sentinel.port(), {"SENTINEL", "FAILOVER", service}) == "OK" && wait_until([&] {
          return command(sentinel.port(), {"SENTINEL", "get-master-addr-by-name", service}) ==
                 new_primary;
        });
    f.switch_ms = since_failover();
    const auto end = Clock::now() + after;
    while (switched && Clock::now() < end) {
      if (f.demoted_ms < 0 && command(primary.port(), {"ROLE"}).rfind("slave", 0) == 0 &&
          command(primary.port(), {"INFO", "replication"}).find("master_link_status:up") !=
              std::string::npos) {
        f.demoted_ms = since_failover();
      }
      std::this_thread::sleep_for(10ms);
    }
    stop = true;
    for (auto& t : threads) t.join();
    if (!switched) return std::nullopt;
    // The window, relative to the failover.
    f.first_ms = std::numeric_limits<long long>::max();
    f.last_ms = std::numeric_limits<long long>::min();
    auto check = idem::open_store(url);
    for (auto& [key, k] : log) {
      ++f.keys;
      std::sort(k.runs.begin(), k.runs.end(),
                [](const Run& a, const Run& b) { return a.start < b.start; });
      bool bad = false;
      if (k.runs.size() > 1) {
        ++f.ran_twice;
        bad = true;
        if (!k.told || *k.told > k.runs[1].start) ++f.ran_twice_untold;
        for (std::size_t i = 1; i < k.runs.size(); ++i) {
          if (k.runs[i].start < k.runs[i - 1].end) {
            ++f.two_owners;
            const long long gap = std::chrono::duration_cast<std::chrono::milliseconds>(
                                      k.runs[i].start - k.runs[i - 1].start)
                                      .count();
            if (f.overlap_gap_ms < 0 || gap < f.overlap_gap_ms) f.overlap_gap_ms = gap;
            break;
          }
        }
      }
      if (k.handed) {
        const bool ran_after = std::any_of(k.runs.begin(), k.runs.end(),
                                           [&](const Run& r) { return r.start > *k.handed; });
        const std::optional<idem::Record> rec = check->get("s", key);
        if (ran_after || !rec || rec->state != idem::RecordState::kComplete) {
          ++f.lost;
          bad = true;
        }
      }
      if (bad && !k.runs.empty()) {
        const long long at = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 k.runs.front().start - failover_at)
                                 .count();
        f.first_ms = std::min(f.first_ms, at);
        f.last_ms = std::max(f.last_ms, at);
      }
    }
    if (f.first_ms > f.last_ms) f.first_ms = f.last_ms = 0;
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  const std::chrono::milliseconds after{argc > 2 ? std::atoi(argv[2]) : 20000};
  if (std::system("command -v redis-server >/dev/null 2>&1") != 0) {
    std::puts("redis-server is not installed: skipped");
    return 77;
  }
  constexpr std::size_t kModeCount = std::size(kModes);
  std::printf("%-5s %-4s %6s %5s %6s %6s %7s %8s %5s %12s %9s %10s\n", "round", "mode", "keys",
              "told", "unavl", "twice", "untold", "2owners", "lost", "window_ms", "switch_ms",
              "demoted_ms");
  Figures total[kModeCount];
  for (int round = 1; round <= rounds; ++round) {
    for (std::size_t m = 0; m < kModeCount; ++m) {
      const std::optional<Figures> f = round_of(kModes[m], after);
      if (!f) {
        std::fprintf(stderr, "round %d, %s: the servers or the failover failed\n", round,
                     kModes[m].name);
        return 1;
      }
      std::printf("%-5d %-4zu %6d %5d %6d %6d %7d %8d %5d %5lld..%-5lld %9lld %10s\n", round, m,
                  f->keys, f->told, f->unavailable, f->ran_twice, f->ran_twice_untold,
                  f->two_owners, f->lost, f->first_ms, f->last_ms, f->switch_ms,
                  f->demoted_ms < 0 ? "-" : std::to_string(f->demoted_ms).c_str());
      if (f->overlap_gap_ms >= 0) {
        std::printf("      two owners: the closest started %lld ms apart\n", f->overlap_gap_ms);
      }
      if (f->other > 0) {
        std::printf("      %d calls failed with another error, the first: %s\n", f->other,
                    f->first_other.c_str());
      }
      Figures& t = total[m];
      t.keys += f->keys;
      t.told += f->told;
      t.unavailable += f->unavailable;
      t.ran_twice += f->ran_twice;
      t.ran_twice_untold += f->ran_twice_untold;
      t.two_owners += f->two_owners;
      t.lost += f->lost;
      std::fflush(stdout);
    }
  }
  for (std::size_t m = 0; m < kModeCount; ++m) {
    const Figures& t = total[m];
    std::printf("total %-4zu %6d %5d %6d %6d %7d %8d %5d   mode %zu: %s\n", m, t.keys, t.told,
                t.unavailable, t.ran_twice, t.ran_twice_untold, t.two_owners, t.lost, m,
                kModes[m].name);
  }
  return 0;
}
