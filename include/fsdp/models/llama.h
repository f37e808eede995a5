#pragma once
// Llama-3-style decoder with the architecture and parameter names of
// Hugging Face's LlamaForCausalLM (model.embed_tokens, model.layers.0.
// self_attn.q_proj, ..., lm_head): RMSNorm, rotary position embeddings in
// the rotate-half convention, SwiGLU, grouped-query attention, an untied
// output head.

#include <string>

#include "fsdp/models/causal_lm.h"
#include "fsdp/nn/layers.h"

namespace fsdp::models {

struct LlamaConfig {
  int64_t vocab_size = 128256;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 14336;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 8;
  int64_t max_position_embeddings = 8192;
  double rms_norm_eps = 1e-5;
  double rope_theta = 500000.0;
  double attention_dropout = 0.0;
};

// llama-tiny (tests), llama3-1b, llama3-3b, llama3-8b (untied heads).
LlamaConfig llama_preset(const std::string& name);
bool is_llama_preset(const std::string& name);
// Parameter count from the configuration alone (no allocation).
int64_t llama_parameter_count(const LlamaConfig& config);

struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;  // (C)
  double eps;
};
TORCH_MODULE(RMSNorm);

// B = batch, T = time, C = hidden, nh / nkv = query / key-value heads, hs = head size
struct LlamaAttentionImpl : torch::nn::Module {
  explicit LlamaAttentionImpl(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  int64_t n_heads, n_kv_heads, head_dim;
  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(LlamaAttention);

struct LlamaMLPImpl : torch::nn::Module {
  explicit LlamaMLPImpl(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

struct LlamaDecoderLayerImpl : torch::nn::Module {
  explicit LlamaDecoderLayerImpl(const LlamaConfig& config);
  // (B, T, C) -> (B, T, C); cos/sin: (T, hs) rotary tables.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  torch::Tensor forward_block(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  bool checkpoint_activations = false;
};
TORCH_MODULE(LlamaDecoderLayer);

struct LlamaModelImpl : torch::nn::Module {
  explicit LlamaModelImpl(const LlamaConfig& config);
  nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<LlamaDecoderLayer> blocks;
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

struct LlamaForCausalLMImpl : CausalLMImpl {
  explicit LlamaForCausalLMImpl(const LlamaConfig& config);
  torch::Tensor forward(torch::Tensor tokens) override;
  torch::Tensor output_weight() override { return lm_head->weight; }
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override;
  void set_activation_checkpointing(bool enabled) override;
  std::string family() const override { return "llama"; }
  int64_t vocab_size() const override { return config.vocab_size; }
  int64_t max_seq_len() const override { return config.max_position_embeddings; }
  int64_t dim() const override { return config.hidden_size; }
  int64_t n_layers() const override { return config.num_hidden_layers; }
  std::string hf_config_json() const override;

  LlamaConfig config;
  LlamaModel model{nullptr};
  nn::Linear lm_head{nullptr};
};

// Rotary tables for positions [0, T): cos and sin, (T, head_dim), in the
// rotate-half layout (each frequency twice: first half, then second half).
std::pair<torch::Tensor, torch::Tensor> rotary_tables(int64_t T, int64_t head_dim, double theta);
// x * cos + rotate_half(x) * sin, with rotate_half(x) = cat(-x2, x1).
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace fsdp::models
