#pragma once
// Causal scaled-dot-product attention shared by the model families.

#include <torch/torch.h>

namespace fsdp::models {

// q, k, v: (B, nh, T, hs) -> (B, nh, T, hs), each position attending to
// itself and earlier ones; `dropout`, if given, applies to the attention weights.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               torch::nn::Dropout* dropout = nullptr);

}  // namespace fsdp::models
