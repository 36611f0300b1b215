// The `idem` command-line tool (SPEC §12, docs/cli.md).

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <vector>

#include "commands.h"
#include "common.h"

#ifndef IDEM_VERSION
#error "IDEM_VERSION is set by cli/CMakeLists.txt"
#endif

namespace {

// Makes sure descriptors 0, 1 and 2 are open, so a pipe or a store file never lands on one
// of them and gets mixed up with the child's output or our messages.
void open_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1) {
      int null_fd = ::open("/dev/null", O_RDWR);
      if (null_fd >= 0 && null_fd != fd) ::close(null_fd);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace idem::cli;
  open_standard_descriptors();
  // A reader that goes away (`idem run ... | head -1`) must show up as EPIPE on our writes,
  // not end idem while it holds a lease. The child gets the default back (child.cpp).
  ::signal(SIGPIPE, SIG_IGN);

  CLI::App app{
      "idem: run a command at most once per key, and inspect, purge and measure "
      "the store that remembers it.",
      "idem"};
  app.set_version_flag("--version", "idem " IDEM_VERSION);
  app.require_subcommand(1);
  app.footer("Run `idem COMMAND --help` for a command's options. Documentation: docs/cli.md.");
  std::vector<Command> commands = {add_run_command(app), add_show_command(app),
                                   add_purge_command(app), add_forget_command(app),
                                   add_bench_command(app)};
  commands.push_back(add_proxy_command(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help and --version print and exit 0; every parse error is a usage error (EX_USAGE).
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  for (const Command& command : commands) {
    if (!command.app->parsed()) continue;
    try {
      return command.run();
    } catch (const std::exception& e) {
      return report_error(command.app->get_name(), e);
    }
  }
  return kExitUsage;
}
