#pragma once
// What fully_shard is asked to do: sharding strategy, mixed precision,
// prefetching, initialisation.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdp/common/deferred_tensor.h"
#include "fsdp/common/sharding.h"  // deferred_empty, for param_init
#include "fsdp/core/shard_layout.h"
#include "fsdp/distributed/device_mesh.h"

namespace torch::nn {
class Module;
}

namespace fsdp {

// Accepts full_shard, shard_grad_op, no_shard, hybrid_shard (any case).
ShardingStrategy parse_sharding_strategy(const std::string& name);

// The mesh a strategy needs: 1-D (shard over all ranks) for full_shard and
// shard_grad_op, replicate x 1 for no_shard, (W / fsdp_size) x fsdp_size for
// hybrid_shard. Validated on every rank before any group is connected.
dist::DeviceMesh make_mesh(const std::shared_ptr<dist::World>& world, ShardingStrategy strategy,
                           int fsdp_size = 0);

// BatchNorm1d, 2d or 3d: what a mixed-precision policy keeps in full
// precision unless told otherwise.
bool is_batch_norm(const torch::nn::Module& module);

// Mixed precision (FSDP2's MixedPrecisionPolicy). Unset fields keep the
// parameters' own dtype. The optimizer updates shards in the module's own
// dtype: an fp32 module under a bf16 policy keeps fp32 master shards, a bf16
// module keeps bf16 ones (no fp32 copy, as FSDP2).
struct MixedPrecisionPolicy {
  std::optional<at::ScalarType> param_dtype;   // compute dtype of gathered parameters
  std::optional<at::ScalarType> reduce_dtype;  // dtype gradients are reduced in
  std::optional<at::ScalarType> output_dtype;  // dtype floating outputs are cast to
  bool cast_forward_inputs = true;             // cast floating inputs to param_dtype
  // Modules whose own parameters keep their dtype under the policy: gathered,
  // computed and reduced in it ([Note: modules kept in full precision]).
  // BatchNorm by default, as FSDP1 and DDP do; empty keeps none.
  std::function<bool(const torch::nn::Module&)> keep_full_precision = is_batch_norm;
};

// Called with each reduced gradient shard before the optimizer sees it
// (FSDP2's set_all_reduce_hook): the reduce-scatter's output, or the
// all-reduce's under HSDP (on one rank per shard group: the whole flat
// gradient), in the reduce dtype; changes are kept.
using ReducedGradHook = std::function<void(at::Tensor& reduced)>;

// What a unit hands on once a reduction's gradients are its parameters'
// (set_gradients_ready_hook): its trainable parameters, each with its
// gradient, and how to wait until those gradients can be read on the host
// (a GPU's device-to-host copy under CPU offload; a no-op otherwise),
// callable from any thread.
struct GradientsReady {
  std::vector<at::Tensor> params;
  std::function<void()> wait_until_readable;
};
using GradientsReadyHook = std::function<void(const GradientsReady&)>;

// Fills one full, unsharded parameter deterministically (every rank must
// produce the same values). Called for deferred parameters (deferred_empty),
// one at a time, so a rank never holds more than its shard plus one parameter.
using ParamInitFn = std::function<void(const std::string& fqn, at::Tensor& full)>;

// A parameter sharded along one of its own dims (FSDP2's Shard(d)): rank r
// of the shard group holds the r-th chunk of torch.chunk along `dim`
// (ceil(size / W) rows, fewer or none on the last ranks, padded with zeros
// in the shard), as a tensor of that chunk's shape. Negative dims count from
// the end.
struct Shard {
  int64_t dim = 0;
};
// Chooses each parameter's placement (FSDP2's shard_placement_fn), given
// its name inside the unit; nullopt keeps the default layout (the unit's
// parameters end to end, one flat 1-D slice per rank).
using ShardPlacementFn = std::function<std::optional<Shard>(const std::string& fqn, const at::Tensor& param)>;

// What a unit does with its gathered parameters after forward (FSDP2's
// reshard_after_forward, a bool or an int): frees them (true) and gathers
// again over the shard group for backward; keeps them (false); or, given a
// number of ranks k dividing the shard group's size, keeps them sharded
// over groups of k consecutive ranks of the shard group, so backward's
// all-gather runs inside one such group (ZeRO++'s hpZ: with k = ranks per
// node it never leaves the node), for 1/k of the parameters held per rank
// between forward and backward. k = the shard group's size is true, k = 1
// is false.
struct ReshardAfterForward {
  ReshardAfterForward(bool free) : ranks(free ? kShardGroup : 1) {}  // NOLINT: converts, as FSDP2's bool
  ReshardAfterForward(int group_ranks) : ranks(group_ranks) {}       // NOLINT: converts, as FSDP2's int
  static constexpr int kShardGroup = 0;  // the whole shard group, whatever its size
  int ranks;
  // Whether it can be used over a shard group of this many ranks
  // (reshard_ranks_fit, shard_layout.h).
  bool fits(int shard_group_size) const { return reshard_ranks_fit(ranks, shard_group_size); }
};
// Throws fsdp::Error naming the number of ranks when it does not fit.
void check_reshard_after_forward(ReshardAfterForward reshard, int shard_group_size);

// Where a unit's sharded state lives between uses (FSDP2's OffloadPolicy and
// CPUOffloadPolicy). kCpu keeps the master shard, its gradients and so the
// optimizer's step on the host: each all-gather starts with a copy of the
// shard to the compute device (and a cast), each reduced gradient is copied
// back, and the compute device holds the unit only while it is gathered.
// See [Note: CPU offload] in src/core/flat_shard.cpp.
struct OffloadPolicy {
  enum class Where { kNone, kCpu };
  Where where = Where::kNone;
  // Page-locked host memory, so copies to and from a GPU run asynchronously
  // (FSDP2's pin_memory); only used where the compute device is a GPU.
  bool pin_memory = true;

  static OffloadPolicy cpu(bool pin_memory = true) { return {Where::kCpu, pin_memory}; }
  bool offloads() const { return where != Where::kNone; }
};

struct FullyShardOptions {
  std::shared_ptr<dist::DeviceMesh> mesh;  // required
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  // Free gathered parameters after forward (gather again for backward),
  // keep them, or keep them sharded over fewer ranks (ReshardAfterForward).
  // Unset: the strategy decides, and the root keeps its own. Set: it holds
  // for this unit, the root included.
  std::optional<ReshardAfterForward> reshard_after_forward;
  MixedPrecisionPolicy mixed_precision;
  // Units whose all-gather is issued ahead of use: forward in recorded
  // order, backward in reverse. 0 turns implicit prefetch off.
  int prefetch_depth = 1;
  // Per-parameter placements; unset: every parameter in the flat layout.
  // See [Note: per-parameter placements] in flat_shard.cpp.
  ShardPlacementFn shard_placement;
  // Stay replicated and untouched: no sharding, no gradient reduction.
  std::vector<at::Tensor> ignored_params;
  ParamInitFn param_init;
  // Broadcast rank 0's parameters instead of trusting every rank's own
  // init. Buffers are broadcast either way ([Note: buffers under
  // fully_shard], src/core/fully_shard_init.cpp).
  bool sync_module_states = false;
  // Sharded parameters and gradients on the host (OffloadPolicy::cpu()).
  OffloadPolicy offload;
};

// Throws fsdp::Error, before anything is sharded, for options fully_shard
// cannot use (no mesh, a negative prefetch depth, no_shard over a shard
// group, a reshard_after_forward that does not fit the mesh).
void validate(const FullyShardOptions& options);

}  // namespace fsdp
