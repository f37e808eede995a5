#pragma once
// All parameters of one fully_shard call (FSDP2's FSDPParamGroup): the
// coordinator of a unit's memory (FlatShard), its collectives
// (fsdp_collectives.h) and its gradient path (GradientFlow), through the
// sharded/unsharded state machine. When its steps run is decided by its
// unit's hooks (FSDPState), its tree (FSDPTree: the end of backward, an
// abandoned or dropped iteration) and the reduction pipeline
// (CommContext). A unit whose parameters have several dtypes
// holds one flat shard per dtype: see [Note: a unit of several dtypes].

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdp/core/options.h"
#include "fsdp/distributed/device_mesh.h"

#include "core/flat_shard.h"
#include "core/fsdp_collectives.h"
#include "core/gradient_paths.h"

namespace fsdp {

class CommContext;

enum class ShardedState { kSharded, kUnsharded };

class FSDPParamGroup : public std::enable_shared_from_this<FSDPParamGroup> {
 public:
  // Takes ownership of `params`' data (see FlatShard), logging start-up
  // broadcasts in `startup`.
  FSDPParamGroup(std::vector<FSDPParam> params, const dist::DeviceMesh& mesh, const FullyShardOptions& options,
                 const TreeComm& startup);
  FSDPParamGroup(const FSDPParamGroup&) = delete;
  FSDPParamGroup& operator=(const FSDPParamGroup&) = delete;

  // Where collectives are issued and logged, the pipeline its reductions
  // join, and the unit's name in the log: its tree's.
  void attach(const TreeComm& comm, CommContext* reductions, const std::string* unit_name);

  ShardedState sharded_state() const { return state_; }
  // Every parameter of the unit, dtype by dtype (each dtype's in module order).
  const std::vector<FSDPParam*>& params() const { return params_; }
  // One flat shard per dtype, in the order of the dtypes' first parameters.
  size_t num_shards() const { return parts_.size(); }
  const FlatShard& shard(size_t i) const { return *parts_[i].shard; }
  dist::ProcessGroup& shard_group() const { return front().shard_group(); }
  dist::ProcessGroup& replicate_group() const { return front().replicate_group(); }
  dist::ProcessGroup& world_group() const { return front().world_group(); }
  at::Device device() const { return front().device(); }
  // Read at each use, not fixed at sharding: a unit frozen as a whole
  // when sharded may be unfrozen later (every rank the same).
  bool has_trainable_params() const;

  // --- parameters -------------------------------------------------------
  // Issues the all-gather (no-op when unsharded or already in flight).
  void unshard();
  // Waits for it and points every parameter at its gathered view.
  void wait_for_unshard();
  // Points parameters back at their shards (and their gradients back at
  // the sharded ones) and frees the gathered buffer (and a post-forward shard).
  void reshard();
  // After forward (reshard_after_forward = k): reshards, keeping this rank's
  // 1/k of the gathered buffer, its part within its group of k consecutive
  // ranks of the shard group; the next unshard gathers inside that group.
  // `ranks` divides the shard group's size.
  void reshard_to(int ranks);
  // The group reshard_to(ranks) will use, made now: every rank must make it
  // at the same point (fully_shard, or the setter).
  void prepare_reshard_to(int ranks) const { (void)mesh_->shard_subgroup(ranks); }
  const dist::DeviceMesh& mesh() const { return *mesh_; }
  // Changes whenever the unit is gathered or released (or a pending gather
  // is dropped): an UnshardHandle acts only on the gather it issued.
  uint64_t epoch() const { return epoch_; }

  // --- backward ---------------------------------------------------------
  // Gradients become views of the buffer autograd accumulates into: at the
  // pre-backward (`in_backward`), or after the forward of a unit staying gathered.
  void prepare_gradients(bool in_backward);
  // The unit's backward is done: collects its gradients, reshards, and
  // hands a Reduction to the CommContext (or keeps accumulating, without
  // gradient sync). Once per gathering in backward (FSDPState guarantees
  // it): a unit recomputed after its post-backward runs it again, once its
  // earlier reduction is finished, and the reductions add up.
  void post_backward();
  bool reduces_across_replicas() const;
  // Whether a synchronised backward holds its reduction (HSDP without
  // requires_all_reduce) instead of handing it to the optimizer.
  bool holds_reduction() const;

