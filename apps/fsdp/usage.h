#pragma once
// How the CLI reads and shows its arguments, beyond CLI11's defaults: one
// help layout for every command, a flag given where a value belongs named
// as such, and the closest command or flag for a mistyped one.

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

namespace fsdp::cli {

// Help with each default at the end of its description, "(default X)".
std::shared_ptr<CLI::Formatter> help_formatter();

// "--lr: expected a number, got the flag '--steps'" instead of CLI11's
// taking the flag as the value; for `command` and its subcommands.
void refuse_flags_as_values(CLI::App& command);

// "unknown command 'trian'; did you mean 'train'? (commands: ...)", or ""
// when the words before the first flag name existing commands.
std::string unknown_command(const CLI::App& app, int argc, char** argv);

// Prints "did you mean --steps?" for the flag CLI11's `message` complains
// about, when a flag of the chosen subcommand is close.
void suggest_option(const CLI::App& app, const std::string& message);

}  // namespace fsdp::cli
