#include "fsdp/core/grad_scaler.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "fsdp/common/error.h"
#include "fsdp/distributed/collectives.h"

namespace fsdp {

ShardedGradScaler::ShardedGradScaler(dist::ProcessGroup& group, GradScalerOptions options)
    : group_(group), options_(options), scale_(options.init_scale) {
  FSDP_CHECK(options.init_scale > 0 && options.growth_factor > 1 && options.backoff_factor > 0 &&
                 options.backoff_factor < 1 && options.growth_interval >= 1,
             "ShardedGradScaler: expected init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, "
             "growth_interval >= 1");
}

at::Tensor ShardedGradScaler::scale(const at::Tensor& loss) const { return loss * scale_; }

void ShardedGradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (unscaled_) return;
  unscaled_ = true;
  at::Tensor local_inf = at::zeros({1}, at::kFloat);
  const double inv = 1.0 / scale_;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      p.mutable_grad().mul_(inv);
      if (p.grad().numel() > 0 && !p.grad().isfinite().all().item<bool>()) local_inf.fill_(1);
    }
  }
  // One rank's overflow is everyone's: the shards make up one gradient.
  dist::all_reduce(group_, local_inf, dist::ReduceOp::kMax).wait();
  found_inf_ = local_inf.item<float>() > 0;
}

bool ShardedGradScaler::step(torch::optim::Optimizer& optimizer) {
  unscale_(optimizer);
  if (found_inf_) return false;
  optimizer.step();
  return true;
}

void ShardedGradScaler::update() {
  if (found_inf_) {
    scale_ *= options_.backoff_factor;
    clean_steps_ = 0;
  } else if (++clean_steps_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    clean_steps_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
}

}  // namespace fsdp
