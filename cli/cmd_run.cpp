// `idem run`: runs a command at most once per (scope, key) through idem::Executor
// (SPEC §12). The executor acquires, heartbeats, completes and releases; this file turns a
// child process into an action and the outcomes into exit statuses.

#include <fmt/core.h>
#include <string.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "child.h"
#include "commands.h"
#include "common.h"
#include "idem/error.h"
#include "idem/executor.h"
#include "payload.h"

namespace idem::cli {
namespace {

constexpr const char* kName = "run";

struct RunArgs {
  std::string key;
  std::string scope = kDefaultScope;
  std::string store;
  std::string ttl = "24h";
  std::string lease = "30s";
  std::string wait = "0s";
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
  CommandFailed(int status, std::string why)
      : std::runtime_error(std::move(why)), status_(status) {}
  int status() const noexcept { return status_; }

 private:
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

std::string describe_key(const RunArgs& args) {
  return fmt::format("key \"{}\" in scope \"{}\"", printable(args.key), printable(args.scope));
}

std::string signal_name(int sig) {
  const char* name = ::sigabbrev_np(sig);
  return name != nullptr ? fmt::format("SIG{}", name) : fmt::format("signal {}", sig);
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

  std::shared_ptr<Store> store = open_cli_store(args.store);
  SignalGuard signals;
  ExecutorOptions options;
  options.lease = lease;
  options.ttl = ttl;
  options.wait.max_wait = wait;
  options.max_payload = *max_output + kPayloadHeaderBytes;
  // Called on the heartbeat thread; the lease is kept until its deadline passes (SPEC §6),
  // so this is a warning, and a lost lease is reported when it happens.
  options.on_heartbeat_error = [](const std::exception& e) {
    print_error(kName,
                fmt::format("warning: the heartbeat could not extend the lease: {}", e.what()));
  };
  Executor executor(store, options);
  CallOptions call;
  if (args.fingerprint_option->count() > 0) call.fingerprint = args.fingerprint;

  auto action = [&](const Attempt& attempt) -> std::string {
    // From here on idem holds the lease: a signal must reach the child and end in a
    // release, not end idem with the record held.
    signals.forward();
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
    ChildOutcome outcome = run_child(child, signals);
    if (outcome.stopped) {
      throw LeaseLost(attempt.token(),
                      "the command was stopped because another run took the key over or the "
                      "record was forgotten");
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
    return encode_payload(result);
  };

  try {
    Executor::BytesResult result = executor.run_bytes(args.scope, args.key, action, call);
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
    // A reader that went away early (EPIPE) is not a failure of the replay.
    (void)write_all(STDOUT_FILENO, stored->output);
    return kExitOk;
  } catch (const CommandFailed& e) {
    if (args.verbose) {
      print_error(kName, fmt::format("{}; the record was released", e.what()));
    }
    return e.status();
  } catch (const SpawnError& e) {
    print_error(kName, fmt::format("{}; the record was released", e.what()));
    return e.status();
  } catch (const OutputTooLarge& e) {
    print_error(kName, e.what());
    return kExitOutputTooLarge;
  } catch (const InProgress& e) {
    print_error(kName,
                fmt::format("{} is being run by another process; its lease ends at {} (in {}, by "
                            "the store's clock). Try again later, or wait with --wait",
                            describe_key(args), iso8601(e.lease_expires_at()),
                            human_duration(e.lease_remaining())));
    return kExitInProgress;
  } catch (const KeyReuse& e) {
    print_error(kName, fmt::format("{} was used before with a different --fingerprint (stored "
                                   "\"{}\", given \"{}\"); not running the command",
                                   describe_key(args), printable(e.stored_fingerprint()),
                                   printable(e.request_fingerprint())));
    return kExitDataError;
  } catch (const LeaseLost& e) {
    print_error(kName, fmt::format("lost the lease on {} while the command ran: {}. The "
                                   "result was not recorded",
                                   describe_key(args), e.what()));
    return kExitLeaseLost;
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
      "Durations: 250ms, 30s, 5m, 24h, 7d (or sums such as 1h30m).\n"
      "Exit status: the command's own; 64 usage, 65 fingerprint mismatch or foreign record,\n"
      "69 store unavailable, 70 lease lost, 73 output too large, 75 in progress.");
  return Command{app, [args] { return run_command(*args); }};
}

}  // namespace idem::cli
