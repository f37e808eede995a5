// fsdp: the command-line front end of fsdp.cpp.

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "usage.h"
#include "fsdp/common/error_text.h"
#include "fsdp/common/runtime.h"

namespace {

// Errors carry the rank so that interleaved output from many ranks stays readable.
void print_error(const std::string& message) {
  const char* rank = std::getenv("RANK");
  const bool prefixed_by_launcher = std::getenv("FSDP_LAUNCH_PREFIXES_LINES") != nullptr;
  if (rank != nullptr && !prefixed_by_launcher) {
    std::fprintf(stderr, "[rank %s] error: %s\n", rank, message.c_str());
  } else {
    std::fprintf(stderr, "error: %s\n", message.c_str());
  }
}

}  // namespace

// Usage errors (an unknown flag, a missing value, no subcommand) exit 2, as
// argparse, getopt-based tools and torchrun do; CLI11's own codes (106-114)
// would tell a script nothing. Bad values found later exit 1.
constexpr int kUsageError = 2;

int main(int argc, char** argv) {
  // Line by line even into a pipe (a launcher, a log collector): a rank's
  // lines arrive as they are written and in order with its stderr.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"fsdp.cpp: Fully Sharded Data Parallel training in C++"};
  app.formatter(fsdp::cli::help_formatter());  // before the subcommands, which copy it
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", [] { return fsdp::version_report(); },
                       "print fsdp.cpp's and LibTorch's versions, backends, BLAS and CUDA, and exit");
  int exit_code = 0;
  fsdp::cli::add_launch_command(app, exit_code);
  fsdp::cli::add_smoke_command(app, exit_code);
  fsdp::cli::add_bench_command(app, exit_code);
  fsdp::cli::add_data_command(app, exit_code);
  fsdp::cli::add_train_command(app, exit_code);
  fsdp::cli::add_generate_command(app, exit_code);
  fsdp::cli::add_ckpt_command(app, exit_code);
  fsdp::cli::add_plan_command(app, exit_code);
  fsdp::cli::refuse_flags_as_values(app);
  // `fsdp help [COMMAND...]`, as git and pip take it: that command's --help.
  std::vector<char*> args(argv, argv + argc);
  std::string help_flag = "--help";
  if (argc >= 2 && std::string(argv[1]) == "help") {
    args.erase(args.begin() + 1);
    args.push_back(help_flag.data());
    argc = static_cast<int>(args.size());
    argv = args.data();
  }
  if (const std::string unknown = fsdp::cli::unknown_command(app, argc, argv); !unknown.empty()) {
    print_error(unknown);
    return kUsageError;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError&) {
    // Ours, not CLI11's (which lists the stray words backwards): the first
    // one, and the closest option of the command.
    print_error(fsdp::cli::unexpected_argument(app));
    return kUsageError;
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" to CLI11 that exit 0.
    return app.exit(e) == 0 ? 0 : kUsageError;
  } catch (const std::exception& e) {
    print_error(fsdp::error_text(e));
    return 1;
  }
  if (app.get_subcommands().empty()) {
    std::fprintf(stderr, "%s", app.help().c_str());
    std::fprintf(stderr, "error: a subcommand is required\n");
    return kUsageError;
  }
  return exit_code;
}
