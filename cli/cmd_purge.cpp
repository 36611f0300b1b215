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
};

int purge(const PurgeArgs& args) {
  std::shared_ptr<Store> store = open_cli_store(args.store);
  std::size_t total = 0;
  for (;;) {
    std::size_t batch = kBatch;
    if (args.limit != 0) batch = std::min(batch, args.limit - total);
    if (batch == 0) break;
    std::size_t n = store->purge(batch);
    total += n;
    if (n < batch) break;
  }
  (void)write_all(STDOUT_FILENO, fmt::format("purged {} expired record{} from {}\n", total,
                                             total == 1 ? "" : "s", store->describe()));
  return kExitOk;
}

}  // namespace

Command add_purge_command(CLI::App& parent) {
  auto args = std::make_shared<PurgeArgs>();
  CLI::App* app = parent.add_subcommand(
      "purge", "Delete expired records (completed past their TTL, abandoned past lease and TTL)");
  app->add_option("--limit", args->limit, "Delete at most this many (default: all)")
      ->type_name("N")
      ->check(CLI::PositiveNumber);
  add_store_option(*app, args->store);
  return Command{app, [args] { return purge(*args); }};
}

}  // namespace idem::cli
