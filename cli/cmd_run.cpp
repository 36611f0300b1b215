// `idem run`: runs a command at most once per (scope, key) through idem::Executor
// (SPEC §12). The executor acquires, heartbeats, completes and releases; this file turns a
// child process into an action and the outcomes into exit statuses.

#include <fmt/core.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "child.h"
#include "commands.h"
#include "common.h"
#include "idem/error.h"
#include "idem/executor.h"
#include "idem/store_wrapper.h"
#include "payload.h"

namespace idem::cli {
namespace {

constexpr const char* kName = "run";

using SteadyClock = std::chrono::steady_clock;

struct RunArgs {
  std::string key;
  std::string scope = kDefaultScope;
  std::string store;
  std::string ttl = "24h";
  std::string lease = "30s";
  std::string wait = "0";
  std::string grace = "10s";
  std::string fingerprint;
  std::string max_output = "1MiB";
  bool status_only = false;
  bool verbose = false;
  std::vector<std::string> command;
  CLI::Option* fingerprint_option = nullptr;
};

// The command ended with a non-zero status, a signal, or idem was interrupted: the action
// throws this so the executor releases the record (SPEC §5), and idem exits with `status`.
class CommandFailed : public std::runtime_error {
 public:
  CommandFailed(int status, const std::string& why) : std::runtime_error(why), status_(status) {}
  int status() const noexcept { return status_; }

 private:
  int status_;
};

// Idem's standard output failed while the command ran; nothing is recorded. `status` is
// the command's own when it failed (it saw its output go away), else 0.
class PassThroughFailed : public std::runtime_error {
 public:
  PassThroughFailed(int error, int status)
      : std::runtime_error(fmt::format("cannot write the command's output to standard output: "
                                       "{}; its result was not recorded (the record was "
                                       "released)",
                                       std::strerror(error))),
        error_(error),
        status_(status) {}
  int error() const noexcept { return error_; }
  int status() const noexcept { return status_; }

 private:
  int error_;
  int status_;
};

// The command succeeded but wrote more than --max-output bytes; nothing is recorded.
class OutputTooLarge : public std::runtime_error {
 public:
  OutputTooLarge(std::size_t size, std::size_t limit)
      : std::runtime_error(fmt::format(
            "the command wrote {} bytes to standard output, more than the limit of {} bytes; "
            "its result was not recorded (the record was released, so a later run runs it "
            "again). Raise the limit with --max-output (at most {} bytes) or record only the "
            "exit status with --status-only",
            size, limit, kMaxPayloadBytes - kPayloadHeaderBytes)) {}
};

// The store as the executor of `idem run` sees it. Signals are held from the moment an
// acquire is sent, so none can end idem between the store taking the key and the command
// starting (an acquire that does not take the key lets them go again). The lease deadline
// the store last confirmed is kept, so the command can be stopped before the lease can
// run out. Failures to record the result are counted (and told under -v).
class RunStore final : public StoreWrapper {
 public:
  RunStore(std::shared_ptr<Store> target, SignalRelay& signals, bool verbose)
      : StoreWrapper(std::move(target)), signals_(signals), verbose_(verbose) {}

  // The lease deadline by the steady clock, as of the last acquire or extend that the
  // store confirmed.
  SteadyClock::time_point deadline() const noexcept {
    return SteadyClock::time_point(SteadyClock::duration(deadline_.load()));
  }
  int complete_failures() const noexcept { return complete_failures_.load(); }

 protected:
  AcquireResult do_acquire(std::string_view scope, std::string_view key, Duration lease,
                           Duration ttl, std::optional<std::string_view> fingerprint) override {
    signals_.hold();
    const auto sent = SteadyClock::now();
    AcquireResult result;
    try {
      result = StoreWrapper::do_acquire(scope, key, lease, ttl, fingerprint);
    } catch (...) {
      signals_.let_go();
      throw;
    }
    if (const auto* acquired = std::get_if<Acquired>(&result)) {
      observe(sent, acquired->lease.lease_remaining);
    } else {
      signals_.let_go();
    }
    return result;
  }

