#pragma once
// `fsdp bench step`: the cost of FSDP on one training step. At W=1 it
// interleaves an unsharded step and a sharded step of the same model (A B A
// B ...) so machine drift cancels, and reports medians and the overhead.

#include <ostream>
#include <string>

#include "fsdp/core/options.h"
#include "fsdp/distributed/process_group.h"

namespace fsdp::bench {

struct StepBenchOptions {
  int64_t vocab_size = 50257;
  int64_t dim = 384;
  int64_t n_layers = 6;
  int64_t n_heads = 6;
  int64_t seq_len = 256;
  int64_t batch_size = 4;
  int warmup = 2;
  int iters = 6;
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
};

struct StepBenchResult {
  double sharded_median_s = 0, sharded_min_s = 0, sharded_max_s = 0;
  double unsharded_median_s = 0, unsharded_min_s = 0, unsharded_max_s = 0;  // W=1 only
  double tokens_per_s = 0;  // sharded, all ranks together
};

StepBenchResult run_step_bench(const std::shared_ptr<dist::World>& world, const StepBenchOptions& options,
                               std::ostream* out);

}  // namespace fsdp::bench
