#pragma once
// The Llama-style decoder with the architecture and parameter names of
// Hugging Face's LlamaForCausalLM (model.embed_tokens, model.layers.0.
// self_attn.q_proj, ..., lm_head): RMSNorm, rotary position embeddings in
// the rotate-half convention (Llama 3.1's rope scaling optional), SwiGLU,
// grouped-query attention, a tied or untied output head. With qk_norm it
// is Qwen3 (self_attn.q_norm / k_norm), and with MoE options Qwen3-MoE
// (mlp.gate, mlp.experts.N.*): the Qwen3 families build this class.

#include <string>
#include <utility>
#include <vector>

#include "fsdp/models/causal_lm.h"
#include "fsdp/models/llama/config.h"
#include "fsdp/models/moe/moe.h"
#include "fsdp/nn/layers.h"
#include "fsdp/core/module_holder.h"

namespace fsdp::models {

// B = batch, T = time, C = hidden, nh / nkv = query / key-value heads, hs = head size
struct LlamaAttentionImpl : torch::nn::Module {
  explicit LlamaAttentionImpl(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  int64_t n_heads, n_kv_heads, head_dim;
  // Set by the model for a forward with a key/value cache: this layer's place in it.
  KvCache* cache = nullptr;
  size_t layer = 0;
  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  nn::RMSNorm q_norm{nullptr}, k_norm{nullptr};  // Qwen3 only
  torch::nn::Dropout dropout{nullptr};
};
FSDP_MODULE(LlamaAttention);

struct LlamaDecoderLayerImpl : torch::nn::Module {
  LlamaDecoderLayerImpl(const LlamaConfig& config, int64_t index);
  // (B, T, C) -> (B, T, C) and, for a sparse layer, its router statistics
  // (SparseMoeBlock); cos/sin: (T, hs) rotary tables.
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& cos,
                                                   const torch::Tensor& sin);
  std::vector<torch::Tensor> forward_block(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  LlamaAttention self_attn{nullptr};
  nn::SwiGLU mlp{nullptr};           // dense layers
  SparseMoeBlock sparse_mlp{nullptr};  // sparse layers, registered as "mlp" too
  nn::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  bool checkpoint_activations = false;
};
FSDP_MODULE(LlamaDecoderLayer);

struct LlamaModelImpl : torch::nn::Module {
  explicit LlamaModelImpl(const LlamaConfig& config);
  nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<LlamaDecoderLayer> blocks;
  nn::RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

struct LlamaForCausalLMImpl : CausalLMImpl {
  explicit LlamaForCausalLMImpl(const LlamaConfig& config);
  torch::Tensor forward(torch::Tensor tokens) override;
  torch::Tensor output_weight() override { return lm_head ? lm_head->weight : model->embed_tokens->weight; }
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override;
  std::vector<std::shared_ptr<torch::nn::Module>> wrap_candidates() override;
  void set_activation_checkpointing(bool enabled) override;
  std::string family() const override { return config.family; }
  int64_t vocab_size() const override { return config.vocab_size; }
  int64_t max_seq_len() const override { return config.max_position_embeddings; }
  int64_t dim() const override { return config.hidden_size; }
  int64_t n_layers() const override { return config.num_hidden_layers; }
  bool supports_kv_cache() const override { return true; }
  int64_t active_parameter_count() const override { return llama_active_parameter_count(config); }
  torch::Tensor auxiliary_loss() override { return aux_loss_; }

  LlamaConfig config;
  LlamaModel model{nullptr};
  nn::Linear lm_head{nullptr};  // null when tied to the embedding

 private:
  torch::Tensor aux_loss_;
};

// The rotary inverse frequencies theta^(-2i/hs), i < hs/2, with Llama 3.1's
// scaling applied when `scaling.rope_type` is "llama3".
torch::Tensor rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling = {});
// Rotary tables for positions [0, T): cos and sin, (T, head_dim), in the
// rotate-half layout (each frequency twice: first half, then second half).
std::pair<torch::Tensor, torch::Tensor> rotary_tables(int64_t T, int64_t head_dim, double theta,
                                                      const RopeScaling& scaling = {});
// x * cos + rotate_half(x) * sin, with rotate_half(x) = cat(-x2, x1).
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace fsdp::models