  ExtendResult do_extend(std::string_view scope, std::string_view key, Token token,
                         Duration lease) override {
    const auto sent = SteadyClock::now();
    ExtendResult result = StoreWrapper::do_extend(scope, key, token, lease);
    if (result.result == WriteResult::kDone) observe(sent, result.lease_remaining);
    return result;
  }

  // The heartbeat sends its extends in batches; `idem run` holds one lease, so whatever
  // the store confirmed in a batch is its deadline.
  std::vector<ExtendResult> do_extend_many(std::span<const ExtendRequest> requests) override {
    const auto sent = SteadyClock::now();
    std::vector<ExtendResult> results = StoreWrapper::do_extend_many(requests);
    for (const ExtendResult& result : results) {
      if (result.result == WriteResult::kDone) observe(sent, result.lease_remaining);
    }
    return results;
  }

  WriteResult do_complete(std::string_view scope, std::string_view key, Token token,
                          std::string_view payload, Duration ttl) override {
    try {
      return StoreWrapper::do_complete(scope, key, token, payload, ttl);
    } catch (const StoreUnavailable& e) {
      complete_failures_.fetch_add(1);
      if (verbose_) {
        print_error(kName, fmt::format("could not record the result yet ({}); retrying while "
                                       "the lease lasts",
                                       e.what()));
      }
      throw;
    }
  }

 private:
  // SPEC §6: the local deadline is the send time plus the time left by the store's clock.
  void observe(SteadyClock::time_point sent, Duration remaining) noexcept {
    deadline_.store((sent + remaining).time_since_epoch().count());
  }

  SignalRelay& signals_;
  const bool verbose_;
  std::atomic<SteadyClock::rep> deadline_{
      SteadyClock::time_point::max().time_since_epoch().count()};
  std::atomic<int> complete_failures_{0};
};

// The heartbeat's last error, kept for the message when the lease is lost.
class HeartbeatErrors {
 public:
  void record(const std::exception& e) {
    std::lock_guard lock(mutex_);
    last_ = e.what();
  }
  std::string last() const {
    std::lock_guard lock(mutex_);
    return last_;
  }

