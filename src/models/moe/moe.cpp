#include "fsdp/models/moe/moe.h"

#include "fsdp/common/error.h"

namespace fsdp::models {

SparseMoeBlockImpl::SparseMoeBlockImpl(int64_t hidden, const MoEConfig& c)
    : num_experts(c.num_experts), top_k(c.num_experts_per_tok), norm_topk_prob(c.norm_topk_prob) {
  FSDP_CHECK(num_experts > 0 && top_k > 0 && top_k <= num_experts, "MoE: num_experts_per_tok ", top_k,
             " must be in 1..num_experts (", num_experts, ")");
  gate = register_module("gate", nn::Linear(hidden, num_experts, /*bias=*/false));
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < num_experts; ++e) {
    expert_list.emplace_back(hidden, c.moe_intermediate_size);
    experts->push_back(expert_list.back());
  }
}

// [Note: expert dispatch]
// Each token has k routing slots (token t's j-th choice is slot t * k + j).
// Sorting the slots by expert makes each expert's slots one contiguous run;
// the expert gathers its tokens (index_select), computes them, weights them
// by their routing probability, and index_add_ puts them back at their
// tokens. An expert with no slots does no work and gets a zero gradient.
// Work is proportional to N * k, not
// N * E as with computing every expert on every token under a mask.
std::tuple<torch::Tensor, torch::Tensor> SparseMoeBlockImpl::forward(const torch::Tensor& x) {
  const int64_t C = x.size(-1);
  const auto tokens = x.reshape({-1, C});  // (N, C)
  const auto probs = torch::softmax(gate(tokens).to(torch::kFloat), -1);  // (N, E), fp32 as Hugging Face
  auto [weights, chosen] = probs.topk(top_k, -1);                          // (N, k)
  if (norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(x.scalar_type()).reshape({-1});  // per slot

  const auto slot_expert = chosen.reshape({-1});  // (N * k)
  const auto order = std::get<1>(slot_expert.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  const auto counts = torch::bincount(slot_expert, {}, num_experts).cpu();  // (E) int64, read on the host
  const auto* count = counts.data_ptr<int64_t>();

  auto out = torch::zeros_like(tokens);
  int64_t begin = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (count[e] == 0) {
      // An expert no token chose still gets a gradient, zero, as one
      // fused expert tensor would (transformers' layout): computing it on
      // no rows costs nothing and keeps AdamW's decay and moments moving
      // for it at every world size.
      if (torch::GradMode::is_enabled()) out = out + expert_list[static_cast<size_t>(e)](tokens.narrow(0, 0, 0)).sum();
      continue;
    }
    const auto slots = order.narrow(0, begin, count[e]);
    const auto token_ids = slots.div(top_k, "floor");
    auto y = expert_list[static_cast<size_t>(e)](tokens.index_select(0, token_ids));
    out.index_add_(0, token_ids, y * weights.index_select(0, slots).unsqueeze(1));
    begin += count[e];
  }
  auto stats = torch::stack({probs.sum(0), counts.to(probs.device(), torch::kFloat)});
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
