#include "fsdp/models/llama/model.h"

#include <cmath>

#include "fsdp/common/error.h"
#include "fsdp/models/attention.h"
#include "fsdp/models/kv_cache.h"
#include "fsdp/models/llama/config.h"
#include "fsdp/models/moe/moe.h"

namespace fsdp::models {

namespace {
nn::Linear linear(int64_t in, int64_t out) {
  return nn::Linear(in, out, /*bias=*/false, /*std=*/0.02);  // Hugging Face's initializer_range
}
}  // namespace

torch::Tensor rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& s) {
  auto inv_freq = 1.0 / torch::pow(theta, torch::arange(0, head_dim, 2, torch::kFloat) / static_cast<double>(head_dim));
  if (s.rope_type != "llama3") return inv_freq;
  // Wavelengths longer than the original context / low_freq_factor are
  // slowed by `factor`; shorter than context / high_freq_factor kept; those
  // between blend the two linearly in context / wavelength.
  const double context = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = context / s.low_freq_factor, high_wavelen = context / s.high_freq_factor;
  const auto wavelen = 2 * M_PI / inv_freq;
  auto scaled = torch::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
  if (s.high_freq_factor == s.low_freq_factor) return scaled;  // no band between (Llama 4 Scout)
  const auto smooth = (context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const auto blended = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return torch::where(medium, blended, scaled);
}

std::pair<torch::Tensor, torch::Tensor> rotary_tables(int64_t T, int64_t head_dim, double theta,
                                                      const RopeScaling& scaling) {
  const auto inv_freq = rope_inv_freq(head_dim, theta, scaling);
  auto freqs = torch::outer(torch::arange(T, torch::kFloat), inv_freq);  // (T, hs/2)
  auto emb = torch::cat({freqs, freqs}, -1);                               // (T, hs)
  return {emb.cos(), emb.sin()};
}

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.to(x.scalar_type()) + rotated * sin.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c)
    : n_heads(c.num_attention_heads), n_kv_heads(c.num_key_value_heads), head_dim(c.head_size()) {
  FSDP_CHECK(c.num_attention_heads % c.num_key_value_heads == 0 &&
                 (c.head_dim > 0 || c.hidden_size % c.num_attention_heads == 0),
             "Llama: hidden_size ", c.hidden_size, ", num_attention_heads ", c.num_attention_heads,
             " and num_key_value_heads ", c.num_key_value_heads, " do not divide evenly");
  q_proj = register_module("q_proj", linear(c.hidden_size, n_heads * head_dim));
  k_proj = register_module("k_proj", linear(c.hidden_size, n_kv_heads * head_dim));
  v_proj = register_module("v_proj", linear(c.hidden_size, n_kv_heads * head_dim));
  o_proj = register_module("o_proj", linear(n_heads * head_dim, c.hidden_size));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", nn::RMSNorm(head_dim, c.rms_norm_eps));
    k_norm = register_module("k_norm", nn::RMSNorm(head_dim, c.rms_norm_eps));
  }
  dropout = register_module("dropout", torch::nn::Dropout(c.attention_dropout));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1);
  const auto heads = [&](const torch::Tensor& t, int64_t n, nn::RMSNorm* norm) {
    auto h = t.view({B, T, n, head_dim});
    if (norm != nullptr && *norm) h = (*norm)(h);  // Qwen3: each head normalised before the rotation
    return h.transpose(1, 2);
  };
  auto q = apply_rotary(heads(q_proj(x), n_heads, &q_norm), cos, sin);     // (B, nh, T, hs)
  auto k = apply_rotary(heads(k_proj(x), n_kv_heads, &k_norm), cos, sin);  // (B, nkv, T, hs)
  auto v = heads(v_proj(x), n_kv_heads, nullptr);
  if (cache != nullptr) {
    auto [k_all, v_all] = cache->append(layer, k.transpose(1, 2), v.transpose(1, 2));
    return o_proj(cached_attention(q.transpose(1, 2), k_all, v_all));
  }
  // Grouped-query attention (nkv < nh) is handled inside: no repeated k, v.
  return o_proj(causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), &dropout));
}

namespace {
DecoderLMOptions options_of(const LlamaConfig& c) {
  const double aux = c.moe.output_router_logits ? c.moe.router_aux_loss_coef : 0.0;
  return {c.family,       c.vocab_size,          c.hidden_size, c.num_hidden_layers, c.max_position_embeddings,
          c.rms_norm_eps, c.tie_word_embeddings, aux,           c.pad_token_id};
}

DecoderLayerParts layer_of(const LlamaConfig& c, int64_t index) {
  DecoderLayerParts p;
  p.attention = std::make_shared<LlamaAttentionImpl>(c);
  if (c.moe.is_sparse(index)) {
    p.routed = std::make_shared<SparseMoeBlockImpl>(c.hidden_size, c.moe);
  } else {
    p.dense = nn::SwiGLU(c.hidden_size, c.intermediate_size);
  }
  p.hidden_size = c.hidden_size;
  p.rms_norm_eps = c.rms_norm_eps;
  return p;
}
}  // namespace

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c)
    : DecoderLMImpl(options_of(c), [&c](int64_t i) { return layer_of(c, i); }), config(c) {}

std::pair<torch::Tensor, torch::Tensor> LlamaForCausalLMImpl::position_tables(int64_t past, int64_t T,
                                                                              const torch::Device& device) const {
  auto [cos, sin] = rotary_tables(past + T, config.head_size(), config.rope_theta, config.rope_scaling);
  return {cos.narrow(0, past, T).to(device), sin.narrow(0, past, T).to(device)};
}

}  // namespace fsdp::models
