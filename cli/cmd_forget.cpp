// `idem forget`: an operator's delete of one record, whatever its state (SPEC §4 forget).

#include <fmt/core.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "common.h"
#include "idem/store.h"

namespace idem::cli {
namespace {

constexpr const char* kName = "forget";

struct ForgetArgs {
  std::string key;
  std::string scope = kDefaultScope;
  std::string store;
  bool create = false;
};

int forget(const ForgetArgs& args) {
  std::string what =
      fmt::format("key \"{}\" in scope \"{}\"", printable(args.key), printable(args.scope));
  std::shared_ptr<Store> store =
      open_cli_store(args.store, args.create ? StoreAccess::kCreate : StoreAccess::kExisting,
                     "pass --create to create it");
  if (!store) {
    // The default store does not exist yet: it has no records, and stays uncreated.
    print_error(kName, fmt::format("no record for {} in {} (the store does not exist yet)", what,
                                   store_url(args.store)));
    return kExitAbsent;
  }
  // The snapshot only serves the report; forget deletes whatever is there when it runs.
  std::optional<Record> before = store->get(args.scope, args.key);
  if (!store->forget(args.scope, args.key)) {
    print_error(kName, fmt::format("no record for {} in {}", what, store->describe()));
    return kExitAbsent;
  }
  if (before && before->state == RecordState::kInProgress) {
    print_error(kName, "the run that held it will find its lease lost and record nothing");
  }
  std::string was =
      before ? fmt::format(" (was {}, token {})", to_string(before->state), before->token)
             : std::string();
  write_stdout(fmt::format("forgot {}{}\n", what, was));
  return kExitOk;
}

}  // namespace

Command add_forget_command(CLI::App& parent) {
  auto args = std::make_shared<ForgetArgs>();
  CLI::App* app = parent.add_subcommand(
      kName, "Delete one record whatever its state, so the next run of the key runs again");
  app->add_option("--key", args->key, "Idempotency key")->required()->type_name("KEY");
  add_scope_option(*app, args->scope);
  add_store_option(*app, args->store);
  app->add_flag("--create", args->create,
                "Create the store if it does not exist (otherwise a missing store is an error)");
  return Command{app, [args] { return forget(*args); }};
}

}  // namespace idem::cli
