#include "fsdp/models/moe/moe.h"

#include "fsdp/common/error.h"
#include "fsdp/models/moe/dispatch.h"

namespace fsdp::models {

SparseMoeBlockImpl::SparseMoeBlockImpl(int64_t hidden, const MoEConfig& c)
    : num_experts(c.num_experts), top_k(c.num_experts_per_tok), norm_topk_prob(c.norm_topk_prob) {
  FSDP_CHECK(num_experts > 0 && top_k > 0 && top_k <= num_experts, "MoE: num_experts_per_tok ", top_k,
             " must be in 1..num_experts (", num_experts, ")");
  gate = register_module("gate", nn::Linear(hidden, num_experts, /*bias=*/false));
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < num_experts; ++e) experts->push_back(nn::SwiGLU(hidden, c.moe_intermediate_size));
}

// Routed as every MoE family is ([Note: expert dispatch] in dispatch.cpp),
// each routing weight multiplying its expert's output.
std::tuple<torch::Tensor, torch::Tensor> SparseMoeBlockImpl::forward(const torch::Tensor& x) {
  const int64_t C = x.size(-1);
  const auto tokens = x.reshape({-1, C});  // (N, C)
  const auto probs = torch::softmax(gate(tokens).to(torch::kFloat), -1);  // (N, E), fp32 as Hugging Face
  auto [weights, chosen] = probs.topk(top_k, -1);                          // (N, k)
  if (norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(x.scalar_type()).reshape({-1});  // per slot
  const auto [out, counts] =
      dispatch_to_experts(tokens, chosen, weights, num_experts, RoutingWeightAt::kOutput,
                          [&](int64_t e, const torch::Tensor& rows) { return expert(e).forward(rows); });
  auto stats = torch::stack({probs.sum(0), counts.to(probs.device())});
  return {out.view(x.sizes()), stats};
}

torch::Tensor load_balancing_loss(const std::vector<torch::Tensor>& router_stats, int64_t tokens_per_layer) {
  FSDP_CHECK(!router_stats.empty(), "load_balancing_loss: no sparse layers");
  auto total = router_stats[0];
  for (size_t i = 1; i < router_stats.size(); ++i) total = total + router_stats[i];
  const double all_tokens = static_cast<double>(tokens_per_layer) * static_cast<double>(router_stats.size());
  const int64_t E = total.size(1);
  // f_e sums over the k choices (Hugging Face's mean over tokens of the
  // (k, E) one-hot, summed with P_e broadcast over k).
  const auto slots_fraction = total[1] / all_tokens;  // (E)
  const auto mean_prob = total[0] / all_tokens;       // (E)
  return (slots_fraction * mean_prob).sum() * static_cast<double>(E);
}

}  // namespace fsdp::models
