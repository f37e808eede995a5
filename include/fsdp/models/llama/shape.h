#pragma once
// The Llama decoder's shapes and memory formula (models/shape.h), for the
// families built on it: Llama, Mistral, Qwen3 and Qwen3-MoE; Llama 4
// starts from it.

#include <string>
#include <vector>

#include "fsdp/models/llama/config.h"
#include "fsdp/models/shape.h"

namespace fsdp::models {

// Sizes, projections and the memory formula of every layer, dense and sparse.
ModelShape llama_shape(const LlamaConfig& config);

// q, k, v and the attention's output projection.
std::vector<Projection> llama_attention_projections(const LlamaConfig& config);
// A SwiGLU's gate, up and down projections of width `ffn`, named after
// `prefix`, in `layers` layers (0: every one), `per_layer` of them sharing
// `slots` rows per token (Projection, models/shape.h).
void add_swiglu_projections(std::vector<Projection>& out, const std::string& prefix, int64_t hidden, int64_t ffn,
                            int64_t layers, int64_t per_layer = 1, int64_t slots = 1);

// The norm a layer applies to each query and key head: none, Qwen3's
// RMSNorm, or Llama 4's weightless L2 norm.
enum class QkNorm { kNone, kRms, kL2 };

// What a dense layer keeps: the attention with its q/k norm and a SwiGLU
// of width `ffn` (0: none, for a routed layer's formula to add to).
BlockMemory llama_dense_block_memory(const LlamaConfig& config, int64_t ffn, const ActivationSizes& sizes,
                                     QkNorm qk_norm);

}  // namespace fsdp::models
