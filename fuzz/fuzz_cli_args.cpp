// Fuzzes the `idem` argument parser: the CLI11 app that main() builds (build_app, every
// command and option), parsing an argument vector made from the input (arguments split at
// NUL bytes). Parsing runs no command, opens no store and starts no process; this checks
// that no argument vector crashes the parser or throws anything but a CLI11 parse error,
// and that at most one command is chosen.

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> args = {"idem"};
  std::size_t start = 0;
  while (start <= text.size() && args.size() < 64) {
    const std::size_t nul = text.find('\0', start);
    args.emplace_back(text.substr(start, nul == std::string_view::npos ? nul : nul - start));
    if (nul == std::string_view::npos) break;
    start = nul + 1;
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  CLI::App app;
  const std::vector<idem::cli::Command> commands = idem::cli::build_app(app, "idem fuzz");
  try {
    app.parse(static_cast<int>(args.size()), argv.data());
  } catch (const CLI::ParseError&) {
    return 0;
  }
  int chosen = 0;
  for (const idem::cli::Command& command : commands) {
    if (!command.app->parsed()) continue;
    ++chosen;
    if (command.app->get_allow_extras()) (void)command.app->remaining();
  }
  if (chosen != 1) {
    std::fprintf(stderr, "fuzz_cli_args: %d commands chosen after a successful parse\n", chosen);
    std::abort();
  }
  return 0;
}
