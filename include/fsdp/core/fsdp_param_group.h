#pragma once
// All parameters of one fully_shard call (FSDP2's FSDPParamGroup): one flat
// all-gather before use, one flat reduce-scatter after backward, and the
// sharded/unsharded state machine. Mixed-precision casts happen here; when
// collectives run is decided by FSDPState and CommContext.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdp/core/counted_tensor.h"
#include "fsdp/core/fsdp_param.h"
#include "fsdp/core/options.h"
#include "fsdp/dist/collectives.h"

namespace fsdp {

class CommContext;

enum class ShardedState { kSharded, kUnsharded };

// How a unit's gradients travel from autograd to the optimizer, decided once
// at sharding from the shard group's size and the dtypes. See [Note:
// gradients in place] in fsdp_param_group.cpp for what each step does on
// each path.
enum class GradientPath {
  // One rank per shard group, no cast anywhere: parameters and gradients
  // are views of persistent flat buffers in both states; autograd adds into
  // them; only replicas communicate (an all-reduce).
  kInPlace,
  // One rank per shard group, gradients reduced in another dtype: the
  // parameters alias their shard (no gather), gradients go through a flat
  // buffer that is cast and handed over as the reduced shard.
  kAliasedShard,
  // A gathered buffer per unshard, a flat gradient buffer per backward, a
  // reduce-scatter (and an all-reduce across replicas).
  kGathered,
};
const char* to_string(GradientPath path);

class FSDPParamGroup {
 public:
  // Takes ownership of `params`' data: after construction each parameter
  // points at its local shard, and the full tensors are released.
  FSDPParamGroup(std::vector<FSDPParam> params, const dist::DeviceMesh& mesh, const FullyShardOptions& options);
  FSDPParamGroup(const FSDPParamGroup&) = delete;
  FSDPParamGroup& operator=(const FSDPParamGroup&) = delete;

  // Where collectives are issued and logged, and the unit's name in the log.
  void attach(CommContext* comm, const std::string* unit_name);

  ShardedState sharded_state() const { return state_; }
  std::vector<FSDPParam>& params() { return params_; }
  const std::vector<FSDPParam>& params() const { return params_; }
  dist::ProcessGroup& shard_group() const { return *shard_group_; }
  dist::ProcessGroup& replicate_group() const { return *replicate_group_; }
  dist::ProcessGroup& world_group() const { return *world_group_; }
  at::Device device() const { return device_; }
  // Read at each use, not fixed at sharding: a unit frozen as a whole
  // when sharded may be unfrozen later (every rank the same).
  bool has_trainable_params() const;
  GradientPath gradient_path() const { return path_; }

  // --- parameters -------------------------------------------------------
  // Issues the all-gather (no-op when unsharded or already in flight).
  void unshard();
  // Waits for it and points every parameter at its gathered view.
  void wait_for_unshard();
  // Points parameters back at their shards (and their gradients back at
  // the sharded ones) and frees the gathered buffer.
  void reshard();

  // --- backward ---------------------------------------------------------
  // Pre-backward: each trainable parameter's gradient becomes a view of one
  // flat unsharded gradient buffer, which autograd accumulates into.
  void prepare_gradients();
  // The unit's backward is done: collects its gradients into the reduce
  // input, reshards, and hands the reduction to the CommContext (or keeps
  // accumulating, without gradient sync). Once per gathering in backward
  // (FSDPState guarantees it): a unit recomputed after its post-backward
  // runs it again, once its earlier reduction is finished, and the
  // reductions add up.
  void post_backward();
  // Reduction stages, run by CommContext in this order.
  void issue_reduce_scatter();
  void wait_reduce_scatter();
  bool reduces_across_replicas() const;
  // Under HSDP without requires_all_reduce: this backward's reduce-scatter
  // output is kept and added to the next one's before its all-reduce.
  void hold_partial_reduction();
  // Whether a synchronised backward holds its reduction (HSDP without
  // requires_all_reduce) instead of handing it to the optimizer.
  bool holds_reduction() const;
  // Before a divide factor or reduced-gradient hook is set: see [Note:
  // gradients in place].
  void leave_in_place_path();
  // Changes whenever the unit is gathered or released (or a pending gather
  // is dropped): an UnshardHandle acts only on the gather it issued.
  uint64_t epoch() const { return epoch_; }
  void issue_replica_all_reduce();
  void wait_replica_all_reduce();
  void assign_gradients();
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

  // Run-time knobs (FSDP2's setters of the same names, set_ dropped).
  bool requires_gradient_sync = true;
  bool requires_all_reduce = true;   // HSDP: all-reduce across replicas on sync
  bool reshard_after_backward = true;  // false: stays gathered after a backward that does not sync
  // Gradients are summed across ranks and divided by this instead of the
  // number of ranks (token-normalised losses); unset: averaged.
  std::optional<double> gradient_divide_factor;
  ReducedGradHook reduced_grad_hook;

