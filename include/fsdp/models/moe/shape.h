#pragma once
// The memory formula of a routed feed-forward (models/shape.h), for every
// MoE family: added to the rest of its layer's.

#include "fsdp/models/moe/config.h"
#include "fsdp/models/shape.h"

namespace fsdp::models {

// `layer` (the attention and norms, no feed-forward) plus the router, the
// routed experts of hidden size `hidden` and a shared expert of width
// `shared_ffn` (0: none) over N tokens. One expert's rows are N * k / E at
// the expected (balanced) load, N at the worst (sizes.worst_expert_load).
BlockMemory add_routed_memory(BlockMemory layer, int64_t hidden, const MoEConfig& moe, int64_t shared_ffn,
                              const ActivationSizes& sizes);

}  // namespace fsdp::models
