#pragma once
// Training loops shared by the FSDP tests: one sharded (under fsdp launch,
// any world size) and one reference (this process alone, the whole global
// batch, plain LibTorch), fed the same global batches.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../distributed/dist_test_world.h"
#include "fsdp/common/error.h"
#include "fsdp/distributed/collectives.h"

#include "fsdp/core/fully_shard.h"
#include "fsdp/core/memory.h"
#include "fsdp/core/options.h"
#include "tiny_transformer.h"

namespace fsdp::testing {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct RunSpec {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  torch::ScalarType compute_dtype = torch::kFloat;  // bf16/fp16: mixed precision, fp32 reduce
  bool loss_scaling = false;       // fp16: ShardedGradScaler (reference: the same scale, by hand)
  int grad_accum = 1;              // micro-steps per optimizer step
  bool sync_each_micro_step = true;
  int prefetch_depth = 1;
  bool explicit_prefetch = false;  // each block prefetches the next (forward) / previous (backward)
  double weight_decay = 0.0;       // on matrices and embeddings; never on norms and biases
  double clip = 0.0;               // max grad norm, 0 for none
  int steps = 5;
  int64_t rows_per_rank = 2;       // micro-batch rows each rank reads per micro-step
  OffloadPolicy offload;           // FullyShardOptions::offload of every unit
  bool fused_adamw = false;        // optim::FusedAdamW instead of torch::optim::AdamW
  bool optimizer_offload = false;  // ... with its state on the host (FusedAdamW::set_state_offload)
};

// What a sharded run observed along the way.
struct ShardedRunLog {
  std::vector<double> grad_norms;          // clip_grad_norm_'s return, per step
  std::vector<int64_t> gathered_after_step;
  int64_t state_bytes_after_first_step = 0;  // params + grads + optimizer state on this rank
  std::vector<double> loss_scales;           // the scaler's scale after each step
  MemoryStats stats_after_first_step;        // memory_stats(model, optimizer) before the first zero_grad
  bool params_on_host = false;               // every parameter's storage a host buffer after the last step
  bool any_param_on_host = false;
};

TinyConfig tiny_config();
constexpr uint64_t kInitSeed = 1234;
constexpr double kLossScale = 1024.0;

// Tokens (rows, seq + 1) of the global batch of step `step`.
torch::Tensor global_batch(int step, int64_t rows);

// Shard group size for hybrid_shard at this world size (0: not run).
int hybrid_fsdp_size(int world);

// The test world's mesh for a strategy, made once per shape: every rank
// runs the tests in the same order.
std::shared_ptr<dist::DeviceMesh> mesh_for(ShardingStrategy strategy);

NamedTensors train_sharded(const RunSpec& spec, ShardedRunLog* log = nullptr);
NamedTensors train_reference(const RunSpec& spec, std::vector<double>* grad_norms = nullptr);

// ||a - b|| / ||b|| (L2) of each parameter, the worst over all.
double max_relative_difference(const NamedTensors& actual, const NamedTensors& expected, std::string* worst_name);

// Expects an fsdp::Error containing every needle, then proves with a
// barrier that no rank is stuck in a collective.
template <typename Fn>
void expect_error_on_every_rank(Fn&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
  dist::barrier(test_world().group());
}

}  // namespace fsdp::testing
