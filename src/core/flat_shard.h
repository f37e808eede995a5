#pragma once
// The parameters of one dtype and one layout of a unit (a unit holds one
// FlatShard for each: [Note: a unit of several dtypes]) laid end to end in
// one flat buffer, and this rank's shard of it (the memory side of FSDP2's
// FSDPParam, for those parameters at once): the layout, the sharded buffer the optimizer updates, the gathered
// buffer forward and backward read (allocated before use, its storage
// freed after), and the view each parameter points at in either state.
// Initialisation ends here: deferred parameters filled one at a time, the
// start-up broadcast. The gather between the two buffers is issued and
// finished here, in the shard's layout, through the collectives of
// fsdp_collectives.h; when it runs is the group's to decide.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "fsdp/core/options.h"
#include "fsdp/distributed/device_mesh.h"

#include "core/counted_tensor.h"
#include "core/fsdp_collectives.h"
#include "core/fsdp_param.h"

namespace fsdp {

class FlatShard {
 public:
  // Takes ownership of `params`' data: afterwards each parameter points at
  // its slice of the shard, and the full tensors are released. The
  // start-up broadcasts (sync_module_states) are logged in `startup`.
  FlatShard(std::vector<FSDPParam> params, const dist::DeviceMesh& mesh, const FullyShardOptions& options,
            const TreeComm& startup);
  FlatShard(const FlatShard&) = delete;
  FlatShard& operator=(const FlatShard&) = delete;

  std::vector<FSDPParam>& params() { return params_; }
  const std::vector<FSDPParam>& params() const { return params_; }
  dist::ProcessGroup& shard_group() const { return *shard_group_; }
  dist::ProcessGroup& replicate_group() const { return *replicate_group_; }
  dist::ProcessGroup& world_group() const { return *world_group_; }
  at::Device device() const { return device_; }

  // The shard the optimizer updates is in the parameters' own dtype (FSDP2
  // keeps no fp32 copy of a bf16 module); the gathered buffer is in the
  // policy's param dtype, gradients are reduced in its reduce dtype.
  at::ScalarType master_dtype() const { return master_dtype_; }
  at::ScalarType param_dtype() const { return param_dtype_; }
  at::ScalarType reduce_dtype() const { return reduce_dtype_; }
  at::TensorOptions options(at::ScalarType dtype) const { return at::TensorOptions().device(device_).dtype(dtype); }

  // The master shard (and the reduced gradients handed to the optimizer)
  // live on the host (OffloadPolicy::kCpu): the gathered form is never the
  // shard, a gather starts with a copy of the shard to the compute device,
  // and to_host copies a reduced gradient back. See [Note: CPU offload].
  bool offloaded() const { return offloaded_; }
  // `reduced` (a compute-side flat shard) as a host flat buffer in `dtype`,
  // copied on the tree's device-to-host stream (the host waits for it at
  // the end of backward: CommContext::drain).
  at::Tensor to_host(const at::Tensor& reduced, at::ScalarType dtype, DeviceStreams& streams) const;

  int64_t shard_numel() const { return shard_numel_; }
  int64_t padded_numel() const;

  // One rank per shard group and no cast: the gathered form is the shard
  // itself, so there is nothing to gather, allocate or free.
  bool gathered_is_shard() const;
  const at::Tensor& sharded() const { return sharded_; }
  const at::Tensor& gathered() const { return gathered_; }
  // The gathered buffer's storage, back to its size (counted as gathered
  // bytes) or down to 0 bytes; never replaced: see [Note: FSDP and autograd].
  void allocate_gathered();
  void free_gathered();

  // What a parameter's data is in each state: its part of the shard (a 1-D
  // slice, or its chunk's shape under a placement), or its full shape over
  // the gathered buffer.
  at::Tensor sharded_view(const FSDPParam& p) const;
  at::Tensor gathered_view(const FSDPParam& p) const;
  // The parameter's part of any tensor laid out as the shard (a reduced
  // gradient), as sharded_view takes it from the shard.
  at::Tensor shard_view(const at::Tensor& flat, const FSDPParam& p) const;
  // Whether every rank's part of the parameter is one range of its
  // flattened elements, the same answer on every rank: always in the flat
  // layout; under Shard(d) when d = 0, the dims before d are 1, or one
  // rank holds it all.
  bool chunks_are_ranges(const FSDPParam& p) const;

