#pragma once
// The decoder the Llama-style families share (Llama 2/3, Qwen3, Qwen3-MoE,
// Llama 4), as torchtitan's models/common: pre-norm layers of attention and
// a dense or routed feed-forward with RMSNorm, and the language model
// around them (embedding, layer stack, final norm, tied or untied head,
// the load-balancing loss, activation checkpointing, which modules become
// units). A family supplies its attention, its feed-forward modules, its
// position tables and its names; its folder holds nothing else of the
// decoder ([Note: one decoder] in decoder.cpp).

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "fsdp/core/module_holder.h"
#include "fsdp/models/causal_lm.h"
#include "fsdp/models/kv_cache.h"
#include "fsdp/nn/layers.h"

namespace fsdp::models {

// B = batch, T = time, C = hidden
// A family's attention: (B, T, C) and the position tables the decoder LM
// made for these tokens (family-defined: rotary cos and sin) -> (B, T, C).
struct DecoderAttentionImpl : torch::nn::Module {
  virtual torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) = 0;
  // Set by the decoder LM for a forward with a key/value cache: this
  // layer's place in it. Read by families whose LM supports_kv_cache().
  KvCache* cache = nullptr;
  size_t layer = 0;
};

// A family's routed feed-forward (moe/moe.h's SparseMoeBlock, Llama 4's
// Llama4Moe): (..., C) -> (output, router statistics (2, E)) as
// load_balancing_loss (moe/moe.h) reads them.
struct RoutedFeedForwardImpl : torch::nn::Module {
  virtual std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) = 0;
};

// One layer's modules as the family built them; exactly one of `dense`
// and `routed` is set. The layer registers them under Hugging Face's names:
// self_attn, `feed_forward_name`, input_layernorm, post_attention_layernorm.
struct DecoderLayerParts {
  std::shared_ptr<DecoderAttentionImpl> attention;
  nn::SwiGLU dense{nullptr};
  std::shared_ptr<RoutedFeedForwardImpl> routed;
  std::string feed_forward_name = "mlp";  // Llama 4: feed_forward
  int64_t hidden_size = 0;
  double rms_norm_eps = 1e-5;
};

struct DecoderLayerImpl : torch::nn::Module {
  explicit DecoderLayerImpl(DecoderLayerParts parts);
  // (B, T, C) -> (B, T, C) and, for a routed layer, its router statistics.
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& cos,
                                                   const torch::Tensor& sin);
  // The feed-forward module, dense or routed.
  std::shared_ptr<torch::nn::Module> feed_forward() const;

  std::shared_ptr<DecoderAttentionImpl> self_attn;
  nn::SwiGLU dense{nullptr};
  std::shared_ptr<RoutedFeedForwardImpl> routed;
  nn::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  bool checkpoint_activations = false;

 private:
  std::vector<torch::Tensor> forward_block(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
};
FSDP_MODULE(DecoderLayer);

// Hugging Face's `model`: embed_tokens, layers.N, norm.
struct DecoderModelImpl : torch::nn::Module {
  DecoderModelImpl(int64_t vocab_size, int64_t hidden_size, double rms_norm_eps, std::optional<int64_t> padding_row,
                   int64_t n_layers,
                   const std::function<DecoderLayerParts(int64_t layer)>& make_layer);
  size_t size() const { return layers->size(); }
  DecoderLayerImpl& layer(size_t i) const { return *layers->ptr<DecoderLayerImpl>(i); }

  nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  nn::RMSNorm norm{nullptr};
};
TORCH_MODULE(DecoderModel);

struct DecoderLMOptions {
  std::string family;  // the registry's name
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  int64_t max_positions = 0;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  double aux_loss_coef = 0.0;  // times the load-balancing loss; 0: none
  std::optional<int64_t> padding_row;  // the embedding's (config.json's pad_token_id)
};

// The causal LM: `model` and `lm_head` (null when tied to the embedding).
struct DecoderLMImpl : CausalLMImpl {
  torch::Tensor forward(torch::Tensor tokens) override;
  torch::Tensor output_weight() override { return lm_head ? lm_head->weight : model->embed_tokens->weight; }
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override;
  std::vector<std::shared_ptr<torch::nn::Module>> wrap_candidates() override;
  void set_activation_checkpointing(bool enabled) override;
  std::string family() const override { return options_.family; }
  int64_t vocab_size() const override { return options_.vocab_size; }
  int64_t max_seq_len() const override { return options_.max_positions; }
  int64_t dim() const override { return options_.hidden_size; }
  int64_t n_layers() const override { return options_.n_layers; }
  torch::Tensor auxiliary_loss() override { return aux_loss_; }

  DecoderModel model{nullptr};
  nn::Linear lm_head{nullptr};

 protected:
  DecoderLMImpl(DecoderLMOptions options, const std::function<DecoderLayerParts(int64_t layer)>& make_layer);
  // The tables every layer's attention gets for positions [past, past + T),
  // on `device`.
  virtual std::pair<torch::Tensor, torch::Tensor> position_tables(int64_t past, int64_t T,
                                                                  const torch::Device& device) const = 0;

 private:
  DecoderLMOptions options_;
  torch::Tensor aux_loss_;
};

}  // namespace fsdp::models
