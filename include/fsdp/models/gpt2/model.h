#pragma once
// GPT-2 with the architecture and parameter names of Hugging Face's
// GPT2LMHeadModel (transformer.wte, transformer.h.0.attn.c_attn, ...), so
// names and layouts match model.safetensors directly: Conv1D weights are
// stored [in, out], and the output head is the token embedding (tied).

#include <string>

#include "fsdp/models/causal_lm.h"
#include "fsdp/models/gpt2/config.h"
#include "fsdp/nn/layers.h"
#include "fsdp/core/module_holder.h"

namespace fsdp::models {


// y = x @ weight + bias, weight (in, out): GPT-2's Conv1D.
struct Conv1DImpl : torch::nn::Module {
  Conv1DImpl(int64_t in, int64_t out);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;  // (in, out), (out)
};
TORCH_MODULE(Conv1D);

// B = batch, T = time, C = channels (n_embd)
struct GPT2AttentionImpl : torch::nn::Module {
  explicit GPT2AttentionImpl(const GPT2Config& config);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, C) -> (B, T, C)
  int64_t n_head;
  // Set by the model for a forward with a key/value cache: this layer's place in it.
  KvCache* cache = nullptr;
  size_t layer = 0;
  Conv1D c_attn{nullptr}, c_proj{nullptr};  // (C, 3C), (C, C)
  torch::nn::Dropout attn_dropout{nullptr}, resid_dropout{nullptr};
};
FSDP_MODULE(GPT2Attention);

struct GPT2MLPImpl : torch::nn::Module {
  explicit GPT2MLPImpl(const GPT2Config& config);
  torch::Tensor forward(const torch::Tensor& x);
  Conv1D c_fc{nullptr}, c_proj{nullptr};  // (C, 4C), (4C, C)
  torch::nn::Dropout dropout{nullptr};
};
FSDP_MODULE(GPT2MLP);

struct GPT2BlockImpl : torch::nn::Module {
  explicit GPT2BlockImpl(const GPT2Config& config);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor forward_block(const torch::Tensor& x);
  nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  GPT2Attention attn{nullptr};
  GPT2MLP mlp{nullptr};
  bool checkpoint_activations = false;
};
FSDP_MODULE(GPT2Block);

struct GPT2ModelImpl : torch::nn::Module {
  explicit GPT2ModelImpl(const GPT2Config& config);
  nn::Embedding wte{nullptr}, wpe{nullptr};  // (vocab, C), (positions, C)
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::vector<GPT2Block> blocks;  // the modules of h, typed
  nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(GPT2Model);

struct GPT2LMHeadModelImpl : CausalLMImpl {
  explicit GPT2LMHeadModelImpl(const GPT2Config& config);
  torch::Tensor forward(torch::Tensor tokens) override;
  torch::Tensor output_weight() override { return transformer->wte->weight; }
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override;
  std::vector<std::shared_ptr<torch::nn::Module>> wrap_candidates() override;
  void set_activation_checkpointing(bool enabled) override;
  std::string family() const override { return "gpt2"; }
  int64_t vocab_size() const override { return config.vocab_size; }
  int64_t max_seq_len() const override { return config.n_positions; }
  int64_t dim() const override { return config.n_embd; }
  int64_t n_layers() const override { return config.n_layer; }
  bool supports_kv_cache() const override { return true; }
  bool supports_packed_rows() const override { return true; }

  GPT2Config config;
  GPT2Model transformer{nullptr};
};

}  // namespace fsdp::models
