// `fsdp bench comm`: collective bandwidth across sizes, nccl-tests style.

#include <iostream>

#include "commands.h"
#include "dist_flags.h"
#include "fsdp/bench/comm_bench.h"
#include "fsdp/bench/step_bench.h"

namespace fsdp::cli {

void add_bench_command(CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto flags = std::make_shared<DistFlags>();
  auto options = std::make_shared<bench::CommBenchOptions>();
  auto* comm = bench->add_subcommand("comm", "time collectives across message sizes (nccl-tests format)");
  flags->add_to(*comm);
  comm->add_option("-b,--min-bytes", options->min_bytes, "smallest message in bytes (default 1024)");
  comm->add_option("-e,--max-bytes", options->max_bytes, "largest message in bytes (default 64 MiB)");
  comm->add_option("-f,--factor", options->factor, "size multiplier between rows (default 4)");
  comm->add_option("-w,--warmup", options->warmup, "untimed iterations per size (default 3)");
  comm->add_option("-i,--iters", options->iters, "timed iterations per size (default 10)");
  comm->add_option("--ops", options->ops, "collectives to time (default: all_gather reduce_scatter all_reduce broadcast)")
      ->delimiter(',');
  comm->add_option("--dtype", options->dtype, "float or bfloat16 (default float)");
  comm->callback([flags, options, &exit_code] {
    const auto world = flags->init_world();
    bench::run_comm_bench(world->group(), *options, &std::cout);
    exit_code = 0;
  });

  auto step_flags = std::make_shared<DistFlags>();
  auto step = std::make_shared<bench::StepBenchOptions>();
  auto strategy = std::make_shared<std::string>("full_shard");
  auto* step_cmd = bench->add_subcommand(
      "step", "time training steps of the example transformer; at W=1 also unsharded, interleaved");
  step_flags->add_to(*step_cmd);
  step_cmd->add_option("--vocab", step->vocab_size, "vocabulary size (default 50257)");
  step_cmd->add_option("--dim", step->dim, "model width (default 384)");
  step_cmd->add_option("--layers", step->n_layers, "blocks (default 6)");
  step_cmd->add_option("--heads", step->n_heads, "attention heads (default 6)");
  step_cmd->add_option("--seq-len", step->seq_len, "sequence length (default 256)");
  step_cmd->add_option("--batch-size", step->batch_size, "sequences per rank (default 4)");
  step_cmd->add_option("-w,--warmup", step->warmup, "untimed steps (default 2)");
  step_cmd->add_option("-i,--iters", step->iters, "timed steps (default 6)");
  step_cmd->add_option("--sharding", *strategy, "full_shard, shard_grad_op, no_shard or hybrid_shard");
  step_cmd->callback([step_flags, step, strategy, &exit_code] {
    step->strategy = parse_sharding_strategy(*strategy);
    const auto world = step_flags->init_world();
    bench::run_step_bench(world, *step, &std::cout);
    exit_code = 0;
  });
}

}  // namespace fsdp::cli
