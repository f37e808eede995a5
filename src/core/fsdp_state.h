#pragma once
// When a unit is gathered, released and reduced (FSDP2's FSDPState): the
// hooks of one unit's calls, pre-forward, post-forward, pre-backward and
// post-backward. The tree's life around them (the iteration, the end of
// backward, errors and dropped graphs) is FSDPTree's (fsdp_tree.h).
// Internal to fsdp.cpp's core.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdp/common/compat.h"

#include "fsdp/core/fully_shard.h"
#include "fsdp/core/options.h"

#include "core/comm_context.h"
#include "core/fsdp_param_group.h"
#include "core/fsdp_tree.h"
#include "core/units.h"

namespace fsdp {

// What one unit is doing (FSDP2's TrainingState).
enum class TrainingState {
  kIdle,          // between calls, and after the end of backward
  kForward,       // inside a call through fsdp::call / fsdp::run
  kPreBackward,   // a call's outputs got their gradient, or a recomputation in backward: gathered
  kPostBackward,  // its backward is done: resharded, reduction handed over (once per gathering)
};
const char* to_string(TrainingState state);

// A unit's TrainingState, changed only through enter(), which refuses a
// transition the design does not have and names both states (the table is
// [Note: the training state machine] in fsdp_state.cpp). There is no
// assignment from a TrainingState: a change that skips the table does not
// compile.
class TrainingStateMachine {
 public:
  TrainingState get() const { return state_; }
  // `recomputing`: the unit is recomputed inside backward. `unit` and
  // `phase` name the unit and its tree's phase in the error.
  void enter(TrainingState next, bool recomputing, const std::string& unit, const char* phase);
  // Back to idle, allowed from every state: for the paths that clean up
  // after an error or a dropped graph, which must not throw.
  void enter_idle() noexcept { state_ = TrainingState::kIdle; }

 private:
  TrainingState state_ = TrainingState::kIdle;
};

// What one call of a unit found and did, for its post-forward.
struct CallFrame {
  bool grad_enabled = false;
  bool in_backward = false;     // recomputation inside backward (activation checkpointing)
  bool was_unsharded = false;   // gathered before this call: a no-grad call leaves it so
  bool wrapped_inputs = false;  // a post-backward node sits on this call's inputs
  bool opened_iteration = false;
  // A unit of several modules: a call after the first of the round, whose
  // hooks ran at that first call (FSDPState::pre_forward).
  bool inner = false;
  const torch::nn::Module* module = nullptr;  // the module called
};

// One unit's calls in the open iteration, back to empty with one reset().
struct UnitCalls {
  int pending_backward = 0;  // calls (and recomputations) whose post-backward node has not run in this backward
  int registered = 0;        // forward calls carrying such a node
  // A call needing backward had no input to carry the node: its backward's
  // end is only known at the end of backward.
  bool unsignalled = false;
  std::vector<size_t> post_forward_indices;  // positions in the tree's post-forward order
  size_t backward_cursor = 0;                // next index to prefetch backward from
  // A unit of several modules: those yet to run in this round of calls,
  // and the frame of the round's first call, whose hooks stand for all.
  std::vector<const torch::nn::Module*> modules_to_run;
  CallFrame round_frame;
  void reset() { *this = UnitCalls(); }
  // For another backward through a retained graph: the same calls again.
  void rearm() {
    pending_backward = registered;
    backward_cursor = post_forward_indices.size();
  }
};

class FSDPState : public detail::CallHooks, public std::enable_shared_from_this<FSDPState> {
 public:
  FSDPState(std::unique_ptr<FSDPParamGroup> group, const FullyShardOptions& options);
  // Leaves the tree: a unit whose module goes first leaves no dangling entry,
  // and units outliving their root become roots of their own.
  ~FSDPState();
  FSDPState(const FSDPState&) = delete;
  FSDPState& operator=(const FSDPState&) = delete;

  // One call of the unit through fsdp::call (detail::CallScope): its
  // pre-forward opens a frame, which the call's other hooks read and its
  // post-forward (or, if the call threw, on_forward_error) closes. Calls of
  // one unit nest, so the open frames are a stack.
  void pre_forward(const torch::nn::Module& module) override;
  // Puts the post-backward node on the call's floating inputs that require
  // gradients (replacing them with its outputs).
  void wrap_inputs(const std::vector<at::Tensor*>& inputs) override;
  at::Tensor cast_input(const at::Tensor& input) const override;
  void post_forward(const torch::nn::Module& module, std::vector<at::Tensor>& outputs) override;
  // The call threw: leave the unit (the whole tree, for the root) ready.
  void on_forward_error() noexcept override;

