// The `idem` command line as a whole, apart from main(), so a test or fuzzer can parse
// arguments exactly as the tool does without running anything.

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "common.h"

namespace idem::cli {
#if !defined(IDEM_WITH_PROXY)
namespace {

// `idem proxy` in a tool built without it (-DIDEM_BUILD_PROXY=OFF, as scripts/run.sh
// builds its own): whatever follows, the command says so and how to get it.
Command add_missing_proxy_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand(
      "proxy", "Not in this build (configured with -DIDEM_BUILD_PROXY=OFF): see docs/proxy.md");
  app->prefix_command();  // its arguments are not parsed: any of them gets the message below
  return Command{app, []() -> int {
                   print_error("proxy",
                               "this idem was built without `idem proxy` (configured with "
                               "-DIDEM_BUILD_PROXY=OFF, as scripts/run.sh builds its own); "
                               "build the tool with -DIDEM_BUILD_PROXY=ON, the default, for it");
                   return kExitUsage;
                 }};
}

}  // namespace
#endif

std::vector<Command> build_app(CLI::App& app, const std::string& version) {
  app.name("idem");
  app.description(
      "idem: run a command at most once per key, and inspect, purge and measure "
      "the store that remembers it.");
  app.set_version_flag("--version", version);
  app.require_subcommand(1);
  app.footer("Run `idem COMMAND --help` for a command's options. Documentation: docs/cli.md.");
  std::vector<Command> commands = {add_run_command(app), add_show_command(app),
                                   add_purge_command(app), add_forget_command(app),
                                   add_bench_command(app)};
#if defined(IDEM_WITH_PROXY)
  commands.push_back(add_proxy_command(app));
#endif
  for (const Command& command : commands) {
    // Left-over arguments are reported by main, in the order they were given (`idem run`
    // has none: everything from its command on belongs to the command).
    if (command.app->get_name() != "run") command.app->allow_extras();
  }
#if !defined(IDEM_WITH_PROXY)
  // After the loop: its arguments are its own (prefix_command), never reported as extras.
  commands.push_back(add_missing_proxy_command(app));
#endif
  return commands;
}

}  // namespace idem::cli
