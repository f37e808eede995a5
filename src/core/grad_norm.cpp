#include "fsdp/core/grad_norm.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/nn/module.h>

#include "fsdp/common/error.h"
#include "core/fsdp_state.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/distributed/collectives.h"
#include "kernels/kernels.h"

namespace fsdp {
namespace {

// The squared L2 norm in double without a double copy of the gradient: in
// fixed-size pieces, summed in order, so the result does not depend on the
// number of threads.
double sum_of_squares(const at::Tensor& g) {
  if (g.scalar_type() != at::kFloat || !g.is_cpu() || !g.is_contiguous()) {
    return g.to(at::kDouble).pow(2).sum().item<double>();
  }
  RECORD_USER_SCOPE("fsdp::grad_norm");
  constexpr int64_t kPiece = 1 << 16;
  const float* x = g.data_ptr<float>();
  const int64_t n = g.numel(), pieces = (n + kPiece - 1) / kPiece;
  std::vector<double> partial(static_cast<size_t>(pieces));
  at::parallel_for(0, pieces, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      partial[static_cast<size_t>(i)] = kernels::sum_of_squares(x + i * kPiece, std::min(kPiece, n - i * kPiece));
    }
  });
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

// max that keeps a NaN, as torch's does: a NaN gradient gives a NaN norm.
double largest(double a, double b) { return std::isnan(a) || std::isnan(b) ? std::nan("") : std::max(a, b); }

// One group's share of the norm: host gradients fold in as they come; a
// GPU's stay on it and are read with one synchronisation at the end
// instead of one per parameter. There the L2 norm is PyTorch's: one norm
// per gradient with fp32 accumulation (`_foreach_norm`, a few launches for
// them all), squared and summed in double. A double copy of every gradient
// would cost more than the optimizer step on a large model.
struct Partial {
  double host = 0;
  std::vector<at::Tensor> device;

  void add(const at::Tensor& g, bool inf) {
    if (g.numel() == 0) return;
    if (g.is_cpu()) {
      host = inf ? largest(host, g.abs().max().item<double>()) : host + sum_of_squares(g);
    } else {
      device.push_back(inf ? g.abs().max().to(at::kDouble) : g);
    }
  }

  double value(bool inf) const {
    if (device.empty()) return host;
    if (inf) return largest(host, at::stack(device).max().item<double>());  // max keeps a NaN
    const at::Tensor norms = at::stack(at::_foreach_norm(device, 2)).to(at::kDouble);
    return host + norms.square().sum().item<double>();
  }
};

}  // namespace

double grad_norm(torch::nn::Module& root, double norm_type) {
  const bool inf = std::isinf(norm_type) && norm_type > 0;
  FSDP_CHECK(inf || norm_type == 2.0, "clip_grad_norm_: norm_type ", norm_type,
             ": expected 2 (L2) or infinity (the largest magnitude)");
  // Sharded gradients combine across their unit's shard group (squares
  // add up, maxima take the largest); replicated ones (no unit, or ignored)
  // are the same everywhere and count once. Across replicas (HSDP) the
  // reduced gradients are identical, so each shard group alone gives its
  // units' share. Units may live in different shard groups: one partial per
  // group, each all-reduced in its group, in the order the groups first
  // appear in module order (the same on every rank).
  std::unordered_map<const void*, size_t> group_of_param;  // -> index into groups
  std::vector<dist::ProcessGroup*> groups;
  for (const auto& item : root.named_modules("", true)) {
    FSDPState* state = detail::state_of(*item.value());
    if (state == nullptr || state->group() == nullptr) continue;
    dist::ProcessGroup* g = &state->group()->shard_group();
    auto it = std::find(groups.begin(), groups.end(), g);
    const auto index = static_cast<size_t>(it - groups.begin());
    if (it == groups.end()) groups.push_back(g);
    for (const FSDPParam* p : state->group()->params()) group_of_param[p->param.unsafeGetTensorImpl()] = index;
  }
  std::vector<Partial> sharded(groups.size());
  Partial replicated;
  for (const auto& p : unique_parameters(root)) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    const auto it = group_of_param.find(p.unsafeGetTensorImpl());
    (it != group_of_param.end() ? sharded[it->second] : replicated).add(g, inf);
  }
  double total = replicated.value(inf);
  for (size_t i = 0; i < groups.size(); ++i) {
    double value = sharded[i].value(inf);
    if (groups[i]->size() > 1 && inf) {
      // The maximum, and whether any rank saw a NaN (a collective's max
      // need not propagate one).
      const bool nan = std::isnan(value);
      at::Tensor t = at::tensor({nan ? 0.0 : value, nan ? 1.0 : 0.0}, at::kDouble);
      dist::all_reduce(*groups[i], t, dist::ReduceOp::kMax).wait();
      value = t[1].item<double>() > 0 ? std::nan("") : t[0].item<double>();
    } else if (groups[i]->size() > 1) {
      at::Tensor t = at::full({1}, value, at::kDouble);
      dist::all_reduce(*groups[i], t, dist::ReduceOp::kSum).wait();
      value = t.item<double>();
    }
    total = inf ? largest(total, value) : total + value;
  }
  return inf ? total : std::sqrt(total);
}

double clip_factor(double norm, double max_norm) { return max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0; }

double clip_grad_norm_(torch::nn::Module& root, double max_norm, double norm_type) {
  const double norm = grad_norm(root, norm_type);
  scale_gradients(root, clip_factor(norm, max_norm));
  return norm;
}

void scale_gradients(torch::nn::Module& root, double factor) {
  if (factor == 1.0) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : unique_parameters(root)) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  at::_foreach_mul_(grads, factor);  // on a GPU, a few launches instead of one per gradient
}

}  // namespace fsdp
