#pragma once
// When a unit is gathered and released (FSDP2's FSDPState): pre-forward,
// post-forward, pre-backward, and the root's end-of-backward callback that
// waits for the reduce-scatters. Internal to fsdp.cpp's core.

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdp/core/fsdp_param_group.h"
#include "fsdp/core/options.h"

namespace fsdp {

enum class TrainingState { kIdle, kForward, kPreBackward };

class FSDPState;

// Shared by every unit of one module tree; owned by the root.
struct FSDPTree {
  std::vector<FSDPState*> states;         // every unit, in module order, root included
  std::vector<FSDPState*> forward_order;  // as recorded during the first forward
  bool recording_order = true;
  bool in_backward = false;  // between the root's pre-backward and the end of backward
  bool callback_queued = false;
};

class FSDPState {
 public:
  FSDPState(std::unique_ptr<FSDPParamGroup> group, const FullyShardOptions& options);

  void pre_forward();
  void post_forward(std::vector<at::Tensor>& outputs);
  at::Tensor cast_input(const at::Tensor& input) const;
  void pre_backward();

  FSDPParamGroup* group() { return group_.get(); }
  const FSDPParamGroup* group() const { return group_.get(); }
  bool is_root() const { return is_root_; }
  const FullyShardOptions& options() const { return options_; }

  // Set when an ancestor becomes the root of a tree that contains this unit.
  void join_tree(const std::shared_ptr<FSDPTree>& tree, bool is_root);

  std::vector<FSDPState*> forward_prefetch;   // explicit, if set
  std::vector<FSDPState*> backward_prefetch;  // explicit, if set

 private:
  void lazy_init_as_root();
  void begin_iteration();
  void prefetch(const std::vector<FSDPState*>& explicit_list, int direction);
  static void end_of_backward(const std::shared_ptr<FSDPTree>& tree);

  std::unique_ptr<FSDPParamGroup> group_;  // null for a unit without parameters of its own
  FullyShardOptions options_;
  bool reshard_after_forward_;
  TrainingState training_state_ = TrainingState::kIdle;
  std::shared_ptr<FSDPTree> tree_;
  bool is_root_ = false;
};

}  // namespace fsdp