  // Whether each trainable parameter got a gradient on this rank since the
  // last synchronised backward (appended in parameter order), and the
  // verdict of all ranks: parameters no rank used keep the gradient they had.
  bool reduced_this_backward() const { return reduced_this_backward_; }
  void append_used(std::vector<uint8_t>& out) const;
  size_t apply_used(const uint8_t* used_anywhere);
  void mark_used(size_t index) { used_[index] = 1; }

  // Per-iteration bookkeeping: a new forward, and the end of a backward.
  void begin_iteration();
  void end_backward();
  // After an error in forward or backward: in-flight collectives finished,
  // parameters resharded, partial gradients of this backward dropped.
  void abandon() noexcept;
  // Back to sharded after a forward whose graph was dropped: the gradients
  // of the iteration before it (and any accumulation) are kept.
  void drop_forward() noexcept;

  // --- run-time knobs (FSDP2's setters) ----------------------------------
  bool requires_gradient_sync() const { return settings_.requires_gradient_sync; }
  void set_requires_gradient_sync(bool sync) { settings_.requires_gradient_sync = sync; }
  bool requires_all_reduce() const { return settings_.requires_all_reduce; }
  void set_requires_all_reduce(bool all_reduce) { settings_.requires_all_reduce = all_reduce; }
  void set_reshard_after_backward(bool reshard) { settings_.reshard_after_backward = reshard; }
  // A factor or a hook would act on the whole in-place buffer, so setting
  // one leaves that path first (see [Note: gradients in place]).
  void set_gradient_divide_factor(std::optional<double> factor);
  void set_reduced_grad_hook(ReducedGradHook hook);
  void set_gradients_ready_hook(GradientsReadyHook hook) { settings_.gradients_ready_hook = std::move(hook); }

  // Bytes of the master shards, and of the gathered buffers when held;
  // elements of the padded flat buffers; what one gather holds in flight
  // (FlatShard::gather_bytes_in_flight); the sums over the unit's dtypes.
  int64_t sharded_param_bytes() const;
  int64_t host_param_bytes() const;  // of those, the offloaded shards' (on the host)
  int64_t unsharded_bytes_held() const;
  int64_t flat_numel() const;
  int64_t gathered_bytes() const;
  int64_t reduction_bytes() const;

 private:
  // One dtype's parameters (in one layout): their flat shard, with its
  // gather, and their gradient path.
  struct DtypeShard {
    std::unique_ptr<FlatShard> shard;
    std::unique_ptr<GradientFlow> flow;
    bool trainable() const;
  };

  const FlatShard& front() const { return *parts_.front().shard; }
  template <typename Fn>
  int64_t sum_over_shards(Fn&& of) const;
  bool gather_in_flight() const;
  void finish_all_gather();
  void register_grad_hooks();
  void leave_in_place_path();
  UnitComm on(dist::ProcessGroup& group) const;
  // on(group) for a gradient reduction: summing under a divide factor.
  UnitComm reducing_on(dist::ProcessGroup& group) const;

  std::shared_ptr<dist::DeviceMesh> mesh_;  // kept alive: the shards hold its groups
  std::vector<DtypeShard> parts_;
  std::vector<FSDPParam*> params_;
  ReductionSettings settings_;
  std::optional<TreeComm> comm_;
  CommContext* reductions_ = nullptr;
  const std::string* name_ = nullptr;
  std::vector<uint8_t> used_;  // per parameter of params_: a gradient arrived on this rank
  bool reduced_this_backward_ = false;
  ShardedState state_ = ShardedState::kSharded;
  uint64_t epoch_ = 0;
  // Between micro-steps of accumulation (a backward without synchronisation
  // left gradients for a later one): whether each parameter had a gradient
  // is recorded once per window, at its first backward, not per backward.
  bool accumulating_ = false;
};

}  // namespace fsdp
