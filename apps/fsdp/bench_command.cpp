// `fsdp bench comm`: collective bandwidth across sizes, nccl-tests style.
// `fsdp bench step`: the cost of FSDP on a step of the example transformer.
// `fsdp bench matmul`: the GEMM rate at a training job's own shapes.
// `fsdp bench kernels`: our CPU kernels against LibTorch's operators.

#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "dist_flags.h"
#include "fsdp/bench/comm_bench.h"
#include "fsdp/bench/kernel_bench.h"
#include "fsdp/bench/matmul_bench.h"
#include "fsdp/common/error.h"
#include "fsdp/common/runtime.h"
#include "fsdp/plan/model_shape.h"
#include "train_flags.h"
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

  auto matmul_flags = std::make_shared<TrainFlags>();
  auto matmul_seconds = std::make_shared<double>(0.3);
  auto matmul_json = std::make_shared<bool>(false);
  auto matmul_dtypes = std::make_shared<std::vector<std::string>>();
  auto* matmul = bench->add_subcommand(
      "matmul",
      "time every matmul shape of a training job's step (fsdp train's flags): the sustained GEMM rate and the "
      "step's matmul-limited time");
  add_train_flags(matmul, *matmul_flags);
  matmul->add_option("--seconds", *matmul_seconds, "timing per product (default 0.3)")->check(CLI::Range(0.01, 60.0));
  matmul->add_option("--dtypes", *matmul_dtypes, "fp32, bf16 or both (default: the job's --precision)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fp32", "bf16"}));
  matmul->add_flag("--json", *matmul_json, "one JSON object per dtype");
  matmul->callback([matmul_flags, matmul_seconds, matmul_json, matmul_dtypes, &exit_code] {
    const train::TrainConfig job = resolve(*matmul_flags);
    FSDP_CHECK(job.runtime.precision != train::Precision::kFp16,
               "bench matmul: --precision fp16 is not timed; use --dtypes fp32,bf16");
    init_runtime();  // the trainer's threads and allocator
    const auto shape = plan::model_shape(job);
    const auto gemms = bench::step_gemms(shape, job.data.batch_size, job.data.seq_len,
                                         job.model.activation_checkpoint);
    std::vector<std::string> dtypes = *matmul_dtypes;
    if (dtypes.empty()) dtypes.push_back(job.runtime.precision == train::Precision::kBf16 ? "bf16" : "fp32");
    for (const auto& name : dtypes) {
      const auto result =
          bench::run_matmul_bench(gemms, name == "bf16" ? at::kBFloat16 : at::kFloat, *matmul_seconds);
      if (*matmul_json) {
        std::cout << bench::matmul_bench_json(result).dump() << "\n";
      } else {
        bench::print_matmul_bench(result, std::cout);
      }
    }
    exit_code = 0;
  });

  auto kernel_flags = std::make_shared<TrainFlags>();
  auto kernel_seconds = std::make_shared<double>(1.0);
  auto* kernels = bench->add_subcommand(
      "kernels",
      "time this project's attention and AdamW against LibTorch's scaled_dot_product_attention and "
      "_fused_adamw_ at a training job's shapes (fsdp train's flags)");
  add_train_flags(kernels, *kernel_flags);
  kernels->add_option("--seconds", *kernel_seconds, "timing per kernel and side (default 1)")
      ->check(CLI::Range(0.01, 60.0));
  kernels->callback([kernel_flags, kernel_seconds, &exit_code] {
    const train::TrainConfig job = resolve(*kernel_flags);
    init_runtime();
    const auto shape = plan::model_shape(job);
    bench::print_kernel_bench(bench::run_kernel_bench(shape, job.data.batch_size, job.data.seq_len, *kernel_seconds),
                              std::cout);
    exit_code = 0;
  });
}

}  // namespace fsdp::cli