  // --- this shard's all-gather, the layout's side included ----------------
  // Per-parameter placements (Shard(d)) make the shard rank-major and the
  // gathered buffer parameter-major, so over more than one rank a gather
  // lands in a wire buffer held here until it is copied out, and gradients
  // are copied into one before their reduce-scatter ([Note: per-parameter
  // placements]); the flat layout needs neither. Callers make the same
  // calls for both.
  bool placed() const { return placed_; }
  // Issues the gather into the gathered buffer (allocated here): from the
  // part kept after forward, inside its group, when there is one; else
  // from the shard, over `over` (the shard group). Nothing to do when the
  // gathered form is the shard.
  void start_gather(const UnitComm& over);
  bool gather_in_flight() const { return gather_.in_flight(); }
  // Waits for it and lays it out in the gathered buffer. The kept part
  // goes: read by the gather, or never to be (a full gather comes next).
  void finish_gather(EventLog& log);
  // After an error: waited (and marked so in the event log), failures
  // swallowed, the wire buffer dropped.
  void abandon_gather(EventLog& log) noexcept;
  // reshard_after_forward = k ([Note: resharding to fewer ranks] in
  // fsdp_param_group.cpp): a copy of this rank's part of the gathered
  // buffer (the `index`-th of `ranks`), taken before the buffer is freed,
  // and then kept for the next gather, which runs inside `within`.
  at::Tensor copy_of_part(int ranks, int index) const;
  void keep_part(const at::Tensor& part, dist::ProcessGroup& within);
  // Parameter-major gradients as the reduce-scatter takes them (a fresh
  // wire buffer, padding zeroed, or `grads` itself).
  at::Tensor reduce_input(const at::Tensor& grads) const;
  // The shard group's shards laid end to end (`wire`), parameter-major.
  at::Tensor parameter_major(const at::Tensor& wire) const;

  int64_t sharded_bytes() const { return static_cast<int64_t>(sharded_.nbytes()); }
  // Bytes the gathered buffer holds now (0 while freed, and when it is the shard).
  int64_t gathered_bytes_held() const;
  // Bytes of the gathered buffer; what one all-gather holds while in
  // flight (the gathered buffer, and a placed shard's wire buffer beside
  // it), and one reduction at most (input, receive buffer, reduced
  // shard), for memory bounds.
  int64_t gathered_bytes() const;
  int64_t gather_bytes_in_flight() const { return gathered_bytes() * (reorders() ? 2 : 1); }
  int64_t reduction_bytes() const;

 private:
  void init_shard(const FullyShardOptions& options, const TreeComm& startup);
  void lay_out_flat();
  void lay_out_placed();
  // Whether the layout differs between the shard and the gathered buffer.
  bool reorders() const { return placed_ && shard_group_->size() > 1; }
  void copy_out(const at::Tensor& wire, const at::Tensor& out) const;

  std::vector<FSDPParam> params_;
  dist::ProcessGroup* shard_group_;
  dist::ProcessGroup* replicate_group_;
  dist::ProcessGroup* world_group_;
  at::Device device_{at::kCPU};
  at::ScalarType master_dtype_;
  at::ScalarType param_dtype_;
  at::ScalarType reduce_dtype_;
  bool placed_ = false;
  bool offloaded_ = false;
  bool pin_memory_ = false;  // host buffers page-locked (a GPU computes)
  int rank_ = 0;  // in the shard group
  int64_t shard_numel_ = 0;
  at::Tensor sharded_;   // [shard_numel_] master dtype; on the host when offloaded
  at::Tensor gathered_;  // [padded_numel()] param dtype; storage freed while sharded (the shard when gathered_is_shard)
  PendingCollective gather_;
  CountedTensor wire_{memory::BufferKind::kComm};  // [padded_numel()] param dtype, rank-major: a placed shard's gather
  CountedTensor kept_{memory::BufferKind::kGathered};  // [padded_numel() / k] param dtype: the part kept after forward
  dist::ProcessGroup* kept_group_ = nullptr;           // the k ranks whose kept parts make the buffer

};

}  // namespace fsdp
