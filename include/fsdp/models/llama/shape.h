#pragma once
// The Llama decoder's shapes and memory formula (models/shape.h), for the
// families built on it: Llama, Qwen3 and Qwen3-MoE; Llama 4 starts from it.

#include "fsdp/models/llama/config.h"
#include "fsdp/models/shape.h"

namespace fsdp::models {

// Sizes, projections and the memory formula of every layer, dense and sparse.
ModelShape llama_shape(const LlamaConfig& config);

// What a dense layer keeps: the attention (q/k norms included) and a
// SwiGLU of width `ffn`.
BlockMemory llama_dense_block_memory(const LlamaConfig& config, int64_t ffn, const ActivationSizes& sizes);

}  // namespace fsdp::models
