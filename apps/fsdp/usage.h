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

// After CLI11's ExtrasError: "unknown option '--stpes' for 'fsdp train';
// did you mean '--steps'? (`fsdp train --help` lists its options)", or
// the first word nothing took.
std::string unexpected_argument(const CLI::App& app);

}  // namespace fsdp::cli
