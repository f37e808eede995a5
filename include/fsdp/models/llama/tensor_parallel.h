#pragma once
// Llama's tensor-parallel plan (Megatron-LM's, torchtitan's
// parallelize_llama without sequence parallelism yet): in every layer the
// attention's q, k and v projections and the MLP's gate and up are cut
// column-wise (each rank holds whole heads, and its share of the MLP's
// width), o and down row-wise, so each block costs one all-reduce forward
// and one backward per half. The embedding, the norms and the output
// head stay whole on every rank. Families that build Llama's attention
// (Llama 2/3, Mistral, Qwen3) share it.

#include <memory>

#include "fsdp/distributed/process_group.h"
#include "fsdp/models/llama/model.h"

namespace fsdp::models {

// Cuts `model` (materialised, before fully_shard) over `group`. Throws
// naming the count when the query heads, the key/value heads or the MLP's
// width do not divide by the group's size, and for a Mixture-of-Experts
// layer (experts are not cut yet).
void tensor_parallelize_llama(LlamaForCausalLMImpl& model, const std::shared_ptr<dist::ProcessGroup>& group);

}  // namespace fsdp::models
