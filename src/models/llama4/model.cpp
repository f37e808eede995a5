#include "fsdp/models/llama4/model.h"

#include <cmath>

#include "fsdp/common/error.h"
#include "fsdp/models/attention.h"
#include "fsdp/models/llama/model.h"
#include "fsdp/models/moe/dispatch.h"

namespace fsdp::models {

namespace {
constexpr double kInitStd = 0.02;  // Hugging Face's initializer_range

nn::Linear bias_free_linear(int64_t in, int64_t out) { return nn::Linear(in, out, /*bias=*/false, kInitStd); }

// x * rsqrt(mean(x^2) + eps) in fp32, no weight (Llama4TextL2Norm).
torch::Tensor l2_norm(const torch::Tensor& x, double eps) {
  const auto f = x.to(torch::kFloat);
  return (f * torch::rsqrt(f.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type());
}

// Causal attention restricted to aligned windows of `chunk` positions: a
// query at t sees keys s <= t with s / chunk == t / chunk. Each window is
// then plain causal attention over its own positions, computed alone.
torch::Tensor chunked_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       int64_t chunk, torch::nn::Dropout* dropout) {
  const int64_t T = q.size(1);
  if (chunk <= 0 || T <= chunk) return causal_attention(q, k, v, dropout);
  std::vector<torch::Tensor> windows;
  for (int64_t start = 0; start < T; start += chunk) {
    const int64_t n = std::min(chunk, T - start);
    windows.push_back(causal_attention(q.narrow(1, start, n), k.narrow(1, start, n), v.narrow(1, start, n), dropout));
  }
  return torch::cat(windows, 1);
}
}  // namespace

torch::Tensor apply_rotary_pairs(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t T = x.size(1), half = x.size(-1) / 2;
  const auto pairs = x.to(torch::kFloat).reshape({x.size(0), T, x.size(2), half, 2});
  const auto even = pairs.select(-1, 0), odd = pairs.select(-1, 1);
  const auto c = cos.view({1, T, 1, half}), s = sin.view({1, T, 1, half});
  return torch::stack({even * c - odd * s, even * s + odd * c}, -1).flatten(-2).to(x.scalar_type());
}

Llama4AttentionImpl::Llama4AttentionImpl(const Llama4Config& c, int64_t layer)
    : n_heads(c.text.num_attention_heads),
      n_kv_heads(c.text.num_key_value_heads),
      head_dim(c.text.head_size()),
      rope(c.uses_rope(layer)),
      qk_norm(c.use_qk_norm && rope),
      temperature_tuning(c.attn_temperature_tuning && !rope),
      chunk(c.is_chunked(layer) ? c.attention_chunk_size : 0),
      eps(c.text.rms_norm_eps),
      floor_scale(c.floor_scale),
      attn_scale(c.attn_scale) {
  FSDP_CHECK(n_heads % n_kv_heads == 0 && head_dim % 2 == 0, "Llama 4: num_attention_heads ", n_heads,
             " must be a multiple of num_key_value_heads ", n_kv_heads, " and head_dim ", head_dim, " even");
  const int64_t C = c.text.hidden_size;
  q_proj = register_module("q_proj", bias_free_linear(C, n_heads * head_dim));
  k_proj = register_module("k_proj", bias_free_linear(C, n_kv_heads * head_dim));
  v_proj = register_module("v_proj", bias_free_linear(C, n_kv_heads * head_dim));
  o_proj = register_module("o_proj", bias_free_linear(n_heads * head_dim, C));
  dropout = register_module("dropout", torch::nn::Dropout(c.text.attention_dropout));
}

torch::Tensor Llama4AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1);
  auto q = q_proj(x).view({B, T, n_heads, head_dim});
  auto k = k_proj(x).view({B, T, n_kv_heads, head_dim});
  const auto v = v_proj(x).view({B, T, n_kv_heads, head_dim});
  if (rope) {
    q = apply_rotary_pairs(q, cos, sin);
    k = apply_rotary_pairs(k, cos, sin);
    if (qk_norm) {
      q = l2_norm(q, eps);
      k = l2_norm(k, eps);
    }
  }
  if (temperature_tuning) {
    // Without positions in q and k, longer contexts would flatten the
    // softmax; the query's scale grows with the log of its position.
    const auto positions = torch::arange(T, q.options().dtype(torch::kFloat));
    const auto scales = torch::log1p(torch::floor((positions + 1.0) / floor_scale)) * attn_scale + 1.0;
    q = (q * scales.view({1, T, 1, 1})).to(q.scalar_type());
  }
  return o_proj(chunked_causal_attention(q, k, v, chunk, &dropout));
}