  // Bytes of the fp32 master shard, and of the gathered buffer when held.
  int64_t sharded_param_bytes() const;
  int64_t unsharded_bytes_held() const;
  int64_t flat_numel() const { return padded_numel_; }
  // Bytes one all-gather writes (the gathered buffer) and one reduction
  // holds at most (input, receive buffer, reduced shard), for memory bounds.
  int64_t gathered_bytes() const;
  int64_t reduction_bytes() const;

 private:
  void init_shard(const FullyShardOptions& options);
  bool aliased() const { return path_ != GradientPath::kGathered; }  // gathered form = the shard
  bool in_place() const { return path_ == GradientPath::kInPlace; }
  void register_grad_hooks();
  at::Tensor unsharded_view(const FSDPParam& p) const;
  at::Tensor sharded_view(const FSDPParam& p) const;
  void allocate_unsharded();
  void free_unsharded();
  // Notes, once per iteration, whether the parameter had a gradient before
  // this group touched it (FSDPParam::grad_existed_before).
  void record_grad_existence(FSDPParam& p);
  void attach_grad_view(FSDPParam& p, const at::Tensor& view);
  // attach_grad_view for a parameter that has a gradient; one without
  // keeps none (see the definition).
  void attach_existing_grad_view(FSDPParam& p, const at::Tensor& view);
  void ensure_grad_flat();
  void attach_sharded_grad_views();
  // The flat unsharded gradient buffer, allocated (zeroed) on first use.
  const at::Tensor& unsharded_grad();
  // The same, allocated with only what no trainable parameter covers zeroed.
  const at::Tensor& unsharded_grad_unfilled();
  void finish_all_gather();
  void collect_unsharded_gradients();
  // The divide factor and the user's hook, on a reduced shard (or the whole
  // buffer on the in-place path).
  void finish_reduced(at::Tensor& reduced);

  std::vector<FSDPParam> params_;
  dist::ProcessGroup* shard_group_;
  dist::ProcessGroup* replicate_group_;
  dist::ProcessGroup* world_group_;
  CommContext* comm_ = nullptr;
  const std::string* name_ = nullptr;
  MixedPrecisionPolicy mp_;
  at::ScalarType orig_dtype_;
  at::ScalarType master_dtype_;  // dtype of the shard the optimizer updates
  at::ScalarType param_dtype_;   // dtype of the gathered buffer
  at::ScalarType reduce_dtype_;  // dtype gradients are reduced in
  at::Device device_{at::kCPU};
  int64_t total_numel_ = 0;
  int64_t shard_numel_ = 0;
  int64_t padded_numel_ = 0;
  GradientPath path_ = GradientPath::kGathered;

  at::Tensor sharded_flat_;        // [shard_numel_] fp32 master (orig dtype without mixed precision)
  at::Tensor unsharded_flat_;      // [padded_numel_] param dtype; storage freed while sharded (the shard itself when aliased)
  at::Tensor grad_flat_;           // kInPlace: [padded_numel_] every gradient's memory, for good
  CountedTensor all_gather_input_{memory::BufferKind::kComm};  // cast of the shard, while the all-gather runs
  std::optional<dist::Work> all_gather_work_;
  size_t all_gather_event_ = 0;

  // Backward. [padded_numel_] param dtype: what autograd accumulates into.
  CountedTensor unsharded_grad_{memory::BufferKind::kGradient};
  // [padded_numel_] reduce dtype: micro-steps without gradient sync.
  CountedTensor unsynced_grads_{memory::BufferKind::kGradient};
  CountedTensor reduce_input_{memory::BufferKind::kComm};   // [padded_numel_] while the reduce-scatter runs
  CountedTensor reduce_output_{memory::BufferKind::kComm};  // [shard_numel_] until assigned
  CountedTensor partial_reduction_{memory::BufferKind::kGradient};  // [shard_numel_] held without all-reduce
  std::optional<dist::Work> reduce_work_;
  size_t reduce_event_ = 0;
  std::vector<uint8_t> used_;  // per parameter: a gradient arrived on this rank
  bool reduced_this_backward_ = false;

  ShardedState state_ = ShardedState::kSharded;
  uint64_t epoch_ = 0;
  // Between micro-steps of accumulation (a backward without synchronisation
  // left gradients for a later one): whether each parameter had a gradient
  // is recorded once per window, at its first backward, not per backward.
  bool accumulating_ = false;
};

}  // namespace fsdp
