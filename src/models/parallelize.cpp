#include "fsdp/models/parallelize.h"

#include <map>

#include "fsdp/core/fully_shard.h"

namespace fsdp::models {

void parallelize(CausalLMImpl& model, const ParallelizeOptions& options) {
  model.set_activation_checkpointing(options.activation_checkpoint);
  const auto blocks = model.blocks();
  // fully_shard names a block's parameters from the block; param_init wants
  // names from the model ("transformer.h.3.attn.c_attn.weight").
  std::map<const torch::nn::Module*, std::string> prefix;
  for (const auto& item : model.named_modules()) prefix[item.value().get()] = item.key();
  for (const auto& block : blocks) {
    FullyShardOptions block_options = options.fsdp;
    if (options.fsdp.param_init) {
      block_options.param_init = [init = options.fsdp.param_init, p = prefix.at(block.get())](
                                     const std::string& name, at::Tensor& full) { init(p + "." + name, full); };
    }
    fully_shard(*block, block_options);
  }
  fully_shard(model, options.fsdp);
  if (options.explicit_prefetch) {
    // The example trainer's --explicit-prefetch: block i gathers block i+1
    // in forward and block i-1 in backward.
    for (size_t i = 0; i + 1 < blocks.size(); ++i) set_modules_to_forward_prefetch(*blocks[i], {blocks[i + 1].get()});
    for (size_t i = 1; i < blocks.size(); ++i) set_modules_to_backward_prefetch(*blocks[i], {blocks[i - 1].get()});
  }
}

}  // namespace fsdp::models
