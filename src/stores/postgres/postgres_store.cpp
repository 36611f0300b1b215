#include "idem/stores/postgres_store.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/record_id.h"
#include "core/record_watchers.h"
#include "idem/error.h"
#include "stores/postgres/postgres_batcher.h"
#include "stores/postgres/postgres_connection.h"
#include "stores/postgres/postgres_listener.h"
#include "stores/postgres/postgres_operations.h"
#include "stores/postgres/postgres_pool.h"
#include "stores/postgres/postgres_schema.h"
#include "stores/postgres/postgres_server.h"
#include "stores/postgres/postgres_url.h"

namespace idem {
namespace {

using postgres::AcquireBatcher;
using postgres::AcquireRequest;
using postgres::Col;
using postgres::CompleteBatcher;
using postgres::CompleteRequest;
using postgres::Connection;
using postgres::Deadline;
using postgres::describe_of;
using postgres::Fnv1a;
using postgres::id_of;
using postgres::live_answer;
using postgres::param_value;
using postgres::Params;
using postgres::parse_conninfo;
using postgres::parse_table;
using postgres::PgError;
using postgres::Pool;
using postgres::Pooler;
using postgres::ReadBatcher;
using postgres::ReadRequest;
using postgres::record_id;
using postgres::Result;
using postgres::Row;
using postgres::row_of;
using postgres::SessionUse;
using postgres::set_param;
using postgres::Statement;
using postgres::Statements;
using postgres::SteadyClock;
using postgres::TableNames;
using postgres::valid_identifier;

// Requests per batched statement, and the largest payload a batched complete carries (a
// larger one runs alone, so a batch's arrays stay small).
constexpr std::size_t kMaxBatch = 64;
constexpr std::size_t kMaxBatchedPayload = 64 * 1024;
// Batches of one kind running at once. On the 2-core machine of docs/stores/postgres.md, 1
// made the largest batches (best with synchronous_commit = off) and 4 overlapped the most
// commits (best with it on); 2 is between.
constexpr std::size_t kMaxBatchesInFlight = 2;
// A read queued this long behind a running read batch starts one beside it, balanced or not:
// a healthy read batch takes well under a millisecond on a loopback server and a few under
// load, and one stalled on a dead connection holds the others up no longer than this.
constexpr std::chrono::milliseconds kReadOverlapAfter{10};

// Records deleted per purge statement: each batch is one short transaction.
constexpr std::size_t kPurgeBatch = 1000;
// An empty acquire result means another caller wrote a live record in between; each retry
// follows progress by somebody else, so a long run of them means something is wrong.
constexpr int kMaxAcquireRounds = 64;
// How many caller sessions a store remembers as checked to be on its database (SPEC §14);
// past that the oldest is asked again on its next call.
constexpr std::size_t kRememberedSessions = 256;
// A deadlock or serialization failure was rolled back and is retried this many times.
constexpr int kMaxConflictRetries = 3;
// The advisory lock the store takes when it opens, to see that the server's advisory locks
// are real (they show in pg_locks); 0x6964656d is "idem".
constexpr std::int64_t kProbeLock = 0x6964656d;
// The adaptive acquire's score: +3 for a key found absent (reading first wasted a round
// trip), -1 for one found live (writing first cost a heavier statement), kept in bounds so
// the store follows a change of workload within a few dozen calls.
constexpr int kScoreAbsent = 3;
constexpr int kScoreLive = 1;
constexpr int kScoreBound = 48;

}  // namespace

// Whether a statement only reads (one snapshot, nothing to commit) or may write.
enum class Access { kRead, kWrite };

struct PostgresStore::Impl {
  PostgresStoreOptions options;
  std::vector<std::pair<std::string, std::string>> conn_params;
  std::string describe;
  TableNames names;
  std::unique_ptr<Statements> st;
  SessionUse use;
  std::string session_setup;  // run once on each connection whose session is its own
  Fnv1a table_hash;           // the start of every advisory lock id of this table
  std::unique_ptr<Pool> pool;
  // SPEC §7: the channel the writes notify on (empty: notify = false or read-only), and the
  // listener that watches use (null: they cannot, and watch() returns null).
  std::string channel;
  std::unique_ptr<postgres::Listener> listener;
  std::atomic<int> absent_score{0};
  // SPEC §14: which database and table the store's records are in, as the server names them
  // (identity_sql's answer on the store's first connection), and the caller sessions seen
  // to answer the same (check_caller_database).
  std::string identity;
  std::mutex sessions_mu;
  std::vector<std::pair<const PGconn*, int>> sessions;  // guarded by sessions_mu
  // A read waits on the server's CPU, not its disk: its batches are balanced
  // (docs/stores/postgres.md, *Balanced read batches*).
  ReadBatcher reads{kMaxBatch,
                    kMaxBatchesInFlight,
                    &id_of<ReadRequest>,
                    {.balanced = true, .waited = kReadOverlapAfter}};
  AcquireBatcher acquires{kMaxBatch, kMaxBatchesInFlight, &id_of<AcquireRequest>};
  CompleteBatcher completes{kMaxBatch, kMaxBatchesInFlight, &id_of<CompleteRequest>};

