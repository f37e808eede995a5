#include "fsdp/models/gpt2/model.h"

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/models/attention.h"
#include "fsdp/models/kv_cache.h"
#include "fsdp/nn/packed_rows.h"
#include "fsdp/nn/activation_checkpoint.h"
#include "fsdp/nn/dropout.h"

namespace fsdp::models {

Conv1DImpl::Conv1DImpl(int64_t in, int64_t out) {
  // Hugging Face initialises Conv1D weights from N(0, 0.02), biases at 0.
  weight = register_parameter("weight", nn::new_parameter({in, out}, [](torch::Tensor& t) { t.normal_(0, 0.02); }));
  bias = register_parameter("bias", nn::new_parameter({out}, [](torch::Tensor& t) { t.zero_(); }));
}

torch::Tensor Conv1DImpl::forward(const torch::Tensor& x) {
  auto shape = x.sizes().vec();
  shape.back() = weight.size(1);
  return torch::addmm(bias, x.reshape({-1, x.size(-1)}), weight).view(shape);
}

GPT2AttentionImpl::GPT2AttentionImpl(const GPT2Config& c) : n_head(c.n_head) {
  FSDP_CHECK(c.n_embd % c.n_head == 0, "GPT-2: n_embd ", c.n_embd, " is not a multiple of n_head ", c.n_head);
  c_attn = register_module("c_attn", Conv1D(c.n_embd, 3 * c.n_embd));
  c_proj = register_module("c_proj", Conv1D(c.n_embd, c.n_embd));
  attn_dropout = register_module("attn_dropout", torch::nn::Dropout(c.attn_pdrop));
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(c.resid_pdrop));
}

torch::Tensor GPT2AttentionImpl::forward(const torch::Tensor& x) {
  if (cache == nullptr) {
    return nn::dropout(resid_dropout, c_proj(causal_attention_packed(c_attn(x), n_head, &attn_dropout)));
  }
  const int64_t B = x.size(0), T = x.size(1);
  const auto qkv = c_attn(x).view({B, T, 3, n_head, -1}).unbind(2);
  auto [k, v] = cache->append(layer, qkv[1], qkv[2]);
  return nn::dropout(resid_dropout, c_proj(cached_attention(qkv[0], k, v)));
}

GPT2MLPImpl::GPT2MLPImpl(const GPT2Config& c) {
  c_fc = register_module("c_fc", Conv1D(c.n_embd, 4 * c.n_embd));
  c_proj = register_module("c_proj", Conv1D(4 * c.n_embd, c.n_embd));
  dropout = register_module("dropout", torch::nn::Dropout(c.resid_pdrop));
}

torch::Tensor GPT2MLPImpl::forward(const torch::Tensor& x) {
  // GPT-2's "gelu_new": the tanh approximation.
  return nn::dropout(dropout, c_proj(nn::gelu_tanh(c_fc(x))));
}

GPT2BlockImpl::GPT2BlockImpl(const GPT2Config& c) {
  ln_1 = register_module("ln_1", nn::LayerNorm(c.n_embd, c.layer_norm_epsilon));
  attn = register_module("attn", GPT2Attention(c));
  ln_2 = register_module("ln_2", nn::LayerNorm(c.n_embd, c.layer_norm_epsilon));
  mlp = register_module("mlp", GPT2MLP(c));
}

torch::Tensor GPT2BlockImpl::forward_block(const torch::Tensor& x) {
  // Called through their hooks (FSDP_MODULE holders): a size-based wrap
  // policy may make them units.
  auto h = x + attn(ln_1(x));
  return h + mlp(ln_2(h));
}

torch::Tensor GPT2BlockImpl::forward(const torch::Tensor& x) {
  if (checkpoint_activations) return nn::checkpoint([this](const torch::Tensor& t) { return forward_block(t); }, x);
  return forward_block(x);
}

GPT2ModelImpl::GPT2ModelImpl(const GPT2Config& c) {
  wte = register_module("wte", nn::Embedding(c.vocab_size, c.n_embd, 0.02));
  wpe = register_module("wpe", nn::Embedding(c.n_positions, c.n_embd, 0.01));
  drop = register_module("drop", torch::nn::Dropout(c.embd_pdrop));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.n_layer; ++i) {
    blocks.emplace_back(c);
    h->push_back(blocks.back());
  }
  ln_f = register_module("ln_f", nn::LayerNorm(c.n_embd, c.layer_norm_epsilon));
}

GPT2LMHeadModelImpl::GPT2LMHeadModelImpl(const GPT2Config& c) : config(c) {
  transformer = register_module("transformer", GPT2Model(c));
  transformer->wte->share_with_output_head();  // GPT-2's head is wte
}

torch::Tensor GPT2LMHeadModelImpl::forward(torch::Tensor tokens) {
  const int64_t T = tokens.size(1);
  const int64_t past = kv_cache != nullptr ? kv_cache->length : 0;  // tokens before these
  FSDP_CHECK(past + T <= config.n_positions, "sequence length ", past + T, " exceeds the model's ", config.n_positions,
             " positions (n_positions)");
  for (size_t i = 0; i < transformer->blocks.size(); ++i) {
    transformer->blocks[i]->attn->cache = kv_cache;
    transformer->blocks[i]->attn->layer = i;
  }
  const nn::PackedRows* packed = nn::packed_rows_for(tokens.size(0), T);
  auto positions = packed != nullptr ? packed->positions
                                     : torch::arange(past, past + T, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
  auto x = nn::dropout(transformer->drop, transformer->wte(tokens) + transformer->wpe(positions));
  for (auto& block : transformer->blocks) x = block(x);
  return transformer->ln_f(x);
}

std::vector<std::shared_ptr<torch::nn::Module>> GPT2LMHeadModelImpl::blocks() {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (auto& b : transformer->blocks) out.push_back(b.ptr());
  return out;
}

std::vector<std::shared_ptr<torch::nn::Module>> GPT2LMHeadModelImpl::wrap_candidates() {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (auto& b : transformer->blocks) {
    out.insert(out.end(), {b->attn.ptr(), b->mlp.ptr(), b.ptr()});
  }
  return out;
}

void GPT2LMHeadModelImpl::set_activation_checkpointing(bool enabled) {
  for (auto& b : transformer->blocks) b->checkpoint_activations = enabled;
}

}  // namespace fsdp::models
