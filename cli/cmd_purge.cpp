// `idem purge`: deletes expired records in bounded batches (SPEC §4 purge, §8).

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>

#include "commands.h"
#include "common.h"
#include "idem/store.h"

namespace idem::cli {
namespace {

// Each store call deletes at most this many records, so a purge never blocks acquisitions
// for long (SPEC §8).
constexpr std::size_t kBatch = 1000;

struct PurgeArgs {
  std::string store;
  std::size_t limit = 0;
  bool create = false;
  CLI::Option* limit_option = nullptr;
};

int purge(const PurgeArgs& args) {
  if (args.limit_option->count() > 0 && args.limit == 0) {
    throw UsageError("--limit", "must be 1 or more (leave it out to purge every expired record)");
  }
  std::shared_ptr<Store> store =
      open_cli_store(args.store, args.create ? StoreAccess::kCreate : StoreAccess::kExisting,
                     "pass --create to create it");
  if (!store) {
    // The default store does not exist yet: nothing to purge, and it stays uncreated.
    write_stdout(fmt::format("purged 0 expired records from {} (the store does not exist yet)\n",
                             store_url(args.store)));
    return kExitOk;
  }
  std::size_t total = 0;
  for (;;) {
    std::size_t batch = kBatch;
    if (args.limit != 0) batch = std::min(batch, args.limit - total);
    if (batch == 0) break;
    std::size_t n = store->purge(batch);
    total += n;
    if (n < batch) break;
  }
  write_stdout(fmt::format("purged {} expired record{} from {}\n", total, total == 1 ? "" : "s",
                           store->describe()));
  return kExitOk;
}

}  // namespace

Command add_purge_command(CLI::App& parent) {
  auto args = std::make_shared<PurgeArgs>();
  CLI::App* app = parent.add_subcommand(
      "purge", "Delete expired records (completed past their TTL, abandoned past lease and TTL)");
  args->limit_option =
      app->add_option("--limit", args->limit, "Delete at most this many, 1 or more (default: all)")
          ->type_name("N");
  add_store_option(*app, args->store);
  app->add_flag("--create", args->create,
                "Create the store if it does not exist (otherwise a missing store is an error)");
  return Command{app, [args] { return purge(*args); }};
}

}  // namespace idem::cli