  void pre_backward();
  // The post-backward node of one call ran: the gradients of that call's inputs exist.
  void on_inputs_grad();

  FSDPParamGroup* group() { return group_.get(); }
  const FSDPParamGroup* group() const { return group_.get(); }
  ShardingStrategy strategy() const { return strategy_; }
  bool is_root() const { return is_root_; }
  const std::string& name() const { return name_; }
  const std::shared_ptr<FSDPTree>& tree() const { return tree_; }
  TrainingState training_state() const { return training_.get(); }

  // Over how many ranks post-forward leaves the parameters sharded: the
  // shard group's size (freed, even where that is one rank: a unit gathered
  // in another dtype than its shard's frees the cast copy), nullopt (kept
  // gathered) or a divisor between. By
  // default the strategy decides (full_shard, hybrid_shard free them), and
  // the root keeps them, since its backward starts right after its
  // forward; set explicitly (FullyShardOptions::reshard_after_forward,
  // fsdp::set_reshard_after_forward) it holds for the root too. Setting a
  // divisor makes its groups, so every rank sets it at the same point.
  std::optional<int> post_forward_ranks() const;
  void set_reshard_after_forward(ReshardAfterForward reshard);

  // The modules this unit was applied to (more than one: FSDP2's list form).
  void set_modules(std::vector<const torch::nn::Module*> modules) { modules_ = std::move(modules); }
  const std::vector<const torch::nn::Module*>& modules() const { return modules_; }

  // Set when an ancestor becomes the root of a tree that contains this unit.
  void join_tree(const std::shared_ptr<FSDPTree>& tree, bool is_root, const std::string& name);

  std::vector<FSDPState*> forward_prefetch;   // explicit, if set
  std::vector<FSDPState*> backward_prefetch;  // explicit, if set

  // --- what the tree (fsdp_tree.h) asks of each unit -----------------------
  // A new iteration: the calls of the last one are forgotten.
  void reset_calls();
  // A unit of several modules whose round is still open (one of its modules
  // did not run) finishes it: idle, and either ending at the end of
  // backward (gradients enabled) or resharded.
  void close_open_round(bool grad_enabled);
  // After the root's forward without gradients: a gather prefetched for a
  // call that never came is finished and freed.
  void release_unused_prefetch();
  // At the end of backward: still gathered, or owing a reduction its peers
  // may issue, without having run post-backward in this backward.
  bool owes_post_backward() const;
  // Resharded, reduction handed over; once per gathering in backward.
  void post_backward();
  // The end of backward, after the reductions: idle, ready for another
  // backward through a retained graph, a stale prefetch freed.
  void finish_backward();
  // The open iteration's graph was dropped, or an error ended it
  // (`keep_open`: an earlier forward's graph may still be backwarded).
  void drop_forward() noexcept;
  void abandon(bool keep_open) noexcept;
  // `gone` is being destroyed: no list of this unit names it afterwards.
  void forget(const FSDPState* gone);

 private:
  // Checked transition (see TrainingState); any state may go back to idle.
  // `recomputing`: the unit is recomputed inside backward.
  void enter(TrainingState next, bool recomputing = false);
  void finish_call(const CallFrame& frame, std::vector<at::Tensor>& outputs);
  // The root's post-forward over the other units of its tree.
  void arm_pre_backward(std::vector<at::Tensor>& outputs);
  void prefetch_forward();
  void prefetch_backward();
  void issue_unshard(FSDPState* s) const;

  // Null for a unit without parameters of its own; shared so that its
  // autograd hooks reach it through weak pointers.
  std::shared_ptr<FSDPParamGroup> group_;
  // Of the options the unit was sharded with, what its hooks read (the
  // rest, param_init's closure above all, is not kept alive by the unit).
  MixedPrecisionPolicy mixed_precision_;
  int prefetch_depth_;
  ShardingStrategy strategy_;
  bool strategy_reshards_after_forward_;           // full_shard, hybrid_shard
  std::optional<ReshardAfterForward> reshard_after_forward_set_;  // explicitly, for this unit
  TrainingStateMachine training_;
  std::vector<CallFrame> open_calls_;
  std::shared_ptr<FSDPTree> tree_;
  bool is_root_ = false;
  std::string name_;
  // Allocation-log phases this unit labels its hooks with, interned once
  // (common/allocation_log.h).
  struct Phases {
    int32_t forward = 0, recompute = 0, backward = 0, post_backward = 0, between_forward = 0, between_backward = 0;
  } phases_;
  std::vector<const torch::nn::Module*> modules_;

  UnitCalls calls_;
};

}  // namespace fsdp
