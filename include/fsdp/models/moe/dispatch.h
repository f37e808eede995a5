#pragma once
// Routing tokens to experts, for every Mixture-of-Experts family
// (Qwen3-MoE's SparseMoeBlock, Llama 4's Llama4Moe): the families choose
// the experts and the weights; this runs each expert on its tokens only
// and sums the results back at their tokens ([Note: expert dispatch]).

#include <cstdint>
#include <functional>
#include <utility>

#include <torch/torch.h>

namespace fsdp::models {

// Where a token's routing weight multiplies: the expert's output
// (Qwen3-MoE: a probability-weighted sum of expert outputs) or its input
// (Llama 4: the sigmoid of the router logit scales what the expert sees).
enum class RoutingWeightAt { kOutput, kInput };

// One expert's computation on the rows routed to it ((n, C) -> (n, C)).
using ExpertFn = std::function<torch::Tensor(int64_t expert, const torch::Tensor& rows)>;

// tokens (N, C); chosen (N, k) expert ids, slot t * k + j being token t's
// j-th choice; slot_weights (N * k) in the tokens' dtype. Returns the
// routed output (N, C) and how many slots each expert got ((E) fp32, on
// the tokens' device, for the router statistics).
std::pair<torch::Tensor, torch::Tensor> dispatch_to_experts(const torch::Tensor& tokens, const torch::Tensor& chosen,
                                                            const torch::Tensor& slot_weights, int64_t num_experts,
                                                            RoutingWeightAt weight_at, const ExpertFn& expert);

}  // namespace fsdp::models
