#pragma once
// The life of one module tree under fully_shard, apart from its units'
// hooks (FSDP2 keeps _root_pre_forward and the final backward callback
// apart from the per-state hooks in the same way): which units it holds,
// the iteration a root forward opens, the order units ran in (for
// prefetching), the end of backward, and the two ways an iteration ends
// without one (an error, a dropped graph). Internal to fsdp.cpp's core.
// See [Note: when a unit's backward ends] in fsdp_tree.cpp.

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdp/common/compat.h"

#include "core/comm_context.h"
#include "core/device_streams.h"
#include "core/event_log.h"
#include "core/fsdp_collectives.h"

namespace fsdp {

class FSDPState;

// What the whole tree is doing; changed only through TreeIteration::enter
// ([Note: the tree's phase] in fsdp_tree.cpp).
enum class TreePhase {
  kIdle,      // no forward with gradients awaits a backward
  kForward,   // an iteration is open: forwards with gradients ran, their backward has not started
  kBackward,  // a backward is running; the end-of-backward callback is queued
};
const char* to_string(TreePhase phase);

// The tree's record of the open iteration, back to empty with one reset().
class TreeIteration {
 public:
  TreePhase phase() const { return phase_; }
  // Refuses a change the table does not have, naming both phases.
  void enter(TreePhase next);
  void reset() noexcept { *this = TreeIteration(); }

  // The root outputs' grad_fns: whether a graph of this iteration can
  // still be backwarded.
  void add_graph(const compat::AutogradNodePtr& graph) { open_graphs_.emplace_back(graph); }
  bool has_live_graph() const;
  // One entry per call needing backward, in post-forward order (backward
  // prefetching walks it from the end).
  std::vector<FSDPState*> post_forward_order;

 private:
  TreePhase phase_ = TreePhase::kIdle;
  std::vector<compat::AutogradNodeWeakPtr> open_graphs_;
};

// Shared by every unit of one module tree; owned jointly by its units.
class FSDPTree : public std::enable_shared_from_this<FSDPTree> {
 public:
  // Every unit, root first, then module order.
  const std::vector<FSDPState*>& units() const { return units_; }
  void add(FSDPState* unit) { units_.push_back(unit); }
  // `unit` is being destroyed: no entry of the tree names it afterwards,
  // and when it was the root, every other unit becomes the root of a tree
  // of its own.
  void remove(FSDPState* unit, bool was_root);

  // What its collectives are logged in and run on, and its reductions'
  // pipeline.
  EventLog& log() { return log_; }
  TreeComm comm() { return TreeComm{log_, streams_}; }
  CommContext& reductions() { return reductions_; }
  TreePhase phase() const { return iteration_.phase(); }
  // Backwards finished or abandoned: a hook armed in one backward knows
  // whether it fires in another.
  int64_t backward_count() const { return backward_count_; }

  // --- forward -------------------------------------------------------------
  // The root's forward with gradients: a new iteration unless an earlier
  // forward's graph still awaits its backward (two forwards, one backward);
  // a graph dropped without a backward does not count. True if it opened one.
  bool open_iteration();
  // A unit's pre-forward, in the order of the first iteration.
  void record_forward(FSDPState* unit);
  // The root's post-forward: the forward order is known, and a unit of
  // several modules whose round did not finish (one of them did not run)
  // is finished here, as FSDP2's root post-forward does.
  void end_root_forward(FSDPState* root, bool grad_enabled);
  // After the root's forward without gradients: gathers prefetched for
  // calls that never came are finished and freed.
  void release_unused_prefetches(FSDPState* root);
  // The `depth` units after `unit` in forward order (module order until the
  // first forward has recorded it), the root excepted.
  std::vector<FSDPState*> forward_successors(const FSDPState* unit, int depth) const;
  // A call needing backward finished its forward: its position in the
  // post-forward order, and the unit at a position.
  size_t record_post_forward(FSDPState* unit);
  FSDPState* post_forward_at(size_t index) const { return iteration_.post_forward_order[index]; }
  // The root's outputs of a forward with gradients: when the last of
  // their graphs is freed while the iteration is still open, no backward
  // will come for it (drop_iteration).
  void watch_root_outputs(const std::vector<at::Tensor>& outputs);

  // --- backward ------------------------------------------------------------
  // The first pre-backward of a backward: queues end_of_backward on the
  // autograd engine (and, should the backward throw, abandon_iteration).
  void begin_backward();
  // Every unit still gathered or owing a reduction runs post-backward, the
  // reductions are drained, the ranks agree on which parameters got a
  // gradient anywhere, and every unit goes back to idle.
  void end_of_backward();
  // After an error: every collective issued is finished, every unit
  // resharded, per-iteration state cleared. `keep_open`: an earlier
  // forward's graph may still be backwarded.
  void abandon_iteration(bool keep_open) noexcept;
  // Every graph of the open iteration was freed without a backward: units
  // go back to sharded, with the gradients they had, before the optimizer runs.
  void drop_iteration() noexcept;
  // The same, when the last graph of the open iteration was freed.
  void drop_iteration_if_no_live_graph() noexcept;

 private:
  // Parameters no rank used keep the gradient they had (none stays none).
  void agree_on_used_parameters();

  std::vector<FSDPState*> units_;
  std::vector<FSDPState*> forward_order_;  // pre-forward order, recorded in the first iteration
  bool recording_order_ = true;
  TreeIteration iteration_;
  int64_t backward_count_ = 0;
  EventLog log_;
  DeviceStreams streams_;
  CommContext reductions_{streams_};
};

}  // namespace fsdp
