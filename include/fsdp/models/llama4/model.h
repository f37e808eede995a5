#pragma once
// Llama 4's text model with Hugging Face's parameter names
// (model.layers.0.self_attn.q_proj, model.layers.0.feed_forward.experts.
// gate_up_proj, ..., lm_head). What differs from Llama 3 (llama/model.h):
// rotary positions rotate adjacent pairs (the complex form), some layers
// have none (NoPE) and scale their queries by position instead, RoPE layers
// attend within fixed chunks and L2-normalise q and k, and the feed-forward
// of the MoE layers is a shared expert plus top-k routed experts whose
// sigmoid router scores scale each token's input, the experts stored fused.

#include <torch/torch.h>

#include "fsdp/models/common/decoder.h"
#include "fsdp/models/llama4/config.h"

namespace fsdp::models {

// B = batch, T = time, C = hidden, E = experts, I = expert width, hs = head size
struct Llama4AttentionImpl : DecoderAttentionImpl {
  Llama4AttentionImpl(const Llama4Config& config, int64_t layer);
  // cos, sin: (T, hs / 2), one entry per rotated pair.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) override;
  int64_t n_heads, n_kv_heads, head_dim;
  bool rope, qk_norm, temperature_tuning;
  int64_t chunk;  // 0: attends to every earlier position
  double eps, floor_scale, attn_scale;
  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};

// The routed experts as Hugging Face stores them: gate_up_proj (E, C, 2I)
// holding each expert's gate and up projections side by side, down_proj
// (E, I, C); x @ W, not x @ W^T.
struct Llama4ExpertsImpl : torch::nn::Module {
  Llama4ExpertsImpl(int64_t experts, int64_t hidden, int64_t width);
  torch::Tensor gate_up_proj, down_proj;
};
TORCH_MODULE(Llama4Experts);

struct Llama4MoeImpl : RoutedFeedForwardImpl {
  explicit Llama4MoeImpl(const Llama4Config& config);
  // (..., C) -> (output, router statistics (2, E)) as SparseMoeBlock's
  // (moe/moe.h), for the load-balancing loss.
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) override;
  int64_t top_k;
  nn::Linear router{nullptr};  // (E, C)
  Llama4Experts experts{nullptr};
  nn::SwiGLU shared_expert{nullptr};
};
FSDP_MODULE(Llama4Moe);

// The shared decoder (common/decoder.h) with Llama 4's attention and
// feed-forward, registered as "feed_forward".
struct Llama4ForCausalLMImpl : DecoderLMImpl {
  explicit Llama4ForCausalLMImpl(const Llama4Config& config);
  int64_t active_parameter_count() const override { return llama4_active_parameter_count(config); }

  Llama4Config config;

 protected:
  // cos, sin: (T, hs / 2).
  std::pair<torch::Tensor, torch::Tensor> position_tables(int64_t past, int64_t T,
                                                          const torch::Device& device) const override;
};

// Rotation of adjacent pairs (x[2i], x[2i+1]) by angle i, Hugging Face's
// complex form: x (B, T, heads, hs), cos/sin (T, hs / 2).
torch::Tensor apply_rotary_pairs(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace fsdp::models
