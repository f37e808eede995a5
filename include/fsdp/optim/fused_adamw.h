#pragma once
// AdamW in one pass over every parameter: torch::optim::AdamW's update and
// state, computed by a single fused loop instead of about ten tensor ops
// (each a full read and write) per parameter. Under FSDP the parameters are
// views of each unit's flat shard, so the pass streams through the shards
// in order. The state stays torch's AdamWParamState per parameter, so
// checkpoints, resharding and the grad scaler see an ordinary AdamW.

#include <torch/optim/adamw.h>

namespace fsdp::optim {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  // Fused when every parameter with a gradient is a contiguous fp32 CPU
  // tensor with a dense gradient like it and amsgrad is off; on a GPU
  // (LibTorch 2.1 and later), LibTorch's fused AdamW kernel, one launch per
  // parameter group, with the gradients scaled in place; otherwise
  // torch::optim::AdamW's own step (the same update, op by op).
  torch::Tensor step(LossClosure closure = nullptr) override;

  // A step as if every gradient had first been multiplied by
  // `gradient_scale` (gradient clipping's factor), bit for bit, without
  // the pass that multiplies them: the fused loop scales each gradient as
  // it reads it and leaves the gradients unscaled. Off the fused path the
  // gradients are scaled in place, then torch's step runs.
  torch::Tensor step_scaled(double gradient_scale);

  // Whether the last step took the fused path.
  bool last_step_fused() const { return last_step_fused_; }

 private:
  bool fusable() const;
  void fused_step(float gradient_scale);
  torch::optim::AdamWParamState& stepped_state(const torch::Tensor& p);
  bool device_fusable() const;
  void device_fused_step(double gradient_scale);

  bool last_step_fused_ = false;
};

}  // namespace fsdp::optim
