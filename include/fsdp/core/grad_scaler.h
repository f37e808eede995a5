#pragma once
// Loss scaling for fp16 compute with sharded gradients (the sharded
// counterpart of torch.cuda.amp.GradScaler). Each rank sees only its shard
// of the gradients, so whether any of them overflowed is agreed across all
// ranks before the step: all ranks skip together or step together.
//
//   fsdp::ShardedGradScaler scaler(world->group());
//   scaler.scale(loss).backward();
//   scaler.unscale_(optimizer);            // before clipping, if you clip
//   fsdp::clip_grad_norm_(*model, 1.0);
//   scaler.step(optimizer);                // skipped if any rank saw inf/NaN
//   scaler.update();

#include <ATen/core/Tensor.h>

#include "fsdp/distributed/process_group.h"

namespace torch::optim {
class Optimizer;
}

namespace fsdp {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;  // steps without overflow before the scale grows
};

class ShardedGradScaler {
 public:
  explicit ShardedGradScaler(dist::ProcessGroup& group, GradScalerOptions options = {});

  at::Tensor scale(const at::Tensor& loss) const;
  // Divides every gradient by the scale and agrees on overflow across ranks.
  void unscale_(torch::optim::Optimizer& optimizer);
  // Unscales if not done yet; steps unless an overflow was found. Returns
  // whether the optimizer stepped.
  bool step(torch::optim::Optimizer& optimizer);
  // Backs off after an overflow, grows after growth_interval clean steps.
  void update();

  double get_scale() const { return scale_; }
  bool found_inf() const { return found_inf_; }

 private:
  dist::ProcessGroup& group_;
  GradScalerOptions options_;
  double scale_;
  int clean_steps_ = 0;
  bool unscaled_ = false;
  bool found_inf_ = false;
};

}  // namespace fsdp
