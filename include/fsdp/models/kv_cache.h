#pragma once
// Keys and values of the tokens a model has already seen, for generation:
// each new token then runs the model on itself alone, attending to the
// cached keys and values, instead of running the whole text again
// (transformers' DynamicCache). Inference only: no gradients flow through.
//
// A model that supports it (CausalLMImpl::supports_kv_cache) reads
// `kv_cache` in its forward: positions start at `length`, each attention
// layer stores its new keys and values in its Layer and attends to all of
// them. The caller advances `length` after each forward.

#include <utility>
#include <vector>

#include <torch/torch.h>

namespace fsdp::models {

struct KvCache {
  struct Layer {
    torch::Tensor keys, values;  // (B, capacity, nkv, hs), filled up to the cache's length
  };
  int64_t length = 0;    // tokens already cached
  int64_t capacity = 0;  // tokens it can hold: the model's positions
  std::vector<Layer> layers;

  Layer& layer(size_t index);
  // Stores `k` and `v` (B, T, nkv, hs) of the tokens after `length` in
  // `layer` and returns that layer's keys and values of every token so far,
  // (B, length + T, nkv, hs).
  std::pair<torch::Tensor, torch::Tensor> append(size_t layer, const torch::Tensor& k, const torch::Tensor& v);
};

// q: (B, Tn, nh, hs), the newest Tn tokens; k, v: (B, Tt, nkv, hs), every
// token so far (Tt >= Tn), nh a multiple of nkv. Query i sits at position
// Tt - Tn + i and sees keys up to there. Returns (B, Tn, nh * hs), as
// causal_attention does (which it is, when Tn == Tt).
torch::Tensor cached_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

}  // namespace fsdp::models
