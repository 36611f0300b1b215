// `idem show`: one record as JSON, or its stored output with --payload.

#include <fmt/core.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "common.h"
#include "idem/store.h"
#include "json_output.h"
#include "payload.h"
#ifdef IDEM_WITH_PROXY
#include "proxy/record.h"
#endif

namespace idem::cli {
namespace {

constexpr const char* kName = "show";

struct ShowArgs {
  std::string key;
  std::string scope = kDefaultScope;
  std::string store;
  bool payload = false;
};

int show(const ShowArgs& args) {
  // Read-only: show never creates a store or writes to one. A default store that does not
  // exist yet simply has no records.
  std::shared_ptr<Store> store = open_cli_store(args.store, StoreAccess::kReadOnly);
  std::optional<Record> record;
  std::string where = store_url(args.store);
  if (store) {
    record = store->get(args.scope, args.key);
    where = store->describe();
  }
  // SPEC §4, §8: an expired COMPLETE record counts as absent, even before it is purged.
  const bool expired =
      record && record->state == RecordState::kComplete && record->expires_at <= record->now;
  if (!args.payload) {
    write_stdout(dump_json(record_json(where, args.scope, args.key, record)));
    return record && !expired ? kExitOk : kExitAbsent;
  }
  std::string what =
      fmt::format("key \"{}\" in scope \"{}\"", printable(args.key), printable(args.scope));
  if (!record) {
    print_error(kName, fmt::format("no record for {}", what));
    return kExitAbsent;
  }
  if (record->state != RecordState::kComplete) {
    print_error(kName, fmt::format("{} is in progress; it has no stored output yet", what));
    return kExitAbsent;
  }
  if (expired) {
    print_error(kName, fmt::format("the record of {} expired at {} (by the store's clock); it "
                                   "counts as absent, and the next run runs the command again",
                                   what, iso8601(record->expires_at)));
    return kExitAbsent;
  }
  // A record `idem run` wrote prints its command's output, one `idem proxy` wrote its
  // answer's body; any other payload (a library caller's) prints as stored.
  if (std::optional<CommandResult> result = decode_payload(record->payload)) {
    write_stdout(result->output);
    return kExitOk;
  }
#ifdef IDEM_WITH_PROXY
  if (std::optional<proxy::RecordedResponse> answer = proxy::decode_record(record->payload)) {
    if (answer->body_omitted) {
      print_error(kName, fmt::format("the answer recorded for {} was too large to keep ({} "
                                     "bytes); only its status and headers are stored",
                                     what, answer->body_size));
      return kExitAbsent;
    }
    write_stdout(answer->body);
    return kExitOk;
  }
#endif
  write_stdout(record->payload);
  return kExitOk;
}

}  // namespace

Command add_show_command(CLI::App& parent) {
  auto args = std::make_shared<ShowArgs>();
  CLI::App* app = parent.add_subcommand(
      kName,
      "Print a record as JSON (exit 1 when there is none, or it expired), or its stored output. "
      "Opens the store read-only and never creates one");
  app->add_option("--key", args->key, "Idempotency key")->required()->type_name("KEY");
  add_scope_option(*app, args->scope);
  add_store_option(*app, args->store);
  app->add_flag("--payload", args->payload,
                "Print the stored standard output, byte for byte, instead of the JSON");
  return Command{app, [args] { return show(*args); }};
}

}  // namespace idem::cli
