#pragma once
// The small transformer of PyTorch's FSDP2 example (seed trainer 000):
// token and position embeddings, pre-norm blocks with multi-head attention
// (wq, wk, wv, wo without bias) and a GELU feed-forward (w1, w2), a final
// norm and an untied output head. Single-device code: blocks are held by
// FSDP_MODULE holders, so block(x) runs FSDP's hooks when they are units.

#include <torch/torch.h>

#include "fsdp/core/module_holder.h"

namespace fsdp::models {

struct ExampleTransformerConfig {
  int64_t vocab_size = 1024;
  int64_t max_seq_len = 64;
  int64_t dim = 16;
  int64_t n_layers = 10;
  int64_t n_heads = 4;
  double dropout = 0.0;
};

// B = batch, T = time, C = channels (dim)
struct ExampleBlockImpl : torch::nn::Module {
  explicit ExampleBlockImpl(const ExampleTransformerConfig& config);
  torch::Tensor forward(torch::Tensor x);  // (B, T, C) -> (B, T, C)

  int64_t n_heads;
  torch::nn::LayerNorm attention_norm{nullptr}, ffn_norm{nullptr};
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};  // (C, C) each
  torch::nn::Linear w1{nullptr}, w2{nullptr};                             // (4C, C), (C, 4C)
  torch::nn::Dropout resid_dropout{nullptr};
};
FSDP_MODULE(ExampleBlock);

struct ExampleTransformerImpl : torch::nn::Module {
  explicit ExampleTransformerImpl(const ExampleTransformerConfig& config);
  torch::Tensor forward(torch::Tensor tokens);  // (B, T) int64 -> (B, T, vocab) logits
  torch::Tensor hidden(torch::Tensor tokens);   // (B, T) int64 -> (B, T, C) after the final norm

  int64_t max_seq_len;
  torch::nn::Embedding tok_embeddings{nullptr}, pos_embeddings{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::nn::ModuleList layers;
  std::vector<ExampleBlock> blocks;  // the same modules as `layers`, typed
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear output{nullptr};
};
TORCH_MODULE(ExampleTransformer);

}  // namespace fsdp::models