  explicit Impl(PostgresStoreOptions o) : options(std::move(o)) {
    if (options.pool_size == 0) throw InvalidArgument("pool_size", "must be at least 1");
    if (options.timeout <= Duration::zero()) {
      throw InvalidArgument(
          "timeout", "must be positive, got " + std::to_string(options.timeout.count()) + " ms");
    }
    const bool default_table = options.table == PostgresStoreOptions{}.table;
    names = parse_table(options.table);
    conn_params = parse_conninfo(options.conninfo);
    if (!options.listen.empty()) {
      if (!options.notify) {
        throw InvalidArgument("listen",
                              "is a connection for notifications: it cannot go with notify=off");
      }
      (void)parse_conninfo(options.listen);  // refused now, not when the first waiter comes
    }
    describe = describe_of(conn_params, names, default_table);
    if (param_value(conn_params, "fallback_application_name").empty()) {
      set_param(conn_params, "fallback_application_name", "idem");
    }
    // Nothing travels in the startup packet but what libpq always sends: poolers refuse
    // what they do not know (PgBouncer: "unsupported startup parameter: options"). The
    // settings go with the session or with each call instead (docs/stores/postgres.md,
    // "Deploying").
    use.named = options.statements == PostgresStatements::kPrepared;
    use.pool_size = options.pool_size;
    session_setup =
        postgres::session_settings(options.timeout, options.asynchronous_commit, options.read_only);

    const Deadline deadline = SteadyClock::now() + options.timeout;
    auto first =
        std::make_unique<Connection>(conn_params, describe, options.timeout, use, deadline);
    inspect_server(*first, deadline);
    first->set_use(use);
    if (use.own_session) first->exec(session_setup, deadline);
    prepare_table(*first, deadline);
    try {
      identity = first->exec(identity_sql(), deadline).text(0, 0);
    } catch (const StoreUnavailable&) {
      // A look-alike (server=any) that cannot name its database this way: a caller's
      // connection is then taken on trust (docs/stores/postgres.md).
      if (options.check_server) throw;
      first = std::make_unique<Connection>(conn_params, describe, options.timeout, use, deadline);
      if (use.own_session) first->exec(session_setup, deadline);
    }
    if (options.notify && !options.read_only) channel = postgres::notify_channel(names);
    st = std::make_unique<Statements>(postgres::Sql(names, channel), names.display(), options);
    listener = make_listener();
    table_hash.add(names.display()).add(std::string_view("\0", 1));
    pool = std::make_unique<Pool>(
        options.pool_size,
        [this](Deadline d) {
          auto c = std::make_unique<Connection>(conn_params, describe, options.timeout, use, d);
          if (use.own_session) c->exec(session_setup, d);
          return c;
        },
        describe, options.timeout);
    pool->adopt(std::move(first));
  }

  // SPEC §14: one text that names the store's database and table by identity, not by name:
  // the cluster's system identifier ('?' where the role may not read it), the database's
  // OID and the table's OID ('' where the table does not exist there). Harmless inside a
  // caller's transaction: it reads catalogs and fails for nothing (to_regclass, not
  // ::regclass; the privilege asked, not assumed).
  std::string identity_sql() const {
    return "SELECT concat_ws('/', coalesce(CASE WHEN has_function_privilege("
           "'pg_catalog.pg_control_system()', 'EXECUTE') THEN (SELECT system_identifier::text "
           "FROM pg_catalog.pg_control_system()) END, '?'), (SELECT oid::text FROM "
           "pg_catalog.pg_database WHERE datname = current_database()), coalesce(to_regclass('" +
           names.table() + "')::oid::text, ''))";
  }

  // Refuses a caller's connection that reaches another database or table than the store's
  // own (SPEC §14): asked once per server session of `conn` (a PGconn and its backend pid,
  // which a reconnection or a pooler's new client changes), remembered after.
  void check_caller_database(PGconn* conn) {
    if (identity.empty()) return;  // a look-alike that cannot tell (see the constructor)
    const std::pair<const PGconn*, int> session{conn, PQbackendPID(conn)};
    {
      std::lock_guard lock(sessions_mu);
      if (std::find(sessions.begin(), sessions.end(), session) != sessions.end()) return;
    }
    const std::string theirs =
        postgres::run_on_caller(conn, identity_sql(), nullptr, {}, describe).text(0, 0);
    if (!same_identity(identity, theirs)) {
      const char* db = PQdb(conn);
      throw InvalidArgument(
          "connection",
          std::string("reaches another database or table than the store's records (it is on "
                      "database '") +
              (db ? db : "?") + "', server " + (PQhost(conn) ? PQhost(conn) : "?") + ":" +
              (PQport(conn) ? PQport(conn) : "?") + "; the store's records are in " +
              names.display() + " of " + describe +
              ", compared by the cluster's system identifier and the database's and table's "
              "OIDs): a record written there would not be the store's, so nothing was acquired");
    }
    std::lock_guard lock(sessions_mu);
    if (sessions.size() >= kRememberedSessions) sessions.erase(sessions.begin());
    sessions.push_back(session);
  }

  // identity_sql's answers name the same database and table ('?', an identifier this role
  // may not read, matches any).
  static bool same_identity(std::string_view ours, std::string_view theirs) {
    const auto cut = [](std::string_view id) {
      const std::size_t slash = id.find('/');
      return std::pair{id.substr(0, slash),
                       slash == std::string_view::npos ? std::string_view() : id.substr(slash)};
    };
    const auto [our_system, our_rest] = cut(ours);
    const auto [their_system, their_rest] = cut(theirs);
    if (our_rest != their_rest || our_rest.empty()) return false;
    return our_system == their_system || our_system == "?" || their_system == "?";
  }

