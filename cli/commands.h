#pragma once

// The subcommands of `idem`. Each cmd_<name>.cpp registers its options on the parent app
// and returns what to do when that subcommand was chosen.

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace idem::cli {

struct Command {
  CLI::App* app = nullptr;
  // Runs the subcommand after parsing and returns the exit status. May throw; main turns
  // the exception into a message and an exit status (report_error).
  std::function<int()> run;
};

// Makes `app` the `idem` tool: its name, description, --version (printing `version`) and
// every command with its options. Parsing with it has no side effects: nothing runs until
// main calls the chosen command's `run` (fuzz/fuzz_cli_args.cpp relies on that).
std::vector<Command> build_app(CLI::App& app, const std::string& version);

Command add_run_command(CLI::App& parent);
Command add_show_command(CLI::App& parent);
Command add_purge_command(CLI::App& parent);
Command add_forget_command(CLI::App& parent);
Command add_bench_command(CLI::App& parent);
Command add_proxy_command(CLI::App& parent);

// The option every command takes to name its store (choose_store explains the default).
CLI::Option* add_store_option(CLI::App& app, std::string& url);
// --scope, with the default "default".
CLI::Option* add_scope_option(CLI::App& app, std::string& scope);

// The name under which records are kept when --scope is not given.
inline constexpr const char* kDefaultScope = "default";

}  // namespace idem::cli
