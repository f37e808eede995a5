#pragma once
// A small GPT-style transformer for the FSDP tests: token + position
// embeddings, pre-norm blocks (causal attention, GELU MLP), a final norm and
// an output head tied to the token embedding. Sizes are chosen so that no
// unit's parameter count divides by 3 or 4 (padding is exercised).
// Single-device code: blocks are called through fsdp::call, which is plain
// forward when FSDP is not applied.

#include <limits>

#include <torch/torch.h>

#include "fsdp/core/fully_shard.h"

namespace fsdp::testing {

struct TinyConfig {
  int64_t vocab = 37;
  int64_t seq = 8;
  int64_t dim = 25;  // a block holds 12*25^2 + 10*25 = 7750 parameters, the root 25*(37+8) + 50 = 1175
  int64_t heads = 5;
  int64_t layers = 2;
};

// B = batch, T = time, C = channels
struct TinyBlockImpl : torch::nn::Module {
  explicit TinyBlockImpl(const TinyConfig& c)
      : heads(c.heads),
        ln_1(register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        // No bias on q/k/v: a key bias shifts every score of a row equally, so its
        // gradient is zero up to rounding noise, which AdamW would amplify
        // into updates of +-lr that no two summation orders agree on.
        attn(register_module("attn", torch::nn::Linear(torch::nn::LinearOptions(c.dim, 3 * c.dim).bias(false)))),
        proj(register_module("proj", torch::nn::Linear(c.dim, c.dim))),
        ln_2(register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        fc(register_module("fc", torch::nn::Linear(c.dim, 4 * c.dim))),
        fc_out(register_module("fc_out", torch::nn::Linear(4 * c.dim, c.dim))) {}

  torch::Tensor forward(torch::Tensor x) {  // (B, T, C)
    const auto B = x.size(0), T = x.size(1), C = x.size(2), hs = C / heads;
    auto qkv = attn(ln_1(x)).chunk(3, -1);
    auto q = qkv[0].view({B, T, heads, hs}).transpose(1, 2);  // (B, nh, T, hs)
    auto k = qkv[1].view({B, T, heads, hs}).transpose(1, 2);
    auto v = qkv[2].view({B, T, heads, hs}).transpose(1, 2);
    auto att = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hs));
    auto mask = torch::ones({T, T}, torch::kBool).tril();
    // -inf, not a large finite number: fp16 overflows at 65504.
    att = att.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity()).softmax(-1);
    auto y = att.matmul(v).transpose(1, 2).contiguous().view({B, T, C});
    x = x + proj(y);
    return x + fc_out(torch::gelu(fc(ln_2(x))));
  }

  int64_t heads;
  torch::nn::LayerNorm ln_1;
  torch::nn::Linear attn, proj;
  torch::nn::LayerNorm ln_2;
  torch::nn::Linear fc, fc_out;
};
TORCH_MODULE(TinyBlock);

struct TinyTransformerImpl : torch::nn::Module {
  explicit TinyTransformerImpl(const TinyConfig& c)
      : wte(register_module("wte", torch::nn::Embedding(c.vocab, c.dim))),
        wpe(register_module("wpe", torch::nn::Embedding(c.seq, c.dim))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))) {
    for (int64_t i = 0; i < c.layers; ++i) blocks.push_back(register_module("h" + std::to_string(i), TinyBlock(c)));
  }

  torch::Tensor forward(torch::Tensor tokens) {  // (B, T) -> (B, T, vocab)
    auto pos = torch::arange(tokens.size(1), torch::kLong);
    auto x = wte(tokens) + wpe(pos);
    for (auto& block : blocks) x = fsdp::call(block, x);
    // The output head is the token embedding (tied), as in GPT-2.
    return torch::nn::functional::linear(ln_f(x), wte->weight);
  }

  torch::nn::Embedding wte, wpe;
  torch::nn::LayerNorm ln_f;
  std::vector<TinyBlock> blocks;
};
TORCH_MODULE(TinyTransformer);

inline TinyTransformer make_tiny(const TinyConfig& c, uint64_t seed) {
  torch::manual_seed(seed);
  return TinyTransformer(c);
}

}  // namespace fsdp::testing
