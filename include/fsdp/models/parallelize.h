#pragma once
// Applying parallelism to a single-device model, in torchtitan's fixed
// order: activation checkpointing on each block, then FSDP on the units the
// wrap policy picks (children before parents), then FSDP on the root.

#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/options.h"
#include "fsdp/models/causal_lm.h"
#include "fsdp/models/wrap_policy.h"

namespace fsdp::models {

struct ParallelizeOptions {
  // `fsdp` applies to every unit; its reshard_after_forward to every unit
  // but the root, whose backward starts right after its forward (FSDP2's
  // root keeps its parameters too).
  bool activation_checkpoint = false;
  bool explicit_prefetch = false;  // each block prefetches its neighbour instead of the implicit order
  WrapPolicy wrap;
  FullyShardOptions fsdp;
};

// The units made, in the order they were sharded (the root last, named
// ""), each with the parameters it holds.
std::vector<std::pair<std::string, int64_t>> parallelize(CausalLMImpl& model, const ParallelizeOptions& options);

}  // namespace fsdp::models
