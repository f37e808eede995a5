#pragma once
// Causal scaled-dot-product attention shared by the model families.
//
// Heads come in token-major layout, (B, T, heads, hs), as the projections
// produce them, and the result is (B, T, nh * hs), ready for the output
// projection: no transposed copies on either side. On CPU in fp32 and bf16
// each (batch, head) pair runs as its own matmuls on strided views, by
// blocks of query rows, with one pass per row for the causal softmax and
// its backward (no mask tensor, the scale folded in) and attention dropout
// applied in the same block; backward recomputes each block's weights, so
// memory grows with T, not T^2 (nothing of the (T, T) square is kept). On a
// GPU it is LibTorch's scaled_dot_product_attention; elsewhere LibTorch's
// matmul, masked_fill and softmax.

#include <torch/torch.h>

namespace fsdp::models {

// q: (B, T, nh, hs); k, v: (B, T, nkv, hs), nh a multiple of nkv (grouped-
// query attention: query head h reads key/value head h / (nh / nkv)). Any
// strides. `dropout`, if given and active, applies to the attention weights.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               torch::nn::Dropout* dropout = nullptr);

// The same for one packed projection, qkv (B, T, 3 * nh * hs) holding q, k
// and v side by side (GPT-2's c_attn); its gradient is written as one
// tensor, with no split or concatenation.
torch::Tensor causal_attention_packed(const torch::Tensor& qkv, int64_t n_head,
                                      torch::nn::Dropout* dropout = nullptr);

}  // namespace fsdp::models