 private:
  mutable std::mutex mutex_;
  std::string last_;
};

std::string describe_key(const RunArgs& args) {
  return fmt::format("key \"{}\" in scope \"{}\"", printable(args.key), printable(args.scope));
}

int run_command(RunArgs& args) {
  if (args.command.empty()) {
    throw UsageError("command",
                     "missing; give the command to run after '--', e.g. "
                     "idem run --key KEY -- CMD ARGS...");
  }
  const Duration ttl = duration_option("--ttl", args.ttl, false);
  const Duration lease = duration_option("--lease", args.lease, false);
  const Duration wait = duration_option("--wait", args.wait, true);
  const Duration grace = duration_option("--grace", args.grace, false);
  std::optional<std::size_t> max_output = parse_size(args.max_output);
  constexpr std::size_t kMaxOutput = kMaxPayloadBytes - kPayloadHeaderBytes;
  if (!max_output) {
    throw UsageError("--max-output", fmt::format("'{}' is not a byte count (e.g. 1048576, "
                                                 "512KiB, 4MiB)",
                                                 printable(args.max_output)));
  }
  if (*max_output > kMaxOutput) {
    throw UsageError("--max-output",
                     fmt::format("{} bytes is more than the limit of {} bytes (64 MiB less the "
                                 "{}-byte record header)",
                                 *max_output, kMaxOutput, kPayloadHeaderBytes));
  }
  // SPEC §10: bad input is rejected before any record is written (and before the store is
  // even opened, so the message names the argument rather than the store).
  try {
    validate_scope(args.scope);
    validate_key(args.key);
  } catch (const InvalidArgument& e) {
    throw UsageError("--" + e.argument(), e.what());
  }

  SignalRelay signals;
  auto store = std::make_shared<RunStore>(open_cli_store(args.store, StoreAccess::kCreate), signals,
                                          args.verbose);
  auto heartbeat_errors = std::make_shared<HeartbeatErrors>();
  ExecutorOptions options;
  options.lease = lease;
  options.ttl = ttl;
  options.wait.max_wait = wait;
  options.max_payload = *max_output + kPayloadHeaderBytes;
  // Called on the heartbeat thread; the lease is kept until its deadline passes (SPEC §6),
  // so this is a warning, and a lost lease is reported when it happens.
  options.on_heartbeat_error = [heartbeat_errors](const std::exception& e) {
    heartbeat_errors->record(e);
    print_error(kName,
                fmt::format("warning: the heartbeat could not extend the lease: {}", e.what()));
  };
  Executor executor(store, options);
  CallOptions call;
  if (args.fingerprint_option->count() > 0) call.fingerprint = args.fingerprint;

  // Set once the command ran and exited 0: from then on a failure means its result, not
  // the command, is what was lost.
  bool command_succeeded = false;
  // The command must be dead a moment before the lease could run out, however its last
  // extend went: a tenth of the lease, at most a second. SIGTERM comes --grace earlier, but
  // never more than a third of the lease earlier (a heartbeat's worth).
  const Duration margin = std::min<Duration>(lease / 10, std::chrono::seconds(1));
  const Duration deadline_grace = std::min<Duration>(grace, lease / 3);

  auto action = [&](const Attempt& attempt) -> std::string {
    // Signals have been held since the acquire was sent; one that came meanwhile ends the
    // run before the command starts (the executor releases the record).
    if (int sig = signals.first(); sig != 0) {
      throw CommandFailed(
          128 + sig, fmt::format("interrupted by {} before the command started", signal_name(sig)));
    }
    if (args.verbose) {
      print_error(kName, fmt::format("running {} (token {}, attempt {}{})", describe_key(args),
                                     attempt.token(), attempt.number(),
                                     attempt.stolen() ? ", took over an abandoned run" : ""));
    }
    ChildOptions child;
    child.argv = args.command;
    child.env = {{"IDEM_SCOPE", args.scope},
                 {"IDEM_KEY", args.key},
                 {"IDEM_TOKEN", std::to_string(attempt.token())},
                 {"IDEM_ATTEMPT", std::to_string(attempt.number())},
                 {"IDEM_STOLEN", attempt.stolen() ? "1" : "0"}};
    child.pass_through_fd = STDOUT_FILENO;
    child.capture_limit = args.status_only ? 0 : *max_output;
    child.grace = grace;
    child.stop = attempt.stop_token();
    child.dead_by = [&store, margin] { return store->deadline() - margin; };
    child.deadline_grace = deadline_grace;
    ChildOutcome outcome = run_child(child, signals);
    if (outcome.output_error != 0) throw PassThroughFailed(outcome.output_error, outcome.status());
    if (outcome.stopped == StopReason::kLeaseRunningOut) {
      std::string why = heartbeat_errors->last();
      throw LeaseLost(attempt.token(),
                      fmt::format("the store could not be reached to extend the lease{}, so the "
                                  "command was stopped before the lease could run out",
                                  why.empty() ? "" : " (" + why + ")"));
    }
    if (outcome.stopped == StopReason::kLeaseLost) {
      std::string why = heartbeat_errors->last();
      throw LeaseLost(attempt.token(),
                      why.empty() ? "the store refused to extend it (the record was forgotten, or "
                                    "its lease ran out and another run took the key over), so "
                                    "the command was stopped"
                                  : fmt::format("the heartbeat could not extend it before it ran "
                                                "out ({}), so the command was stopped",
                                                why));
    }
    if (outcome.interrupted_by != 0) {
      // Interrupted runs are never recorded, even if the command exits 0 on the signal, and
      // idem never reports success for them.
      int status = outcome.status() != 0 ? outcome.status() : 128 + outcome.interrupted_by;
      throw CommandFailed(status,
                          fmt::format("interrupted by {}", signal_name(outcome.interrupted_by)));
    }
    if (outcome.term_signal != 0) {
      throw CommandFailed(outcome.status(), fmt::format("the command was killed by {}",
                                                        signal_name(outcome.term_signal)));
    }
    if (outcome.exit_code != 0) {
      throw CommandFailed(outcome.status(),
                          fmt::format("the command exited with status {}", outcome.exit_code));
    }
    if (!args.status_only && outcome.output_bytes > *max_output) {
      throw OutputTooLarge(outcome.output_bytes, *max_output);
    }
    CommandResult result;
    result.exit_status = 0;
    result.status_only = args.status_only;
    result.output = std::move(outcome.output);
    command_succeeded = true;
    return encode_payload(result);
  };

  // Whatever happens, idem stops holding signals once the executor is done with the record.
  struct StopHolding {
    SignalRelay& signals;
    ~StopHolding() { (void)signals.stop_holding(); }
  } stop_holding{signals};
  try {
    Executor::BytesResult result = executor.run_bytes(args.scope, args.key, action, call);
    (void)signals.stop_holding();
    if (!result.replayed) {
      if (args.verbose) print_error(kName, "completed; the result was recorded");
      return kExitOk;
    }
    std::string why;
    std::optional<CommandResult> stored = decode_payload(result.value, &why);
    if (!stored) {
      print_error(kName, fmt::format("{}: {}", describe_key(args), why));
      return kExitDataError;
    }
    if (args.verbose) {
      print_error(kName, fmt::format("replayed the stored result of {}; the command did not run",
                                     describe_key(args)));
    }
    write_stdout(stored->output);
    return kExitOk;
  } catch (const CommandFailed& e) {
    if (args.verbose) {
      print_error(kName, fmt::format("{}; the record was released", e.what()));
    }
    return e.status();
  } catch (const PassThroughFailed& e) {
    // A reader that went away ends the run as it would have ended the command: quietly,
    // with the command's status (or SIGPIPE's).
    if (e.error() == EPIPE) {
      if (args.verbose) print_error(kName, e.what());
      return e.status() != 0 ? e.status() : kExitBrokenPipe;
    }
    print_error(kName, e.what());
    return kExitOutputError;
  } catch (const SpawnError& e) {
    print_error(kName, fmt::format("{}; the record was released", e.what()));
    return e.status();
  } catch (const OutputTooLarge& e) {
    print_error(kName, e.what());
    return kExitOutputTooLarge;
  } catch (const InProgress& e) {
    const std::string until =
        fmt::format("its lease ends at {} (in {}, by the store's clock)",
                    iso8601(e.lease_expires_at()), human_duration(e.lease_remaining()));
    print_error(kName, wait.count() > 0
                           ? fmt::format("{} is being run by another process; waited {} and {}. "
                                         "Try again later",
                                         describe_key(args), human_duration(wait), until)
                           : fmt::format("{} is being run by another process; {}. Try again "
                                         "later, or wait with --wait",
                                         describe_key(args), until));
    return kExitInProgress;
  } catch (const KeyReuse& e) {
    print_error(kName, fmt::format("{} was used before with a different --fingerprint (stored "
                                   "\"{}\", given \"{}\"); not running the command",
                                   describe_key(args), printable(e.stored_fingerprint()),
                                   printable(e.request_fingerprint())));
    return kExitDataError;
  } catch (const LeaseLost& e) {
    if (command_succeeded) {
      print_error(kName, fmt::format("the command ran and exited 0, but its result was not "
                                     "recorded: the store refused it, because the record of {} "
                                     "was forgotten, or its lease ran out and another run took "
                                     "the key over",
                                     describe_key(args)));
    } else {
      print_error(kName, fmt::format("lost the lease on {} while the command ran: {}. The "
                                     "result was not recorded",
                                     describe_key(args), e.what()));
    }
    return kExitLeaseLost;
  } catch (const StoreUnavailable& e) {
    if (!command_succeeded) throw;
    // Unconfirmed (Redis with wait_replicas): the result is on the server idem talks to,
    // not confirmed on the replicas a failover would promote.
    const bool unconfirmed = e.unconfirmed();
    print_error(
        kName,
        fmt::format("the command ran and exited 0, but {}: {} (tried {} times while the lease "
                    "lasted). {}. Do not simply run it again: check first whether the "
                    "command's effects happened",
                    unconfirmed ? "the store could not confirm its result"
                                : "its result could not be recorded",
                    e.what(), store->complete_failures(),
                    unconfirmed
                        ? fmt::format("A later run of {} replays it, unless a failover loses "
                                      "it; then that run takes the key over and runs the "
                                      "command again",
                                      describe_key(args))
                        : fmt::format("The record of {} stays in progress until its lease "
                                      "ends; the next run of the key then takes it over and "
                                      "runs the command again (with IDEM_STOLEN=1)",
                                      describe_key(args))));
    return kExitNotRecorded;
  }
}

}  // namespace

Command add_run_command(CLI::App& parent) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* app = parent.add_subcommand(
      kName,
      "Run a command at most once per key: a duplicate within the TTL prints the stored output "
      "and exits 0 without running it");
  app->add_option("--key", args->key, "Idempotency key")->required()->type_name("KEY");
  add_scope_option(*app, args->scope);
  add_store_option(*app, args->store);
  app->add_option("--ttl", args->ttl, "How long a completed result is replayed")
      ->capture_default_str()
      ->type_name("DURATION");
  app->add_option("--lease", args->lease,
                  "How long a run holds the key without a heartbeat (crash recovery time)")
      ->capture_default_str()
      ->type_name("DURATION");
  app->add_option("--wait", args->wait,
                  "How long a duplicate waits for a run in progress (0: exit 75 at once)")
      ->capture_default_str()
      ->type_name("DURATION");
  app->add_option("--grace", args->grace,
                  "After a lost lease, how long the command has between SIGTERM and SIGKILL")
      ->capture_default_str()
      ->type_name("DURATION");
  args->fingerprint_option =
      app->add_option("--fingerprint", args->fingerprint,
                      "A digest of the request; the same key with a different fingerprint exits 65")
          ->type_name("F");
  app->add_option("--max-output", args->max_output,
                  "Largest standard output recorded, in bytes (or KiB, MiB); at most 64 MiB "
                  "less 8 bytes")
      ->capture_default_str()
      ->type_name("BYTES");
  app->add_flag("--status-only", args->status_only,
                "Record only the exit status, not the output (a replay prints nothing)");
  app->add_flag("-v,--verbose", args->verbose, "Say on stderr what happened (ran, replayed)");
  app->add_option("command", args->command, "The command and its arguments, after --")
      ->type_name("CMD");
  // Everything after the first positional argument belongs to the command, so
  // `idem run --key k ls -l` passes -l to ls.
  app->positionals_at_end();
  app->footer(
      "Durations: 250ms, 1.5s, 30s, 5m, 24h, 7d, sums such as 1h30m, or 0.\n"
      "Exit status: the command's own; 64 usage, 65 fingerprint mismatch or foreign record,\n"
      "69 store unavailable, 70 lease lost, 71 out of processes, 73 output too large,\n"
      "74 standard output failed, 75 in progress, 76 ran but its result not recorded.");
  return Command{app, [args] { return run_command(*args); }};
}

}  // namespace idem::cli
