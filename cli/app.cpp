// The `idem` command line as a whole, apart from main(), so a test or fuzzer can parse
// arguments exactly as the tool does without running anything.

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "commands.h"

namespace idem::cli {

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
  return commands;
}

}  // namespace idem::cli
