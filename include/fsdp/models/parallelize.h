#pragma once
// Applying parallelism to a single-device model, in torchtitan's fixed
// order: activation checkpointing on each block, then FSDP on each block,
// then FSDP on the root.

#include "fsdp/core/options.h"
#include "fsdp/models/causal_lm.h"

namespace fsdp::models {

struct ParallelizeOptions {
  bool activation_checkpoint = false;
  bool explicit_prefetch = false;  // each block prefetches its neighbour instead of the implicit order
  FullyShardOptions fsdp;
};

void parallelize(CausalLMImpl& model, const ParallelizeOptions& options);

}  // namespace fsdp::models
