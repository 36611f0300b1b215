// The `idem` command-line tool (SPEC §12, docs/cli.md).

#include <fcntl.h>
#include <fmt/core.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "child.h"
#include "commands.h"
#include "common.h"
#include "idem/version.h"

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
  // Before any disposition changes: what was ignored at start stays ignored (child.h).
  note_signals_at_start();
  // A reader that goes away (`idem run ... | head -1`) must show up as EPIPE on our writes,
  // not end idem while it holds a lease. The child gets the default back (child.cpp).
  ::signal(SIGPIPE, SIG_IGN);

  CLI::App app;
  const std::vector<Command> commands = build_app(app, std::string("idem ") + idem::version());
  std::string names;
  for (const Command& command : commands) {
    names += (names.empty() ? "" : ", ") + command.app->get_name();
  }
  // The command's name, for messages: "idem run: ...".
  std::string name;
  if (argc > 1 && argv[1][0] != '-') {
    name = argv[1];
    auto known = [&](const Command& c) { return c.app->get_name() == name; };
    if (std::none_of(commands.begin(), commands.end(), known)) {
      print_error("", fmt::format("unknown command '{}' (commands: {}; see idem --help)",
                                  printable(name), names));
      return kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out;
    std::ostringstream err;
    if (e.get_exit_code() == 0) {
      // --help and --version print on standard output and exit 0, if that output can be
      // written.
      (void)app.exit(e, out, err);
      try {
        write_stdout(out.str());
      } catch (const OutputError& output) {
        return report_error(name, output);
      }
      return kExitOk;
    }
    if (name.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      print_error("", fmt::format("a command is required ({}; see idem --help)", names));
    } else {
      print_error(name,
                  fmt::format("{} (see idem {}--help)", e.what(), name.empty() ? "" : name + " "));
    }
    return kExitUsage;
  }
  for (const Command& command : commands) {
    if (!command.app->parsed()) continue;
    std::vector<std::string> extra;
    if (command.app->get_allow_extras()) extra = command.app->remaining();
    if (!extra.empty()) {
      std::string list;
      for (const std::string& arg : extra)
        list += (list.empty() ? "'" : " '") + printable(arg) + "'";
      print_error(name, fmt::format("unexpected argument{} {} (see idem {} --help)",
                                    extra.size() == 1 ? "" : "s", list, name));
      return kExitUsage;
    }
    try {
      return command.run();
    } catch (const std::exception& e) {
      return report_error(command.app->get_name(), e);
    }
  }
  return kExitUsage;
}
