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

#include "fsdp/models/causal_lm.h"
#include "fsdp/models/llama4/config.h"
#include "fsdp/nn/layers.h"
#include "fsdp/core/module_holder.h"

namespace fsdp::models {

// B = batch, T = time, C = hidden, E = experts, I = expert width, hs = head size
struct Llama4AttentionImpl : torch::nn::Module {
  Llama4AttentionImpl(const Llama4Config& config, int64_t layer);
  // cos, sin: (T, hs / 2), one entry per rotated pair.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  int64_t n_heads, n_kv_heads, head_dim;
  bool rope, qk_norm, temperature_tuning;
  int64_t chunk;  // 0: attends to every earlier position
  double eps, floor_scale, attn_scale;
  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
FSDP_MODULE(Llama4Attention);

// The routed experts as Hugging Face stores them: gate_up_proj (E, C, 2I)
// holding each expert's gate and up projections side by side, down_proj
// (E, I, C); x @ W, not x @ W^T.
struct Llama4ExpertsImpl : torch::nn::Module {
  Llama4ExpertsImpl(int64_t experts, int64_t hidden, int64_t width);
  torch::Tensor gate_up_proj, down_proj;
};
TORCH_MODULE(Llama4Experts);

struct Llama4MoeImpl : torch::nn::Module {
  Llama4MoeImpl(const Llama4Config& config);
  // (..., C) -> (output, router statistics (2, E)) as SparseMoeBlock's
  // (moe/moe.h), for the load-balancing loss.
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x);
  int64_t top_k;
  nn::Linear router{nullptr};  // (E, C)
  Llama4Experts experts{nullptr};
  nn::SwiGLU shared_expert{nullptr};
};
FSDP_MODULE(Llama4Moe);

struct Llama4DecoderLayerImpl : torch::nn::Module {
  Llama4DecoderLayerImpl(const Llama4Config& config, int64_t index);
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& cos,
                                                   const torch::Tensor& sin);
  std::vector<torch::Tensor> forward_block(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  Llama4Attention self_attn{nullptr};
  nn::SwiGLU dense{nullptr};  // dense layers, registered as "feed_forward"
  Llama4Moe moe{nullptr};     // MoE layers, registered as "feed_forward" too
  nn::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  bool checkpoint_activations = false;
};
FSDP_MODULE(Llama4DecoderLayer);

struct Llama4TextModelImpl : torch::nn::Module {
  explicit Llama4TextModelImpl(const Llama4Config& config);
  nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<Llama4DecoderLayer> blocks;
  nn::RMSNorm norm{nullptr};
};
TORCH_MODULE(Llama4TextModel);

struct Llama4ForCausalLMImpl : CausalLMImpl {
  explicit Llama4ForCausalLMImpl(const Llama4Config& config);
  torch::Tensor forward(torch::Tensor tokens) override;
  torch::Tensor output_weight() override { return lm_head ? lm_head->weight : model->embed_tokens->weight; }
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override;
  std::vector<std::shared_ptr<torch::nn::Module>> wrap_candidates() override;
  void set_activation_checkpointing(bool enabled) override;
  std::string family() const override { return "llama4_text"; }
  int64_t vocab_size() const override { return config.text.vocab_size; }
  int64_t max_seq_len() const override { return config.text.max_position_embeddings; }
  int64_t dim() const override { return config.text.hidden_size; }
  int64_t n_layers() const override { return config.text.num_hidden_layers; }
  int64_t active_parameter_count() const override { return llama4_active_parameter_count(config); }
  torch::Tensor auxiliary_loss() override { return aux_loss_; }

  Llama4Config config;
  Llama4TextModel model{nullptr};
  nn::Linear lm_head{nullptr};  // null when tied

 private:
  torch::Tensor aux_loss_;
};

// Rotation of adjacent pairs (x[2i], x[2i+1]) by angle i, Hugging Face's
// complex form: x (B, T, heads, hs), cos/sin (T, hs / 2).
torch::Tensor apply_rotary_pairs(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace fsdp::models