  // The listener for watches, or null when the store cannot listen: notify is off, the
  // store is read-only, or it goes through a transaction pooler (LISTEN needs a server
  // session of its own) and `listen` gives no direct connection.
  std::unique_ptr<postgres::Listener> make_listener() const {
    if (channel.empty()) return nullptr;
    postgres::ConnParams params;
    if (!options.listen.empty()) {
      params = parse_conninfo(options.listen);
    } else if (use.own_session) {
      params = conn_params;
    } else {
      return nullptr;
    }
    // Named for what it is in pg_stat_activity: "<application_name>-listen".
    std::string app = param_value(params, "application_name");
    if (app.empty()) app = param_value(conn_params, "application_name");
    if (app.empty()) app = "idem";
    set_param(params, "application_name", app + "-listen");
    return std::make_unique<postgres::Listener>(std::move(params), channel, options.timeout);
  }

  // SPEC §7: the notifying statements' last parameter, the record's hash.
  Params& hash_of(Params& p, std::string_view scope, std::string_view key) const {
    if (!channel.empty()) {
      p.int8(static_cast<std::int64_t>(idem::detail::stable_record_hash(scope, key)));
    }
    return p;
  }

  // What answers: PostgreSQL 12 or later (not a look-alike), a primary (or a standby for a
  // read-only store), directly or through a pooler. Sets `use` and the current schema.
  void inspect_server(Connection& c, Deadline deadline) {
    // version() alone first: a look-alike may not know what the next statement asks.
    const std::string version = c.exec("SELECT version()", deadline).text(0, 0);
    const std::string refuse_hint =
        "; refusing to use it (server=any in the URL, or check_server = false, if you know it "
        "behaves as PostgreSQL does)";
    if (options.check_server) {
      if (std::optional<std::string> why = postgres::refused_server(version, c.server_version())) {
        c.fail({*why + refuse_hint, "", false});
      }
    }
    // The advisory lock is taken before pg_locks is read (the subquery runs for l's row).
    const std::string probe = std::to_string(kProbeLock);
    Result r = c.exec(
        options.check_server
            ? "WITH l AS MATERIALIZED (SELECT pg_backend_pid() AS pid, pg_advisory_xact_lock(" +
                  probe +
                  ")::text AS locked) "
                  "SELECT l.pid, pg_is_in_recovery(), current_schema(), (SELECT count(*) FROM "
                  "pg_locks WHERE locktype = 'advisory' AND pid = l.pid AND granted AND classid = "
                  "0 AND objid = " +
                  probe + " AND objsubid = 1) FROM l"
            : "SELECT pg_backend_pid(), pg_is_in_recovery(), current_schema(), 1",
        deadline);
    if (r.text(0, 3) == "0") {
      c.fail(
          {"the server's advisory locks do not lock (one taken does not show in pg_locks), "
           "and the store's order of tokens per key rests on them (" +
               version + ")" + refuse_hint,
           "", false});
    }
    if (r.text(0, 1) == "t") {
      if (!options.read_only) {
        c.fail(
            {"the server is a hot standby (pg_is_in_recovery() is true), which only serves "
             "reads: point the URL at the primary (with several hosts, add "
             "target_session_attrs=read-write), or open the store read-only to read records "
             "that may lag the primary's",
             "", false});
      }
      describe += " (read-only hot standby: its records may lag the primary's)";
    }
    const bool pooled = std::to_string(c.startup_pid()) != r.text(0, 0);
    use.pooler = pooled ? Pooler::kPresent : Pooler::kNone;
    switch (options.pooler) {
      case PostgresPooler::kAuto:
        use.own_session = !pooled;
        break;
      case PostgresPooler::kNone:
      case PostgresPooler::kSession:
        use.own_session = true;
        break;
      case PostgresPooler::kTransaction:
        use.own_session = false;
        break;
    }
    if (names.schema.empty()) {
      if (r.is_null(0, 2)) {
        c.fail(
            {"no current schema (the search_path names none that exists); give the "
             "table as schema.name",
             "", false});
      }
      names.schema = r.text(0, 2);
      if (!valid_identifier(names.schema)) {
        c.fail({"the current schema '" + names.schema +
                    "' is not a plain lowercase name; give the table as schema.name",
                "", false});
      }
    }
  }

  // Checks the table (creating or migrating it when allowed).
  void prepare_table(Connection& c, Deadline deadline) {
    const int version = table_version(c, deadline);
    if (version == postgres::kSchemaVersion) return;
    if (version == 0) {
      if (options.read_only || !options.create_if_missing) {
        c.fail({"table " + names.display() + " does not exist" +
                    (options.read_only ? " (opened read-only, so it is not created)"
                                       : " (and creating it was not allowed)"),
                "", false});
      }
      migrate(c, deadline);
      return;
    }
  }

