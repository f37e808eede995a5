#pragma once
// Subcommands of the `fsdp` CLI. Each adds itself to the app and, when
// chosen, runs and stores the process exit code in `exit_code`.

#include <CLI/CLI.hpp>

namespace fsdp::cli {

void add_launch_command(CLI::App& app, int& exit_code);
void add_smoke_command(CLI::App& app, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);
void add_data_command(CLI::App& app, int& exit_code);
void add_train_command(CLI::App& app, int& exit_code);
void add_generate_command(CLI::App& app, int& exit_code);
void add_ckpt_command(CLI::App& app, int& exit_code);
void add_plan_command(CLI::App& app, int& exit_code);

}  // namespace fsdp::cli
