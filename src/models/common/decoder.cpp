#include "fsdp/models/common/decoder.h"

#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/models/moe/moe.h"
#include "fsdp/nn/packed_rows.h"
#include "fsdp/nn/activation_checkpoint.h"

namespace fsdp::models {

// Note [one decoder]
// ~~~~~~~~~~~~~~~~~~
// Llama 2/3, Qwen3, Qwen3-MoE and Llama 4 differ inside the attention
// (rotation convention, q/k norms, NoPE layers, chunked windows), inside
// the routed feed-forward (softmax or sigmoid router, the weight on the
// expert's output or input, a shared expert) and in the position tables;
// around those, the layer and the model are one: pre-norm residual
// blocks, RMSNorm, a final norm, a head tied or not, the load-balancing
// loss summed over the routed layers. The family passes its modules in as
// DecoderLayerParts and its tables through position_tables(); everything
// FSDP relies on (which modules are blocks and units, every unit called
// through fsdp::call on every rank, checkpointing per block) lives here
// once. GPT-2 keeps its own block: LayerNorm, learned positions and
// Hugging Face's transformer.h.N names share nothing with it but the loop.

DecoderLayerImpl::DecoderLayerImpl(DecoderLayerParts p) {
  FSDP_CHECK(p.attention != nullptr && (p.dense.is_empty() != (p.routed == nullptr)),
             "decoder layer: needs an attention and exactly one of a dense or a routed feed-forward");
  self_attn = register_module("self_attn", p.attention);
  if (p.routed) {
    routed = register_module(p.feed_forward_name, p.routed);
  } else {
    dense = register_module(p.feed_forward_name, p.dense);
  }
  input_layernorm = register_module("input_layernorm", nn::RMSNorm(p.hidden_size, p.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", nn::RMSNorm(p.hidden_size, p.rms_norm_eps));
}

std::shared_ptr<torch::nn::Module> DecoderLayerImpl::feed_forward() const {
  if (routed) return routed;
  return dense.ptr();
}

std::vector<torch::Tensor> DecoderLayerImpl::forward_block(const torch::Tensor& x, const torch::Tensor& cos,
                                                           const torch::Tensor& sin) {
  // Each part through fsdp::call: a size-based wrap policy may make it a unit.
  auto h = x + fsdp::call(self_attn, input_layernorm(x), cos, sin);
  if (!routed) return {h + fsdp::call(dense, post_attention_layernorm(h))};
  auto [y, stats] = fsdp::call(routed, post_attention_layernorm(h));
  return {h + y, stats};
}

std::tuple<torch::Tensor, torch::Tensor> DecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                                                   const torch::Tensor& sin) {
  return nn::maybe_checkpoint(
      checkpoint_activations, [this, cos, sin](const torch::Tensor& t) { return forward_block(t, cos, sin); }, x);
}

DecoderModelImpl::DecoderModelImpl(int64_t vocab_size, int64_t hidden_size, double rms_norm_eps,
                                   std::optional<int64_t> padding_row, int64_t n_layers,
                                   const std::function<DecoderLayerParts(int64_t layer)>& make_layer) {
  embed_tokens = register_module("embed_tokens", nn::Embedding(vocab_size, hidden_size, 0.02, padding_row));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < n_layers; ++i) layers->push_back(DecoderLayer(make_layer(i)));
  norm = register_module("norm", nn::RMSNorm(hidden_size, rms_norm_eps));
}

DecoderLMImpl::DecoderLMImpl(DecoderLMOptions options,
                             const std::function<DecoderLayerParts(int64_t layer)>& make_layer)
    : options_(std::move(options)) {
  const auto& o = options_;
  model = register_module(
      "model", DecoderModel(o.vocab_size, o.hidden_size, o.rms_norm_eps, o.padding_row, o.n_layers, make_layer));
  if (o.tie_word_embeddings) {
    model->embed_tokens->share_with_output_head();
  } else {
    lm_head = register_module("lm_head", nn::Linear(o.hidden_size, o.vocab_size, /*bias=*/false, /*std=*/0.02));
  }
}

torch::Tensor DecoderLMImpl::forward(torch::Tensor tokens) {
  const int64_t T = tokens.size(1);
  const int64_t past = kv_cache != nullptr ? kv_cache->length : 0;  // tokens before these
  FSDP_CHECK(past + T <= options_.max_positions, "sequence length ", past + T, " exceeds the model's ",
             options_.max_positions, " positions (max_position_embeddings)");
  for (size_t i = 0; i < model->size(); ++i) {
    model->layer(i).self_attn->cache = kv_cache;
    model->layer(i).self_attn->layer = i;
  }
  auto [cos, sin] = position_tables(past, T, tokens.device());
  if (const nn::PackedRows* packed = nn::packed_rows_for(tokens.size(0), T)) {
    // Each token's row of the tables, by its position in its example: (B, 1, T, hs), broadcast over heads.
    FSDP_CHECK(supports_packed_rows(), family(), ": packed rows are not supported (its positions are not per token)");
    const auto rows = [&](const torch::Tensor& table) {
      return table.index_select(0, packed->positions.reshape({-1})).view({tokens.size(0), T, -1}).unsqueeze(1);
    };
    cos = rows(cos);
    sin = rows(sin);
  }
  auto x = model->embed_tokens(tokens);
  std::vector<torch::Tensor> router_stats;
  for (size_t i = 0; i < model->size(); ++i) {
    auto layer = model->layers->ptr<DecoderLayerImpl>(i);
    auto [y, stats] = fsdp::call(layer, x, cos, sin);
    x = y;
    if (stats.defined()) router_stats.push_back(stats);
  }
  aux_loss_ = torch::Tensor();
  if (!router_stats.empty() && torch::GradMode::is_enabled() && options_.aux_loss_coef > 0) {
    aux_loss_ = options_.aux_loss_coef * load_balancing_loss(router_stats, tokens.numel());
  }
  return model->norm(x);
}

std::vector<std::shared_ptr<torch::nn::Module>> DecoderLMImpl::blocks() {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (const auto& layer : *model->layers) out.push_back(layer);
  return out;
}

std::vector<std::shared_ptr<torch::nn::Module>> DecoderLMImpl::wrap_candidates() {
  // The routed feed-forward as a whole, never one expert: which experts run
  // depends on each rank's tokens, and a unit must be called on every rank
  // (its gathers are collectives).
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (size_t i = 0; i < model->size(); ++i) {
    auto& layer = model->layer(i);
    out.push_back(layer.self_attn);
    out.push_back(layer.feed_forward());
    out.push_back(model->layers->ptr(i));
  }
  return out;
}

void DecoderLMImpl::set_activation_checkpointing(bool enabled) {
  for (size_t i = 0; i < model->size(); ++i) model->layer(i).checkpoint_activations = enabled;
}

}  // namespace fsdp::models
