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
  std::shared_ptr<Store> store = open_cli_store(args.store);
  std::optional<Record> record = store->get(args.scope, args.key);
  if (!args.payload) {
    (void)write_all(STDOUT_FILENO,
                    dump_json(record_json(store->describe(), args.scope, args.key, record)));
    return record ? kExitOk : kExitAbsent;
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
  // A record `idem run` wrote prints its command's output; any other payload (a library
  // caller's) prints as stored.
  std::optional<CommandResult> result = decode_payload(record->payload);
  (void)write_all(STDOUT_FILENO,
                  result ? std::string_view(result->output) : std::string_view(record->payload));
  return kExitOk;
}

}  // namespace

Command add_show_command(CLI::App& parent) {
  auto args = std::make_shared<ShowArgs>();
  CLI::App* app = parent.add_subcommand(
      kName, "Print a record as JSON (exit 1 when there is none), or its stored output");
  app->add_option("--key", args->key, "Idempotency key")->required()->type_name("KEY");
  add_scope_option(*app, args->scope);
  add_store_option(*app, args->store);
  app->add_flag("--payload", args->payload,
                "Print the stored standard output, byte for byte, instead of the JSON");
  return Command{app, [args] { return show(*args); }};
}

}  // namespace idem::cli