  // 0 when the table is missing, else its schema version; refuses a table that is not ours
  // or is newer than this build, without touching it.
  int table_version(Connection& c, Deadline deadline) {
    const std::string regclass = "'" + names.table() + "'";
    Result r = c.exec(
        "SELECT c.relkind, obj_description(c.oid, 'pg_class') FROM pg_class c "
        "WHERE c.oid = to_regclass(" +
            regclass + ")",
        deadline);
    if (r.rows() == 0) return 0;
    const std::string comment = r.is_null(0, 1) ? std::string() : r.text(0, 1);
    const std::string prefix = postgres::kSchemaCommentPrefix;
    int version = 0;
    if (r.text(0, 0) == "r" && comment.rfind(prefix, 0) == 0) {
      const char* first = comment.data() + prefix.size();
      const char* last = comment.data() + comment.size();
      auto [end, ec] = std::from_chars(first, last, version);
      if (ec != std::errc{} || end != last || version <= 0) version = 0;
    }
    if (version == 0) {
      c.fail({"table " + names.display() +
                  " exists but is not an idem table (its comment is not '" + prefix +
                  "N'); refusing to use it",
              "", false});
    }
    if (version > postgres::kSchemaVersion) {
      c.fail({"table " + names.display() + " was made by a newer version of idem (schema version " +
                  std::to_string(version) + "; this build knows version " +
                  std::to_string(postgres::kSchemaVersion) + "); refusing to use it",
              "", false});
    }
    return version;
  }

  // Creates the schema (or, in later versions, moves it forward one version at a time)
  // inside one transaction under an advisory lock on the table's name, so processes that
  // start together wait for the first and then find the table made.
  void migrate(Connection& c, Deadline deadline) {
    const std::int64_t lock =
        Fnv1a().add("idem schema").add(std::string_view("\0", 1)).add(names.display()).value();
    // On any failure the caller drops this connection, which ends the transaction.
    c.exec("BEGIN ISOLATION LEVEL READ COMMITTED; SELECT pg_advisory_xact_lock(" +
               std::to_string(lock) + ")",
           deadline);
    const int version = table_version(c, deadline);
    if (version == 0) c.exec(postgres::Sql(names).create_schema, deadline);
    c.exec("COMMIT", deadline);
  }

  // Runs one of the store's statements on `c` in one round trip. With a session of its own
  // the connection runs it alone (its settings were made when it connected); otherwise the
  // settings go with it, and a statement that may write runs in its own READ COMMITTED
  // transaction, whatever default_transaction_isolation says (a lone read sees one snapshot
  // at every isolation level).
  // A write asks the connection to tell a statement the server never read (none of its
  // bytes acknowledged) from one whose answer was lost (Connection::run, probe_delivery).
  Result run(Connection& c, const Statement& s, const Params& p, Access access, Deadline d) {
    const bool write = access == Access::kWrite;
    if (use.own_session) return c.run({{&s, &p}}, 0, d, write);
    if (!write) return c.run({{&st->settings}, {&s, &p}}, 1, d);
    return c.run({{&st->begin}, {&st->settings}, {&s, &p}, {&st->commit}}, 2, d, write);
  }

  // Runs `body(connection, deadline)` on a pooled connection within `deadline` (by default
  // the call's timeout from now). Repeats it when it is known to have had no effect: once
  // on a new connection when its connection turned out dead (the send failed, or the
  // server had ended the idle session), and up to kMaxConflictRetries times when the server
  // rolled it back for a deadlock or serialization failure. `repeat` kAfterLostConnection
  // (a body that only reads, or one whose effect the store settles when it runs again)
  // also repeats it once on a new connection lost however it was, its answer included.
  enum class Repeat { kIfNotExecuted, kAfterLostConnection };
  template <typename F>
  auto with_connection(F&& body) {
    return with_connection(SteadyClock::now() + options.timeout, std::forward<F>(body));
  }
  template <typename F>
  auto with_connection(Deadline deadline, F&& body) {
    return with_connection(deadline, Repeat::kIfNotExecuted, std::forward<F>(body));
  }
  template <typename F>
  auto with_connection(Deadline deadline, Repeat repeat, F&& body) {
    bool fresh = false;
    for (int conflicts = 0;;) {
      Pool::Lease c = pool->borrow(deadline, fresh);
      try {
        return body(*c, deadline);
      } catch (const PgError& e) {
        const bool repeatable =
            e.not_executed() || (repeat == Repeat::kAfterLostConnection && e.connection_lost());
        if (repeatable && !fresh) {
          fresh = true;
        } else if (!e.rolled_back_conflict() || conflicts++ >= kMaxConflictRetries) {
          throw;
        }
      }
    }
  }

  // --- the batches' runners (postgres_batcher.h): a batch of one runs the single statement ---

  // Hands each row of `r` to the entry it answers: the one at the row's 1-based position
  // (column `position`), or the only entry when `position` < 0.
  template <typename Entry>
  static void answer(const Result& r, int position, const std::vector<Entry*>& batch,
                     bool with_outcome) {
    for (int row = 0; row < r.rows(); ++row) {
      const std::size_t at = position < 0 ? 0 : static_cast<std::size_t>(r.int8(row, position) - 1);
      if (at < batch.size()) batch[at]->response = row_of(r, row, with_outcome);
    }
  }

