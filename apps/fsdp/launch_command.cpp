#include "commands.h"

#include <chrono>
#include <cstdlib>

#include "fsdp/launch/job_store.h"
#include "fsdp/launch/launcher.h"

namespace fsdp::cli {

void add_launch_command(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<launch::LaunchOptions>();
  auto* cmd = app.add_subcommand("launch", "run a command once per rank on this machine (like torchrun --no-python)");
  // torchrun's spellings too (--nproc_per_node, --node_rank, ...), so a
  // torchrun command line ports by swapping the command.
  options->nproc_per_node = 1;
  cmd->add_option("-n,--nproc-per-node,--nproc_per_node", options->nproc_per_node, "ranks to start on this node")
      ->capture_default_str();
  auto* nnodes = cmd->add_option("--nnodes", options->nnodes, "nodes in the job (each runs its own `fsdp launch`)")
                     ->capture_default_str();
  auto* node_rank = cmd->add_option("--node-rank,--node_rank", options->node_rank, "this node's index, 0..nnodes-1");
  cmd->add_option("--master-addr,--master_addr", options->master_addr, "host of rank 0 (default 127.0.0.1)");
  cmd->add_option("--master-port,--master_port", options->master_port,
                  "rendezvous port (default: a free port; fixed for multi-node)");
  // A const std::string description: under C++20 (LibTorch 2.14) CLI11
  // finds a string literal ambiguous between a description and a variable.
  const std::string standalone_help = "one node, rendezvous on a free local port (torchrun's --standalone)";
  auto* standalone = cmd->add_flag("--standalone", standalone_help);
  standalone->excludes(nnodes)->excludes(node_rank);
  cmd->add_option("--threads-per-rank", options->threads_per_rank,
                  "intra-op threads per rank (default: cores / ranks; OMP_NUM_THREADS wins if set)");
  cmd->add_option("--stop-grace", options->stop_grace_s,
                  "seconds between SIGTERM and SIGKILL when stopping ranks (default 30)");
  cmd->add_option("--max-restarts,--max_restarts", options->max_restarts,
                  "restart every rank this many times after one fails; they resume from their checkpoints (default 0)");
  options->open_job_store = [](const std::string& addr, int port, bool serve, int) {
    const char* t = std::getenv("FSDP_TIMEOUT");
    const double seconds = t != nullptr && std::atof(t) > 0 ? std::atof(t) : 300.0;
    return launch::open_tcp_job_store(addr, port, serve, std::chrono::milliseconds(static_cast<long>(seconds * 1000)));
  };
  cmd->add_flag("--no-prefix{false}", options->prefix_output, "do not prefix output lines with the rank");
  cmd->add_option("command", options->command, "the program and its arguments (after --)")->required();
  cmd->positionals_at_end();
  cmd->callback([options, node_rank, &exit_code] {
    if (options->nnodes > 1 && node_rank->count() == 0) {
      // A usage error (exit 2): every node would otherwise claim to be node 0.
      throw CLI::ValidationError("--nnodes " + std::to_string(options->nnodes) +
                                 " needs --node-rank (this node's index, 0.." + std::to_string(options->nnodes - 1) +
                                 ") on every node");
    }
    exit_code = launch::run(*options);
  });
}

}  // namespace fsdp::cli
