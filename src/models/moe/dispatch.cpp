#include "fsdp/models/moe/dispatch.h"

#include <vector>

namespace fsdp::models {

// [Note: expert dispatch]
// Each token has k routing slots (token t's j-th choice is slot t * k + j).
// Sorting the slots by expert makes each expert's slots one contiguous run;
// the expert gathers its tokens (index_select), computes them, and
// index_add_ puts them back at their tokens, weighted by their routing
// weight on the way in or out. Work is proportional to N * k, not N * E
// as with computing every expert on every token under a mask.
//
// Device: the sort, the gathers and the sums stay on the tokens' device;
// the host reads one thing, the E slot counts (one copy per layer), since
// they are the loop's bounds.
//
// Unused experts, one rule for every family: every expert runs on its
// rows, one that no token chose on none. That costs nothing and gives its
// parameters a gradient of zeros, as one fused expert tensor would
// (transformers' layout), so AdamW's decay and moments move for it at
// every world size and every rank holds the same set of gradients.
std::pair<torch::Tensor, torch::Tensor> dispatch_to_experts(const torch::Tensor& tokens, const torch::Tensor& chosen,
                                                            const torch::Tensor& slot_weights, int64_t num_experts,
                                                            RoutingWeightAt weight_at, const ExpertFn& expert) {
  const int64_t top_k = chosen.size(-1);
  const auto slot_expert = chosen.reshape({-1});  // (N * k)
  const auto order = std::get<1>(slot_expert.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  const auto counts = torch::bincount(slot_expert, {}, num_experts);  // (E) int64, on the device
  const auto host_counts = counts.cpu();
  const auto* count = host_counts.data_ptr<int64_t>();

  auto out = torch::zeros_like(tokens);
  int64_t begin = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    const auto slots = order.narrow(0, begin, count[e]);
    const auto token_ids = slots.div(top_k, "floor");
    const auto weights = slot_weights.index_select(0, slots).unsqueeze(1);
    auto rows = tokens.index_select(0, token_ids);
    if (weight_at == RoutingWeightAt::kInput) rows = rows * weights;
    auto y = expert(e, rows);
    if (weight_at == RoutingWeightAt::kOutput) y = y * weights;
    out.index_add_(0, token_ids, y);
    begin += count[e];
  }
  return {out, counts.to(torch::kFloat)};
}

}  // namespace fsdp::models
