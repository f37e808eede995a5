#pragma once
// When a unit is gathered, released and reduced (FSDP2's FSDPState):
// pre-forward, post-forward, pre-backward, post-backward, and the end of
// backward. Internal to fsdp.cpp's core. See [Note: when a unit's backward
// ends] in fsdp_state.cpp.

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdp/common/compat.h"

#include "fsdp/core/comm_context.h"
#include "fsdp/core/fsdp_param_group.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/core/options.h"

namespace torch::autograd {
struct Node;
}

namespace fsdp {

enum class TrainingState { kIdle, kForward, kPreBackward, kPostBackward };

class FSDPState;

// Shared by every unit of one module tree; owned jointly by its units.
struct FSDPTree {
  std::vector<FSDPState*> states;         // every unit, root first, then module order
  std::vector<FSDPState*> forward_order;  // pre-forward order, recorded in the first iteration
  std::vector<FSDPState*> post_forward_order;  // this iteration's, one entry per call (backward prefetch)
  bool recording_order = true;
  // A forward with gradients ran and its backward has not finished.
  bool iteration_open = false;
  std::vector<compat::AutogradNodeWeakPtr> open_graphs;  // the root outputs' grad_fns
  bool in_backward = false;
  bool callback_queued = false;
  int64_t backward_count = 0;  // backwards finished or abandoned
  CommContext comm;
};

class FSDPState {
 public:
  FSDPState(std::unique_ptr<FSDPParamGroup> group, const FullyShardOptions& options);
  // Leaves the tree: a unit whose module goes first leaves no dangling entry,
  // and units outliving their root become roots of their own.
  ~FSDPState();
  FSDPState(const FSDPState&) = delete;
  FSDPState& operator=(const FSDPState&) = delete;

  // One call of the unit through fsdp::call (see detail::CallFrame).
  detail::CallFrame pre_forward();
  // Puts the post-backward node on the call's floating inputs that require
  // gradients (replacing them with its outputs).
  void wrap_inputs(detail::CallFrame& frame, const std::vector<at::Tensor*>& inputs);
  at::Tensor cast_input(const at::Tensor& input) const;
  void post_forward(const detail::CallFrame& frame, std::vector<at::Tensor>& outputs);
  // The call threw: leave the unit (the whole tree, for the root) ready.
  void on_forward_error(const detail::CallFrame& frame) noexcept;

  void pre_backward();
  // The post-backward node of one call ran: the gradients of that call's inputs exist.
  void on_inputs_grad();

  FSDPParamGroup* group() { return group_.get(); }
  const FSDPParamGroup* group() const { return group_.get(); }
  bool is_root() const { return is_root_; }
  const std::string& name() const { return name_; }
  const FullyShardOptions& options() const { return options_; }
  const std::shared_ptr<FSDPTree>& tree() const { return tree_; }

  // Set when an ancestor becomes the root of a tree that contains this unit.
  void join_tree(const std::shared_ptr<FSDPTree>& tree, bool is_root, const std::string& name);

  std::vector<FSDPState*> forward_prefetch;   // explicit, if set
  std::vector<FSDPState*> backward_prefetch;  // explicit, if set

  // End of backward for the whole tree (the root's queued callback).
  static void end_of_backward(FSDPTree& tree);
  // After an error: every collective issued is finished, every unit
  // resharded, per-iteration state cleared. `keep_open`: an earlier forward's
  // graph may still be backwarded.
  static void abandon_iteration(FSDPTree& tree, bool keep_open) noexcept;
  // Every graph of the open iteration was freed without a backward (a
  // forward with gradients whose result was dropped): units go back to
  // sharded, with the gradients they had, before the optimizer runs.
  static void drop_iteration(FSDPTree& tree) noexcept;

 private:
  void begin_iteration();
  // The per-iteration record of this unit's calls, back to none.
  void forget_calls();
  void post_backward();
  void prefetch_forward();
  void prefetch_backward();
  void issue_unshard(FSDPState* s) const;

  std::unique_ptr<FSDPParamGroup> group_;  // null for a unit without parameters of its own
  FullyShardOptions options_;
  bool reshard_after_forward_;
  TrainingState training_state_ = TrainingState::kIdle;
  std::shared_ptr<FSDPTree> tree_;
  bool is_root_ = false;
  std::string name_;

  // Per iteration: calls whose post-backward node has not run yet, calls
  // registered (restored after backward, for a second backward through a
  // retained graph), and whether a call needing backward had no input to
  // carry the node (its backward's end is only known at the end of backward).
  int pending_backward_calls_ = 0;
  int registered_calls_ = 0;
  bool unsignalled_call_ = false;
  std::vector<size_t> post_forward_indices_;  // this unit's positions in tree->post_forward_order
  size_t backward_cursor_ = 0;
};

}  // namespace fsdp