  // A read changes nothing: it runs again on a new connection however its own was lost.
  void run_reads(const std::vector<ReadBatcher::Entry*>& batch, Deadline deadline) {
    with_connection(deadline, Repeat::kAfterLostConnection, [&](Connection& c, Deadline d) {
      for (auto* e : batch) e->response = std::optional<Row>{};
      Result r;
      int position = -1;
      if (batch.size() == 1) {
        const ReadRequest& q = *batch[0]->request;
        r = run(c, st->select_record, Params().bytes(q.scope).bytes(q.key), Access::kRead, d);
      } else {
        std::vector<std::string_view> scopes, keys;
        for (auto* e : batch) {
          scopes.push_back(e->request->scope);
          keys.push_back(e->request->key);
        }
        r = run(c, st->select_many, Params().bytea_array(scopes).bytea_array(keys), Access::kRead,
                d);
        position = postgres::kColSelectPosition;
      }
      answer(r, position, batch, /*with_outcome=*/false);
    });
  }

  void run_acquires(const std::vector<AcquireBatcher::Entry*>& batch, Deadline deadline) {
    with_connection(deadline, [&](Connection& c, Deadline d) {
      for (auto* e : batch) e->response = std::optional<Row>{};
      Result r;
      int position = -1;
      if (batch.size() == 1) {
        const AcquireRequest& q = *batch[0]->request;
        Params p;
        p.bytes(q.scope).bytes(q.key).int8(q.lease.count()).int8(q.ttl.count());
        if (q.fingerprint) {
          p.bytes(*q.fingerprint);
        } else {
          p.null();
        }
        r = run(c, st->acquire, p.int8(q.lock), Access::kWrite, d);
      } else {
        std::vector<std::string_view> scopes, keys;
        std::vector<std::optional<std::string_view>> fingerprints;
        std::vector<std::int64_t> leases, ttls, locks;
        for (auto* e : batch) {
          const AcquireRequest& q = *e->request;
          scopes.push_back(q.scope);
          keys.push_back(q.key);
          leases.push_back(q.lease.count());
          ttls.push_back(q.ttl.count());
          fingerprints.push_back(q.fingerprint);
          locks.push_back(q.lock);
        }
        r = run(c, st->acquire_many,
                Params()
                    .bytea_array(scopes)
                    .bytea_array(keys)
                    .int8_array(leases)
                    .int8_array(ttls)
                    .bytea_array(fingerprints)
                    .int8_array(locks),
                Access::kWrite, d);
        position = postgres::kColAcquirePosition;
      }
      answer(r, position, batch, /*with_outcome=*/true);
    });
  }

  // A complete whose answer was lost runs again on a new connection: one that had
  // committed then changes no row, and its caller's completed_by check answers done (SPEC
  // §4: a complete repeated with the token that completed the record succeeds).
  void run_completes(const std::vector<CompleteBatcher::Entry*>& batch, Deadline deadline) {
    with_connection(deadline, Repeat::kAfterLostConnection, [&](Connection& c, Deadline d) {
      for (auto* e : batch) e->response = false;
      if (batch.size() == 1) {
        const CompleteRequest& q = *batch[0]->request;
        batch[0]->response = complete_one(c, q, d);
        return;
      }
      std::vector<std::string_view> scopes, keys, payloads;
      std::vector<std::int64_t> tokens, ttls, hashes;
      for (auto* e : batch) {
        const CompleteRequest& q = *e->request;
        scopes.push_back(q.scope);
        keys.push_back(q.key);
        tokens.push_back(static_cast<std::int64_t>(q.token));
        payloads.push_back(q.payload);
        ttls.push_back(q.ttl.count());
        if (!channel.empty()) {
          hashes.push_back(
              static_cast<std::int64_t>(idem::detail::stable_record_hash(q.scope, q.key)));
        }
      }
      Params p;
      p.bytea_array(scopes).bytea_array(keys).int8_array(tokens).bytea_array(payloads).int8_array(
          ttls);
      if (!channel.empty()) p.int8_array(hashes);
      Result r = run(c, st->complete_many, p, Access::kWrite, d);
      for (int row = 0; row < r.rows(); ++row) {
        const auto at = static_cast<std::size_t>(r.int8(row, 0) - 1);
        if (at < batch.size()) batch[at]->response = true;
      }
    });
  }

  bool complete_one(Connection& c, const CompleteRequest& q, Deadline d) {
    Params p;
    p.bytes(q.scope)
        .bytes(q.key)
        .int8(static_cast<std::int64_t>(q.token))
        .bytes(q.payload)
        .int8(q.ttl.count());
    Result r = run(c, st->complete, hash_of(p, q.scope, q.key), Access::kWrite, d);
    return r.affected() > 0;
  }

  // One record by (scope, key), read alone or in a batch with other callers' reads.
  std::optional<Row> read(std::string_view scope, std::string_view key, Deadline deadline) {
    const ReadRequest q{scope, key, record_id(scope, key)};
    return reads.submit(q, deadline, describe, options.timeout,
                        [&](const auto& batch) { run_reads(batch, deadline); });
  }

  std::int64_t lock_id(std::string_view scope, std::string_view key) const {
    return Fnv1a(table_hash).add_length(scope.size()).add(scope).add(key).value();
  }

  bool read_first() const {
    switch (options.acquire) {
      case PostgresAcquire::kReadFirst:
        return true;
      case PostgresAcquire::kWriteFirst:
        return false;
      case PostgresAcquire::kAdaptive:
        break;
    }
    return absent_score.load(std::memory_order_relaxed) <= 0;
  }