Llama4ExpertsImpl::Llama4ExpertsImpl(int64_t experts, int64_t hidden, int64_t width) {
  const auto normal = [](torch::Tensor& t) { t.normal_(0.0, kInitStd); };
  gate_up_proj = register_parameter("gate_up_proj", nn::new_parameter({experts, hidden, 2 * width}, normal));
  down_proj = register_parameter("down_proj", nn::new_parameter({experts, width, hidden}, normal));
}

Llama4MoeImpl::Llama4MoeImpl(const Llama4Config& c) : top_k(c.text.moe.num_experts_per_tok) {
  const int64_t C = c.text.hidden_size;
  router = register_module("router", bias_free_linear(C, c.text.moe.num_experts));
  experts = register_module("experts", Llama4Experts(c.text.moe.num_experts, C, c.text.moe.moe_intermediate_size));
  shared_expert = register_module("shared_expert", nn::SwiGLU(C, c.text.intermediate_size, kInitStd));
}

// Routed as every MoE family is ([Note: expert dispatch] in
// moe/dispatch.cpp). What differs is where the router's weight goes:
// Hugging Face multiplies the expert's input by the sigmoid of the token's
// router logit, not its output.
std::tuple<torch::Tensor, torch::Tensor> Llama4MoeImpl::forward(const torch::Tensor& x) {
  const int64_t C = x.size(-1);
  const auto tokens = x.reshape({-1, C});  // (N, C)
  const auto logits = router(tokens);      // (N, E)
  const int64_t E = logits.size(-1);
  const auto [top, chosen] = logits.topk(top_k, -1);
  const auto scores = torch::sigmoid(top.to(torch::kFloat)).to(x.scalar_type()).reshape({-1});  // per slot
  // Views of each expert's weights; their gradients meet again as one
  // tensor per fused parameter (unbind's backward stacks them).
  const auto gate_up = experts->gate_up_proj.unbind(0), down = experts->down_proj.unbind(0);
  const auto [routed, counts] =
      dispatch_to_experts(tokens, chosen, scores, E, RoutingWeightAt::kInput, [&](int64_t e, const torch::Tensor& in) {
        return nn::silu_mul_halves(in.matmul(gate_up[static_cast<size_t>(e)])).matmul(down[static_cast<size_t>(e)]);
      });
  const auto out = shared_expert(tokens) + routed;
  auto stats = torch::stack({torch::softmax(logits.to(torch::kFloat), -1).sum(0), counts.to(logits.device())});
  return {out.view(x.sizes()), stats};
}

namespace {
DecoderLMOptions options_of(const Llama4Config& c) {
  const auto& t = c.text;
  FSDP_CHECK(static_cast<int64_t>(c.no_rope_layers.size()) == t.num_hidden_layers &&
                 static_cast<int64_t>(c.chunked_attention.size()) == t.num_hidden_layers,
             "Llama 4: no_rope_layers and layer_types need one entry per layer (", t.num_hidden_layers, ")");
  FSDP_CHECK(t.moe.num_experts == 0 || t.moe.moe_intermediate_size == t.intermediate_size,
             "Llama 4: the routed experts' width ", t.moe.moe_intermediate_size,
             " must equal intermediate_size ", t.intermediate_size, " (the shared expert's)");
  const double aux = c.output_router_logits ? t.moe.router_aux_loss_coef : 0.0;
  return {"llama4_text", t.vocab_size, t.hidden_size, t.num_hidden_layers, t.max_position_embeddings,
          t.rms_norm_eps, t.tie_word_embeddings, aux, t.pad_token_id};
}

DecoderLayerParts layer_of(const Llama4Config& c, int64_t index) {
  DecoderLayerParts p;
  p.attention = std::make_shared<Llama4AttentionImpl>(c, index);
  if (c.is_moe(index)) {
    p.routed = std::make_shared<Llama4MoeImpl>(c);
  } else {
    p.dense = nn::SwiGLU(c.text.hidden_size, c.intermediate_size_mlp, kInitStd);
  }
  p.feed_forward_name = "feed_forward";
  p.hidden_size = c.text.hidden_size;
  p.rms_norm_eps = c.text.rms_norm_eps;
  return p;
}
}  // namespace

Llama4ForCausalLMImpl::Llama4ForCausalLMImpl(const Llama4Config& c)
    : DecoderLMImpl(options_of(c), [&c](int64_t i) { return layer_of(c, i); }), config(c) {}

std::pair<torch::Tensor, torch::Tensor> Llama4ForCausalLMImpl::position_tables(int64_t past, int64_t T,
                                                                               const torch::Device& device) const {
  const auto& t = config.text;
  const auto positions = torch::arange(past, past + T, torch::kFloat);
  const auto angles = torch::outer(positions, rope_inv_freq(t.head_size(), t.rope_theta, t.rope_scaling));
  return {angles.cos().to(device), angles.sin().to(device)};  // (T, hs/2)
}

}  // namespace fsdp::models
