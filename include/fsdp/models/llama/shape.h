#pragma once
// The Llama decoder's shapes and memory formula (models/shape.h), for the
// families built on it: Llama, Mistral, Qwen3 and Qwen3-MoE; Llama 4
// starts from it.

#include "fsdp/models/llama/config.h"
#include "fsdp/models/shape.h"

namespace fsdp::models {

// Sizes, projections and the memory formula of every layer, dense and sparse.
ModelShape llama_shape(const LlamaConfig& config);

// The norm a layer applies to each query and key head: none, Qwen3's
// RMSNorm, or Llama 4's weightless L2 norm.
enum class QkNorm { kNone, kRms, kL2 };

// What a dense layer keeps: the attention with its q/k norm and a SwiGLU
// of width `ffn` (0: none, for a routed layer's formula to add to).
BlockMemory llama_dense_block_memory(const LlamaConfig& config, int64_t ffn, const ActivationSizes& sizes,
                                     QkNorm qk_norm);

}  // namespace fsdp::models
