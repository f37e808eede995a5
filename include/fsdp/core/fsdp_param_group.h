#pragma once
// All parameters of one fully_shard call (FSDP2's FSDPParamGroup): one flat
// all-gather before use, one flat reduce-scatter after backward, and the
// sharded/unsharded state machine. Mixed-precision casts happen here.

#include <functional>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdp/core/fsdp_param.h"
#include "fsdp/core/options.h"
#include "fsdp/dist/collectives.h"

namespace fsdp {

enum class ShardedState { kSharded, kUnsharded };

class FSDPParamGroup {
 public:
  // Takes ownership of `params`' data: after construction each parameter
  // points at its local shard, and the full tensors are released.
  FSDPParamGroup(std::vector<FSDPParam> params, const dist::DeviceMesh& mesh, const FullyShardOptions& options);
  FSDPParamGroup(const FSDPParamGroup&) = delete;
  FSDPParamGroup& operator=(const FSDPParamGroup&) = delete;

  ShardedState sharded_state() const { return state_; }
  std::vector<FSDPParam>& params() { return params_; }
  const std::vector<FSDPParam>& params() const { return params_; }
  dist::ProcessGroup& shard_group() const { return *shard_group_; }
  dist::ProcessGroup& replicate_group() const { return *replicate_group_; }

  // Issues the all-gather (no-op when unsharded or already in flight).
  void unshard();
  // Waits for it and points every parameter at its gathered view.
  void wait_for_unshard();
  // Points parameters back at their shards and frees the gathered buffer.
  void reshard();

  // Called once all of this unit's gradients exist (or at the end of
  // backward for what never got one): moves them into the reduce buffer,
  // issues the reduce-scatter (or accumulates, without gradient sync), and
  // reshards.
  void post_backward();
  bool post_backward_done() const { return post_backward_done_; }
  // Counts one parameter's gradient; runs post_backward on the last one.
  void on_grad_ready();
  // End of backward: waits for the reduce-scatter, all-reduces across
  // replicas (HSDP / NO_SHARD), and hands each parameter its sharded gradient.
  void finalize_backward();
  // Forgets per-iteration progress (called at the start of each forward).
  void reset_backward_state();

  bool requires_gradient_sync = true;

  // Bytes of the fp32 master shard, and of the gathered buffer when held.
  int64_t sharded_param_bytes() const;
  int64_t unsharded_bytes_held() const;
  int64_t flat_numel() const { return padded_numel_; }

 private:
  void init_shard(const FullyShardOptions& options);
  void register_grad_hooks();
  at::Tensor unsharded_view(const FSDPParam& p) const;
  at::Tensor sharded_view(const FSDPParam& p) const;
  void allocate_unsharded();
  void free_unsharded();
  void attach_grad_view(FSDPParam& p, const at::Tensor& view);
  void ensure_grad_flat();

  std::vector<FSDPParam> params_;
  dist::ProcessGroup* shard_group_;
  dist::ProcessGroup* replicate_group_;
  MixedPrecisionPolicy mp_;
  at::ScalarType orig_dtype_;
  at::ScalarType master_dtype_;  // dtype of the shard the optimizer updates
  at::ScalarType param_dtype_;   // dtype of the gathered buffer
  at::ScalarType reduce_dtype_;  // dtype gradients are reduced in
  int64_t total_numel_ = 0;
  int64_t shard_numel_ = 0;
  int64_t padded_numel_ = 0;

  at::Tensor sharded_flat_;        // [shard_numel_] fp32 master (orig dtype without mixed precision)
  at::Tensor unsharded_flat_;      // [padded_numel_] param dtype; storage freed while sharded
  bool unsharded_aliases_sharded_ = false;  // shard group of 1, no cast: no copy at all
  // With an aliased shard and no reduce cast, gradients live in grad_flat_
  // for good: parameters' .grad are views of it in both states, autograd
  // accumulates into them in place, and only replicas need a collective
  // (DDP's gradient-as-bucket-view). See [Note: gradients in place].
  bool grads_in_place_ = false;
  at::Tensor grad_flat_;
  at::Tensor all_gather_input_;    // cast of the shard, alive while the all-gather runs
  std::optional<dist::Work> all_gather_work_;

  at::Tensor unsynced_grads_;      // [padded_numel_] reduce dtype: micro-steps without gradient sync
  at::Tensor reduce_output_;       // [shard_numel_] reduce dtype
  at::Tensor reduce_input_;        // [padded_numel_] reduce dtype, alive while the reduce-scatter runs
  std::optional<dist::Work> reduce_work_;
  bool reduced_this_backward_ = false;

  ShardedState state_ = ShardedState::kSharded;
  int grads_ready_ = 0;
  int grads_expected_ = 0;
  bool post_backward_done_ = false;
};

}  // namespace fsdp
