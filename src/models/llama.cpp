#include "fsdp/models/llama.h"

#include <map>

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/models/attention.h"
#include "fsdp/nn/activation_checkpoint.h"

namespace fsdp::models {

namespace {
const std::map<std::string, LlamaConfig>& presets() {
  // (vocab, hidden, intermediate, layers, heads, kv heads, positions)
  static const std::map<std::string, LlamaConfig> p = {
      {"llama-tiny", {512, 64, 176, 2, 4, 2, 128}},
      {"llama3-1b", {128256, 2048, 8192, 16, 32, 8, 8192}},
      {"llama3-3b", {128256, 3072, 8192, 28, 24, 8, 8192}},
      {"llama3-8b", {128256, 4096, 14336, 32, 32, 8, 8192}},
  };
  return p;
}

nn::Linear linear(int64_t in, int64_t out) {
  return nn::Linear(in, out, /*bias=*/false, /*std=*/0.02);  // Hugging Face's initializer_range
}
}  // namespace

bool is_llama_preset(const std::string& name) { return presets().count(name) != 0; }

LlamaConfig llama_preset(const std::string& name) {
  const auto it = presets().find(name);
  FSDP_CHECK(it != presets().end(), "unknown Llama preset '", name,
             "': expected llama-tiny, llama3-1b, llama3-3b or llama3-8b");
  return it->second;
}

int64_t llama_parameter_count(const LlamaConfig& c) {
  const int64_t hs = c.hidden_size / c.num_attention_heads;
  const int64_t attn = c.hidden_size * c.hidden_size * 2 + 2 * c.hidden_size * c.num_key_value_heads * hs;
  const int64_t mlp = 3 * c.hidden_size * c.intermediate_size;
  const int64_t layer = attn + mlp + 2 * c.hidden_size;
  return c.num_hidden_layers * layer + 2 * c.vocab_size * c.hidden_size + c.hidden_size;
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", nn::new_parameter({dim}, [](torch::Tensor& t) { t.fill_(1); }));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // In fp32 whatever the compute dtype, as Hugging Face does.
  auto x32 = x.to(torch::kFloat);
  auto normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

std::pair<torch::Tensor, torch::Tensor> rotary_tables(int64_t T, int64_t head_dim, double theta) {
  auto inv_freq = 1.0 / torch::pow(theta, torch::arange(0, head_dim, 2, torch::kFloat) / static_cast<double>(head_dim));
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
    : n_heads(c.num_attention_heads), n_kv_heads(c.num_key_value_heads), head_dim(c.hidden_size / c.num_attention_heads) {
  FSDP_CHECK(c.hidden_size % c.num_attention_heads == 0 && c.num_attention_heads % c.num_key_value_heads == 0,
             "Llama: hidden_size ", c.hidden_size, ", num_attention_heads ", c.num_attention_heads,
             " and num_key_value_heads ", c.num_key_value_heads, " do not divide evenly");
  q_proj = register_module("q_proj", linear(c.hidden_size, n_heads * head_dim));
  k_proj = register_module("k_proj", linear(c.hidden_size, n_kv_heads * head_dim));
  v_proj = register_module("v_proj", linear(c.hidden_size, n_kv_heads * head_dim));
  o_proj = register_module("o_proj", linear(n_heads * head_dim, c.hidden_size));
  dropout = register_module("dropout", torch::nn::Dropout(c.attention_dropout));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1);
  const auto heads = [&](const torch::Tensor& t, int64_t n) { return t.view({B, T, n, head_dim}).transpose(1, 2); };
  auto q = apply_rotary(heads(q_proj(x), n_heads), cos, sin);     // (B, nh, T, hs)
  auto k = apply_rotary(heads(k_proj(x), n_kv_heads), cos, sin);  // (B, nkv, T, hs)
  auto v = heads(v_proj(x), n_kv_heads);
  // Grouped-query attention: each key/value head serves n_heads / n_kv_heads query heads.
  const int64_t rep = n_heads / n_kv_heads;
  if (rep > 1) {
    k = k.repeat_interleave(rep, 1);
    v = v.repeat_interleave(rep, 1);
  }
  auto y = causal_attention(q, k, v, &dropout);
  return o_proj(y.transpose(1, 2).contiguous().view({B, T, n_heads * head_dim}));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c) {
  gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size));
  up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size));
  down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c) {
  self_attn = register_module("self_attn", LlamaAttention(c));
  mlp = register_module("mlp", LlamaMLP(c));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor LlamaDecoderLayerImpl::forward_block(const torch::Tensor& x, const torch::Tensor& cos,
                                                   const torch::Tensor& sin) {
  auto h = x + self_attn(input_layernorm(x), cos, sin);
  return h + mlp(post_attention_layernorm(h));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (checkpoint_activations) {
    return nn::checkpoint([this, cos, sin](const torch::Tensor& t) { return forward_block(t, cos, sin); }, x);
  }
  return forward_block(x, cos, sin);
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c) {
  embed_tokens = register_module("embed_tokens", nn::Embedding(c.vocab_size, c.hidden_size, 0.02));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    blocks.emplace_back(c);
    layers->push_back(blocks.back());
  }
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c) : config(c) {
  model = register_module("model", LlamaModel(c));
  lm_head = register_module("lm_head", linear(c.hidden_size, c.vocab_size));
}

torch::Tensor LlamaForCausalLMImpl::forward(torch::Tensor tokens) {
  const int64_t T = tokens.size(1);
  FSDP_CHECK(T <= config.max_position_embeddings, "sequence length ", T, " exceeds the model's ",
             config.max_position_embeddings, " positions (max_position_embeddings)");
  auto [cos, sin] = rotary_tables(T, config.hidden_size / config.num_attention_heads, config.rope_theta);
  auto x = model->embed_tokens(tokens);
  for (auto& block : model->blocks) x = fsdp::call(block, x, cos, sin);
  return model->norm(x);
}

std::vector<std::shared_ptr<torch::nn::Module>> LlamaForCausalLMImpl::blocks() {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (auto& b : model->blocks) out.push_back(b.ptr());
  return out;
}

void LlamaForCausalLMImpl::set_activation_checkpointing(bool enabled) {
  for (auto& b : model->blocks) b->checkpoint_activations = enabled;
}

std::string LlamaForCausalLMImpl::hf_config_json() const {
  nlohmann::json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", config.vocab_size},
      {"hidden_size", config.hidden_size},
      {"intermediate_size", config.intermediate_size},
      {"num_hidden_layers", config.num_hidden_layers},
      {"num_attention_heads", config.num_attention_heads},
      {"num_key_value_heads", config.num_key_value_heads},
      {"max_position_embeddings", config.max_position_embeddings},
      {"rms_norm_eps", config.rms_norm_eps},
      {"rope_theta", config.rope_theta},
      {"attention_dropout", config.attention_dropout},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", false},
      {"torch_dtype", "float32"},
  };
  return j.dump(2);
}

}  // namespace fsdp::models
