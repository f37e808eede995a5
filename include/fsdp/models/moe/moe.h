#pragma once
// A Mixture-of-Experts feed-forward block (Hugging Face's
// Qwen3MoeSparseMoeBlock): a linear router (`gate`) scores each token
// against E experts; the token goes to its top-k by softmax probability
// (renormalised over those k with norm_topk_prob) and its output is the
// probability-weighted sum of those experts' SwiGLU outputs. Each expert
// computes only the tokens routed to it: token slots are grouped by expert,
// gathered, computed, and scatter-added back (moe/dispatch.h, shared with
// Llama 4).

#include <torch/torch.h>

#include "fsdp/core/module_holder.h"
#include "fsdp/models/common/decoder.h"
#include "fsdp/models/moe/config.h"
#include "fsdp/nn/layers.h"

namespace fsdp::models {

// N = tokens, C = hidden, E = experts, k = experts per token
struct SparseMoeBlockImpl : RoutedFeedForwardImpl {
  SparseMoeBlockImpl(int64_t hidden, const MoEConfig& config);
  // (..., C) -> (output (..., C), router statistics (2, E)): row 0 the sum
  // over tokens of each expert's routing probability (differentiable: the
  // load-balancing loss's gradient reaches the router through it), row 1
  // how many of the N * k routing slots each expert got.
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) override;
  nn::SwiGLUImpl& expert(int64_t e) const { return *experts->ptr<nn::SwiGLUImpl>(static_cast<size_t>(e)); }

  int64_t num_experts, top_k;
  bool norm_topk_prob;
  nn::Linear gate{nullptr};  // (E, C)
  torch::nn::ModuleList experts{nullptr};  // nn::SwiGLU each
};
FSDP_MODULE(SparseMoeBlock);

// Hugging Face's load_balancing_loss_func over the sparse layers of one
// forward, from each layer's router statistics and its token count:
// E * sum_e f_e * P_e, with f_e the fraction of routing slots and P_e the
// mean routing probability of expert e over all layers' tokens. Unscaled
// (the model multiplies by router_aux_loss_coef).
torch::Tensor load_balancing_loss(const std::vector<torch::Tensor>& router_stats, int64_t tokens_per_layer);

}  // namespace fsdp::models
