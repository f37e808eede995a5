#include "fsdp/models/parallelize.h"

#include "fsdp/core/fully_shard.h"

namespace fsdp::models {

void parallelize(CausalLMImpl& model, const ParallelizeOptions& options) {
  model.set_activation_checkpointing(options.activation_checkpoint);
  const auto blocks = model.blocks();
  for (const auto& block : blocks) fully_shard(*block, options.fsdp);
  fully_shard(model, options.fsdp);
  if (options.explicit_prefetch) {
    // The example trainer's --explicit-prefetch: block i gathers block i+1
    // in forward and block i-1 in backward.
    for (size_t i = 0; i + 1 < blocks.size(); ++i) set_modules_to_forward_prefetch(*blocks[i], {blocks[i + 1].get()});
    for (size_t i = 1; i < blocks.size(); ++i) set_modules_to_backward_prefetch(*blocks[i], {blocks[i - 1].get()});
  }
}

}  // namespace fsdp::models
