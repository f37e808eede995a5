#pragma once
// The Llama-style decoder with the architecture and parameter names of
// Hugging Face's LlamaForCausalLM (model.embed_tokens, model.layers.0.
// self_attn.q_proj, ..., lm_head): RMSNorm, rotary position embeddings in
// the rotate-half convention (Llama 3.1's rope scaling optional), SwiGLU,
// grouped-query attention, a tied or untied output head. With qk_norm it
// is Qwen3 (self_attn.q_norm / k_norm), and with MoE options Qwen3-MoE
// (mlp.gate, mlp.experts.N.*): the Qwen3 and Mistral families build this
// class. The
// layer and the model around it are the shared decoder (common/decoder.h).

#include <string>
#include <utility>

#include "fsdp/models/common/decoder.h"
#include "fsdp/models/llama/config.h"

namespace fsdp::models {

// B = batch, T = time, C = hidden, nh / nkv = query / key-value heads, hs = head size
struct LlamaAttentionImpl : DecoderAttentionImpl {
  explicit LlamaAttentionImpl(const LlamaConfig& config);
  // cos, sin: (T, hs) rotary tables.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) override;
  int64_t n_heads, n_kv_heads, head_dim;
  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  nn::RMSNorm q_norm{nullptr}, k_norm{nullptr};  // Qwen3 only
  torch::nn::Dropout dropout{nullptr};
};

struct LlamaForCausalLMImpl : DecoderLMImpl {
  explicit LlamaForCausalLMImpl(const LlamaConfig& config);
  bool supports_kv_cache() const override { return true; }
  bool supports_packed_rows() const override { return true; }
  int64_t active_parameter_count() const override { return llama_active_parameter_count(config); }

  LlamaConfig config;

 protected:
  std::pair<torch::Tensor, torch::Tensor> position_tables(int64_t past, int64_t T,
                                                          const torch::Device& device) const override;
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
