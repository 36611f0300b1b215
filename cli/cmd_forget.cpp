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
};

int forget(const ForgetArgs& args) {
  std::shared_ptr<Store> store = open_cli_store(args.store);
  std::string what =
      fmt::format("key \"{}\" in scope \"{}\"", printable(args.key), printable(args.scope));
  // The snapshot only serves the report; forget deletes whatever is there when it runs.
  std::optional<Record> before = store->get(args.scope, args.key);
  if (!store->forget(args.scope, args.key)) {
    print_error(kName, fmt::format("no record for {} in {}", what, store->describe()));
    return kExitAbsent;
  }
  std::string was =
      before ? fmt::format(" (was {}, token {})", to_string(before->state), before->token)
             : std::string();
  (void)write_all(STDOUT_FILENO, fmt::format("forgot {}{}\n", what, was));
  if (before && before->state == RecordState::kInProgress) {
    print_error(kName, "the run that held it will find its lease lost and record nothing");
  }
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
  return Command{app, [args] { return forget(*args); }};
}

}  // namespace idem::cli