  // Races between callers may lose an update; the score is only a hint.
  void note(bool found_live) {
    const int s = absent_score.load(std::memory_order_relaxed);
    absent_score.store(found_live ? std::max(s - kScoreLive, -kScoreBound)
                                  : std::min(s + kScoreAbsent, kScoreBound),
                       std::memory_order_relaxed);
  }
};

PostgresStore::PostgresStore(PostgresStoreOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

PostgresStore::~PostgresStore() = default;

std::string PostgresStore::describe() const { return impl_->describe; }

AcquireResult PostgresStore::do_acquire(std::string_view scope, std::string_view key,
                                        Duration lease, Duration ttl,
                                        std::optional<std::string_view> fingerprint) {
  Impl& s = *impl_;
  const Deadline deadline = SteadyClock::now() + s.options.timeout;
  if (s.read_first()) {
    // A replay or a busy key costs one read-only SELECT.
    if (std::optional<Row> found = s.read(scope, key, deadline)) {
      if (std::optional<AcquireResult> answer = live_answer(*found)) {
        s.note(true);
        return std::move(*answer);
      }
    }
  }
  const AcquireRequest q{
      scope, key, lease, ttl, fingerprint, s.lock_id(scope, key), record_id(scope, key)};
  for (int round = 0; round < kMaxAcquireRounds; ++round) {
    std::optional<Row> r =
        s.acquires.submit(q, deadline, s.describe, s.options.timeout,
                          [&](const auto& batch) { s.run_acquires(batch, deadline); });
    if (!r) continue;  // another caller made the record live meanwhile: run it again
    if (r->outcome == postgres::kOutcomeLive) {
      s.note(true);
      if (std::optional<AcquireResult> answer = live_answer(*r)) return std::move(*answer);
      continue;  // cannot happen: the statement returns only live records
    }
    s.note(false);
    return Acquired{Lease{r->token, r->acquired_at, r->lease_expires_at, r->expires_at,
                          r->lease_expires_at - r->now, r->attempt},
                    /*stolen=*/r->attempt > 1};
  }
  throw StoreUnavailable(s.describe, "acquire found the record changed by other callers " +
                                         std::to_string(kMaxAcquireRounds) + " times in a row");
}

WriteResult PostgresStore::do_complete(std::string_view scope, std::string_view key, Token token,
                                       std::string_view payload, Duration ttl) {
  Impl& s = *impl_;
  const Deadline deadline = SteadyClock::now() + s.options.timeout;
  const CompleteRequest q{scope, key, token, payload, ttl, record_id(scope, key)};
  const bool done =
      payload.size() > kMaxBatchedPayload
          ? s.with_connection(deadline, Impl::Repeat::kAfterLostConnection,
                              [&](Connection& c, Deadline d) { return s.complete_one(c, q, d); })
          : s.completes.submit(q, deadline, s.describe, s.options.timeout,
                               [&](const auto& batch) { s.run_completes(batch, deadline); });
  if (done) return WriteResult::kDone;
  // SPEC §4: a complete repeated with the token that completed the record succeeds and
  // changes nothing (a caller whose reply was lost retries). A read: repeated however its
  // connection was lost.
  return s.with_connection(
      deadline, Impl::Repeat::kAfterLostConnection, [&](Connection& c, Deadline d) {
        Result r = s.run(c, s.st->completed_by,
                         Params().bytes(scope).bytes(key).int8(static_cast<std::int64_t>(token)),
                         Access::kRead, d);
        return r.rows() > 0 ? WriteResult::kDone : WriteResult::kFenced;
      });
}

WriteResult PostgresStore::do_release(std::string_view scope, std::string_view key, Token token) {
  Impl& s = *impl_;
  Params p;
  p.bytes(scope).bytes(key).int8(static_cast<std::int64_t>(token));
  s.hash_of(p, scope, key);
  return s.with_connection([&](Connection& c, Deadline deadline) {
    Result r = s.run(c, s.st->release, p, Access::kWrite, deadline);
    return r.rows() > 0 ? WriteResult::kDone : WriteResult::kFenced;
  });
}

ExtendResult PostgresStore::do_extend(std::string_view scope, std::string_view key, Token token,
                                      Duration lease) {
  Impl& s = *impl_;
  return s.with_connection([&](Connection& c, Deadline deadline) {
    Result r = s.run(
        c, s.st->extend,
        Params().bytes(scope).bytes(key).int8(static_cast<std::int64_t>(token)).int8(lease.count()),
        Access::kWrite, deadline);
    if (r.rows() == 0) return ExtendResult{};
    const Timestamp deadline_at = r.time(0, 0);
    return ExtendResult{WriteResult::kDone, deadline_at, deadline_at - r.time(0, 1)};
  });
}

std::vector<ExtendResult> PostgresStore::do_extend_many(std::span<const ExtendRequest> requests) {
  // One UPDATE changes a row once; a batch naming a record twice is done one by one, which
  // keeps the as-if-in-order meaning (the heartbeat never sends one).
  std::unordered_set<std::string> seen;
  for (const ExtendRequest& r : requests) {
    if (!seen.insert(record_id(r.scope, r.key)).second) return Store::do_extend_many(requests);
  }
  // Sorted by (scope, key): batches that overlap lock their rows in the same order.
  std::vector<std::size_t> order(requests.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const int s = requests[a].scope.compare(requests[b].scope);
    return s != 0 ? s < 0 : requests[a].key.compare(requests[b].key) < 0;
  });
  std::vector<std::string_view> scopes;
  std::vector<std::string_view> keys;
  std::vector<std::int64_t> tokens;
  std::vector<std::int64_t> leases;
  for (std::size_t i : order) {
    scopes.push_back(requests[i].scope);
    keys.push_back(requests[i].key);
    tokens.push_back(static_cast<std::int64_t>(requests[i].token));
    leases.push_back(requests[i].lease.count());
  }
  Params p;
  p.bytea_array(scopes).bytea_array(keys).int8_array(tokens).int8_array(leases);
  Impl& s = *impl_;
  return s.with_connection([&](Connection& c, Deadline deadline) {
    Result r = s.run(c, s.st->extend_many, p, Access::kWrite, deadline);
    std::vector<ExtendResult> results(requests.size());
    for (int row = 0; row < r.rows(); ++row) {
      const std::int64_t position = r.int8(row, 0);  // 1-based, in the sorted arrays
      if (position < 1 || static_cast<std::size_t>(position) > order.size()) continue;
      const Timestamp deadline_at = r.time(row, 1);
      results[order[static_cast<std::size_t>(position - 1)]] =
          ExtendResult{WriteResult::kDone, deadline_at, deadline_at - r.time(row, 2)};
    }
    return results;
  });
}

std::size_t PostgresStore::do_purge(std::size_t limit) {
  std::size_t deleted = 0;
  while (deleted < limit) {
    // Each batch is its own short transaction with its own timeout, so a large purge
    // never holds locks for long and never runs into one call's bound.
    const std::size_t batch = std::min(limit - deleted, kPurgeBatch);
    const std::size_t n = impl_->with_connection([&](Connection& c, Deadline deadline) {
      Result r = impl_->run(c, impl_->st->purge, Params().int8(static_cast<std::int64_t>(batch)),
                            Access::kWrite, deadline);
      return static_cast<std::size_t>(r.rows());
    });
    deleted += n;
    // A short batch: nothing more is due now (or the rest is locked by somebody else).
    if (n < batch) break;
  }
  return deleted;
}

std::optional<Record> PostgresStore::do_get(std::string_view scope, std::string_view key) {
  std::optional<Row> r = impl_->read(scope, key, SteadyClock::now() + impl_->options.timeout);
  if (!r) return std::nullopt;
  Record rec;
  const bool complete = r->state == postgres::kStateComplete;
  rec.state = complete ? RecordState::kComplete : RecordState::kInProgress;
  rec.token = r->token;
  if (complete) {
    rec.completed_at = r->completed_at;
    rec.payload = std::move(r->payload);
  } else {
    rec.attempt = r->attempt;
    rec.acquired_at = r->acquired_at;
    rec.lease_expires_at = r->lease_expires_at;
  }
  rec.expires_at = r->expires_at;
  rec.fingerprint = std::move(r->fingerprint);
  rec.now = r->now;
  return rec;
}

bool PostgresStore::do_forget(std::string_view scope, std::string_view key) {
  Impl& s = *impl_;
  Params p;
  s.hash_of(p.bytes(scope).bytes(key), scope, key);
  return s.with_connection([&](Connection& c, Deadline deadline) {
    return s.run(c, s.st->forget, p, Access::kWrite, deadline).affected() > 0;
  });
}

std::unique_ptr<RecordWatch> PostgresStore::do_watch(std::string_view scope, std::string_view key,
                                                     std::function<void()> changed) {
  if (!impl_->listener) return nullptr;
  return impl_->listener->watch(scope, key, std::move(changed));
}

PostgresListenerStats PostgresStore::listener_stats() const {
  return impl_->listener ? impl_->listener->stats() : PostgresListenerStats{};
}

// --- SPEC §14: the caller's transaction ---------------------------------------------------

namespace {

// The state `use` needs of a caller's connection: inside a healthy transaction (kJoin), or
// outside any (kBegin).
void check_caller_state(PGconn* conn, TransactionalStore::ConnectionUse use,
                        const std::string& store) {
  const bool join = use == TransactionalStore::ConnectionUse::kJoin;
  switch (PQtransactionStatus(conn)) {
    case PQTRANS_INTRANS:
      if (join) return;
      throw InvalidArgument("connection",
                            "is inside a transaction already; run_in_transaction begins and "
                            "commits its own (use run_in_open_transaction in a transaction of "
                            "yours)");
    case PQTRANS_IDLE:
      if (!join) return;
      throw InvalidArgument("connection",
                            "is not inside a transaction: BEGIN on it first, so that the record "
                            "commits with your writes");
    case PQTRANS_INERROR:
      throw InvalidArgument("connection",
                            "is inside a transaction that has failed already: roll it back");
    case PQTRANS_ACTIVE:
      throw InvalidArgument("connection", "is busy with another query");
    case PQTRANS_UNKNOWN:
      break;
  }
  throw StoreUnavailable(store,
                         "the caller's connection is broken: " + std::string(PQerrorMessage(conn)));
}

}  // namespace

TransactionalStore* PostgresStore::transactions() noexcept { return this; }

SqlConnection::Kind PostgresStore::connection_kind() const noexcept {
  return SqlConnection::Kind::kPostgres;
}

void PostgresStore::do_check_connection(const SqlConnection& conn, ConnectionUse use) {
  Impl& s = *impl_;
  if (s.options.read_only) {
    throw InvalidArgument("store", s.describe +
                                       " was opened read-only: it cannot write records in your "
                                       "transaction (open it without read_only)");
  }
  check_caller_state(conn.pg(), use, s.describe);
  s.check_caller_database(conn.pg());
}

void PostgresStore::do_notify_committed(std::string_view scope, std::string_view key) noexcept {
  Impl& s = *impl_;
  if (s.channel.empty()) return;
  try {
    Params p;
    p.int8(static_cast<std::int64_t>(idem::detail::stable_record_hash(scope, key)));
    // A notification sent twice wakes a waiter twice: harmless, so it may run again.
    (void)s.with_connection(SteadyClock::now() + s.options.timeout,
                            Impl::Repeat::kAfterLostConnection,
                            [&](Connection& c, Deadline deadline) {
                              return s.run(c, s.st->notify, p, Access::kRead, deadline).rows();
                            });
  } catch (...) {
    // Best effort: the waiters' polls find the record.
  }
}

bool PostgresStore::do_outside_transaction(const SqlConnection& conn) const noexcept {
  return PQtransactionStatus(conn.pg()) == PQTRANS_IDLE;
}

WriteResult PostgresStore::do_complete_in(const SqlConnection& conn, std::string_view scope,
                                          std::string_view key, Token token,
                                          std::string_view payload, Duration ttl) {
  Impl& s = *impl_;
  PGconn* pg = conn.pg();
  Params p;
  p.bytes(scope).bytes(key).int8(static_cast<std::int64_t>(token)).bytes(payload).int8(ttl.count());
  // Quiet: the executor notifies once the caller's commit is reported (notify_committed).
  if (postgres::run_on_caller(pg, s.st->complete_quiet.sql, &p, s.st->complete_quiet.types,
                              s.describe)
          .affected() > 0) {
    return WriteResult::kDone;
  }
  // SPEC §4: a complete repeated with the token that completed the record is done.
  Params q;
  q.bytes(scope).bytes(key).int8(static_cast<std::int64_t>(token));
  return postgres::run_on_caller(pg, s.st->completed_by.sql, &q, s.st->completed_by.types,
                                 s.describe)
                     .rows() > 0
             ? WriteResult::kDone
             : WriteResult::kFenced;
}

AcquireResult PostgresStore::do_acquire_in(const SqlConnection& conn, std::string_view scope,
                                           std::string_view key, Duration lease, Duration ttl,
                                           std::optional<std::string_view> fingerprint,
                                           bool nowait) {
  Impl& s = *impl_;
  PGconn* pg = conn.pg();
  const Statement& statement = nowait ? s.st->acquire_nowait : s.st->acquire;
  for (int round = 0; round < kMaxAcquireRounds; ++round) {
    Params p;
    p.bytes(scope).bytes(key).int8(lease.count()).int8(ttl.count());
    if (fingerprint) {
      p.bytes(*fingerprint);
    } else {
      p.null();
    }
    p.int8(s.lock_id(scope, key));
    const Result r = postgres::run_on_caller(pg, statement.sql, &p, statement.types, s.describe);
    if (r.rows() == 0) continue;  // another transaction made the record live: run it again
    if (r.int2(0, postgres::kColOutcome) == postgres::kOutcomeLocked) {
      // Another open transaction writes the key; its outcome is not known yet.
      return Busy{r.time(0, postgres::kColNow), Duration{0}, std::nullopt};
    }
    Row row = row_of(r, 0, /*with_outcome=*/true);
    if (row.outcome == postgres::kOutcomeLive) {
      if (std::optional<AcquireResult> answer = live_answer(row)) return std::move(*answer);
      continue;
    }
    return Acquired{Lease{row.token, row.acquired_at, row.lease_expires_at, row.expires_at,
                          row.lease_expires_at - row.now, row.attempt},
                    /*stolen=*/row.attempt > 1};
  }
  throw StoreUnavailable(s.describe, "acquire found the record changed by other transactions " +
                                         std::to_string(kMaxAcquireRounds) + " times in a row");
}

void PostgresStore::do_begin(const SqlConnection& conn) {
  (void)postgres::run_on_caller(conn.pg(), "BEGIN", nullptr, {}, impl_->describe);
}

void PostgresStore::do_commit(const SqlConnection& conn) {
  PGconn* pg = conn.pg();
  const Result r = postgres::run_on_caller(pg, "COMMIT", nullptr, {}, impl_->describe);
  // A transaction that had failed answers COMMIT with ROLLBACK.
  if (PQtransactionStatus(pg) == PQTRANS_IDLE &&
      std::string_view(PQcmdStatus(r.raw())) == "COMMIT") {
    return;
  }
  do_rollback(conn);
  throw StoreUnavailable(impl_->describe,
                         "the caller's transaction had failed and was rolled back at COMMIT");
}

void PostgresStore::do_rollback(const SqlConnection& conn) noexcept {
  PGconn* pg = conn.pg();
  const PGTransactionStatusType status = PQtransactionStatus(pg);
  if (status != PQTRANS_INTRANS && status != PQTRANS_INERROR) return;
  PQclear(PQexec(pg, "ROLLBACK"));
}

}  // namespace idem
