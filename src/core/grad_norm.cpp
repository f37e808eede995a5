#include "fsdp/core/grad_norm.h"

#include <cmath>
#include <unordered_set>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "fsdp/core/fsdp_state.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/dist/collectives.h"

namespace fsdp {

double clip_grad_norm_(torch::nn::Module& root, double max_norm) {
  // Sharded gradients add up across the shard group; replicated ones (no
  // unit, or ignored) are the same everywhere and count once. Across
  // replicas (HSDP) the reduced gradients are identical, so the shard group
  // alone gives the global norm.
  std::unordered_set<const void*> sharded;
  dist::ProcessGroup* shard_group = nullptr;
  for (const auto& item : root.named_modules("", true)) {
    FSDPState* state = detail::state_of(*item.value());
    if (state == nullptr || state->group() == nullptr) continue;
    shard_group = &state->group()->shard_group();
    for (const auto& p : state->group()->params()) sharded.insert(p.param.unsafeGetTensorImpl());
  }
  at::Tensor sharded_sq = at::zeros({1}, at::kDouble);
  at::Tensor replicated_sq = at::zeros({1}, at::kDouble);
  std::vector<at::Tensor> grads;
  for (const auto& p : unique_parameters(root)) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    at::Tensor sq = g.to(at::kDouble).pow(2).sum().reshape({1});
    (sharded.count(p.unsafeGetTensorImpl()) != 0 ? sharded_sq : replicated_sq).add_(sq);
  }
  if (shard_group != nullptr && shard_group->size() > 1) dist::all_reduce(*shard_group, sharded_sq).wait();
  const double norm = std::sqrt((sharded_sq + replicated_sq).item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (auto& g : grads) g.mul_(scale);
  }
  return norm;
}

}  // namespace fsdp
