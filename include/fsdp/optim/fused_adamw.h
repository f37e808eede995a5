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

  // The fused step of `params` alone (each one of this optimizer's, with its
  // gradient; others are left as they are): one unit's step while backward
  // goes on with the others (the trainer's --overlap-host-step). CPU fp32
  // parameters only, state not offloaded; `serial` keeps it to the calling
  // thread (a worker beside the training thread). Not thread-safe against
  // another step of this optimizer: one caller at a time.
  void step_params(const std::vector<torch::Tensor>& params, double gradient_scale, bool serial);

  // Whether the last step took the fused path.
  bool last_step_fused() const { return last_step_fused_; }

  // Optimizer offload (the trainer's --optimizer-offload): the moments live
  // on the host (memory::empty_host, page-locked beside a GPU when
  // `pin_memory`), in fp32 for every parameter. Each step copies each
  // gradient and parameter to the host, runs the fused update there, and
  // copies the parameters back; parameters and gradients stay where they
  // are. Bit for bit the step without offload for fp32 parameters; a bf16
  // or fp16 parameter is updated in fp32 and rounded once. State made
  // elsewhere (a checkpoint loaded, offload turned on or off) moves to its
  // side at the next step. amsgrad is refused.
  void set_state_offload(bool offload, bool pin_memory = true);
  bool state_offloaded() const { return offload_state_; }

 private:
  bool fusable() const;
  void fused_step(float gradient_scale);
  torch::optim::AdamWParamState& stepped_state(const torch::Tensor& p);
  bool device_fusable() const;
  void device_fused_step(double gradient_scale);

  void offloaded_step(float gradient_scale);
  // Moves a parameter's moments to where this optimizer keeps them: the
  // host under offload, else beside the parameter.
  void place_state(torch::optim::AdamWParamState& s, const torch::Tensor& p) const;

  bool last_step_fused_ = false;
  bool offload_state_ = false;
  bool pin_memory_ = true;
};

}  // namespace fsdp::optim
