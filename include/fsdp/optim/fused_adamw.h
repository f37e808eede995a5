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
  // tensor with a dense gradient like it and amsgrad is off; otherwise
  // torch::optim::AdamW's own step (the same update, op by op).
  torch::Tensor step(LossClosure closure = nullptr) override;

  // Whether the last step took the fused path.
  bool last_step_fused() const { return last_step_fused_; }

 private:
  bool fusable() const;

  bool last_step_fused_ = false;
};

}  // namespace fsdp::optim
