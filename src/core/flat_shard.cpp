#include "core/flat_shard.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "fsdp/common/buffer_accounting.h"
#include "fsdp/common/compat.h"
#include "fsdp/common/deferred_tensor.h"
#include "fsdp/common/error.h"
#include "fsdp/common/flat_buffer.h"
#include "fsdp/common/host_buffer.h"
#include "fsdp/distributed/collectives.h"

#include "core/comm_context.h"
#include "core/fsdp_collectives.h"

namespace fsdp {

FlatShard::FlatShard(std::vector<FSDPParam> params, const dist::DeviceMesh& mesh, const FullyShardOptions& options,
                     const TreeComm& startup)
    : params_(std::move(params)),
      shard_group_(&mesh.shard_group()),
      replicate_group_(&mesh.replicate_group()),
      world_group_(&mesh.world().group()) {
  FSDP_ASSERT(!params_.empty());
  const FSDPParam& first = params_.front();
  master_dtype_ = first.param.scalar_type();
  placed_ = first.shard_dim >= 0;
  rank_ = shard_group_->rank();
  device_ = first.param.device();
  for (const auto& p : params_) {
    FSDP_CHECK(!p.param.is_meta(), "fully_shard: parameter '", p.fqn,
               "' is on the meta device, which cannot be swapped for CPU memory in place; create it with "
               "fsdp::deferred_empty(shape) and pass FullyShardOptions::param_init");
    // The group gives each dtype, and each layout, a flat shard of its own.
    FSDP_ASSERT(p.param.scalar_type() == master_dtype_ && (p.shard_dim >= 0) == placed_ &&
                p.full_precision == first.full_precision);
    FSDP_CHECK(at::isFloatingType(p.param.scalar_type()), "fully_shard: parameter '", p.fqn, "' is ",
               p.param.scalar_type(), ": only floating-point parameters can be sharded; list it in ignored_params");
    FSDP_CHECK(p.param.device() == device_, "fully_shard: parameter '", p.fqn, "' is on ", p.param.device(),
               " but '", first.fqn, "' in the same unit is on ", device_, ": move the module to one device first");
  }
  offloaded_ = options.offload.offloads();
  pin_memory_ = offloaded_ && options.offload.pin_memory && !device_.is_cpu();
  const auto& mp = options.mixed_precision;
  param_dtype_ = first.full_precision ? master_dtype_ : mp.param_dtype.value_or(master_dtype_);
  reduce_dtype_ = first.full_precision ? master_dtype_ : mp.reduce_dtype.value_or(param_dtype_);

  // Both layouts keep the gathered buffer parameter-major: each parameter's
  // full elements at `offset`, end to end.
  int64_t offset = 0;
  for (auto& p : params_) {
    p.shape = p.param.sizes().vec();
    p.numel = p.param.numel();
    p.offset = offset;
    offset += p.numel;
  }
  if (placed_) {
    lay_out_placed();
  } else {
    lay_out_flat();
  }
  init_shard(options, startup);
}

void FlatShard::lay_out_flat() {
  const int64_t total = params_.back().offset + params_.back().numel;
  shard_numel_ = dist::shard_numel(total, shard_group_->size());
  for (auto& p : params_) p.local = shard_range(p.offset, p.numel, shard_numel_, rank_);
}

// [Note: per-parameter placements]
// Under FullyShardOptions::shard_placement a parameter placed on Shard(d)
// is cut as torch.chunk cuts it along d: chunks of c = ceil(size_d / W)
// rows, the last ranks holding fewer or none. Every rank's shard reserves
// the padded chunk (c rows) for each parameter, end to end, so the shard
// is the same size on every rank and the rank-r chunk is a tensor of the
// chunk's shape (its first rows_held(r) rows along d are the parameter's):
// an expert weight [E, in, out] on Shard(0) leaves each rank whole experts;
// a matrix on Shard(1) leaves each rank whole rows of columns. An
// all-gather of these shards is rank-major, but the parameters view the
// gathered buffer in their own full shape, so the shard's gather lands in
// a wire buffer and finish_gather lays each chunk into place (FSDP2's
// copy-out); before a reduce-scatter, reduce_input lays each gradient's
// chunks out rank-major (FSDP2's chunk-cat). These two copies are the layout's cost
// over the flat one, where parameters view the gathered buffer in place.
// With one rank in the shard group the two orders are the same and
// nothing is copied. Placed and flat parameters of one unit go to separate
// flat shards, as dtypes do.
void FlatShard::lay_out_placed() {
  const int ranks = shard_group_->size();
  int64_t in_shard = 0;
  for (auto& p : params_) {
    const int64_t d = p.shard_dim;
    p.chunk_shape = p.shape;
    p.chunk_shape[d] = (p.shape[d] + ranks - 1) / ranks;
    const int64_t rows = p.rows_held(rank_);
    const int64_t inner = p.chunk_numel() / std::max<int64_t>(p.chunk_shape[d], 1);  // elements per row along d
    int64_t row_stride = 1;
    for (size_t i = d + 1; i < p.shape.size(); ++i) row_stride *= p.shape[i];
    p.local.begin_in_shard = in_shard;
    p.local.numel = rows * inner;
    p.local.begin_in_param = rows > 0 ? rank_ * p.chunk_shape[d] * row_stride : 0;
    in_shard += p.chunk_numel();
  }
  shard_numel_ = in_shard;
}

int64_t FSDPParam::chunk_numel() const {
  int64_t n = 1;
  for (const int64_t size : chunk_shape) n *= size;
  return n;
}

int64_t FSDPParam::rows_held(int rank) const {
  const int64_t chunk = chunk_shape[shard_dim];
  return std::clamp<int64_t>(shape[shard_dim] - rank * chunk, 0, chunk);
}

// [Note: CPU offload]
// Under OffloadPolicy::kCpu (FSDP2's CPUOffloadPolicy) a unit's master
// shard is host memory (memory::empty_host), and so are the parameters'
// sharded views, their gradients and the optimizer's state: the optimizer
// steps on the host. The compute device holds the unit only between its
// gather and its reshard:
//
//   gather       the shard copied to the compute device in the param dtype
//                (a cast and the host-to-device copy in one pass), then
//                all-gathered from there; the copy is the gather's input and
//                goes when the gather is waited. Over one rank the copy
//                lands in the gathered buffer directly.
//   reduce       as without offload, on the compute device.
//   assign       the reduced shard copied to a host buffer in the master
//                dtype (the device-to-host copy and the cast in one pass);
//                the gradients are aliases of it, as they are of the
//                reduced shard without offload.
//
// So the gathered form is never the shard (gathered_is_shard is false even
// over one rank without a cast) and the gradients take the staged path.
// Accumulation without sync stays on the compute device, in the unit's
// gradient buffer, as FSDP2 keeps it. On a CPU-only build both sides are
// CPU memory, and the host side still separate storage from its own
// allocator: a copy left out or an alias would show as a wrong number, and
// memory_stats tells the host's bytes from the compute side's.
void FlatShard::init_shard(const FullyShardOptions& options, const TreeComm& startup) {
  sharded_ = offloaded_ ? memory::empty_host(shard_numel_, master_dtype_, pin_memory_).zero_()
                        : memory::empty_flat(shard_numel_, this->options(master_dtype_)).zero_();
  for (auto& p : params_) {
    at::Tensor full;
    if (is_deferred(p.param)) {
      FSDP_CHECK(static_cast<bool>(options.param_init), "fully_shard: parameter '", p.fqn,
                 "' is deferred (no memory behind it): pass FullyShardOptions::param_init to initialise it");
      // One full parameter at a time: filled, sliced, dropped.
      full = at::empty(p.shape, this->options(master_dtype_));
      at::NoGradGuard no_grad;
      options.param_init(p.fqn, full);
    } else {
      full = p.param.detach();
    }
    if (options.sync_module_states) {
      // From global rank 0: along the shard group, then across replicas.
      at::Tensor buffer = full.contiguous().clone();
      static const std::string kUnit = "<root>";  // a new unit is the root of its own tree
      broadcast_from_rank0(UnitComm{*replicate_group_, startup.log, startup.streams, kUnit}, buffer);
      broadcast_from_rank0(UnitComm{*shard_group_, startup.log, startup.streams, kUnit}, buffer);
      full = buffer;
    }
    if (p.local.numel > 0 && placed_) {
      shard_view(sharded_, p).copy_(full.narrow(p.shard_dim, rank_ * p.chunk_shape[p.shard_dim], p.rows_held(rank_)));
    } else if (p.local.numel > 0) {
      sharded_.narrow(0, p.local.begin_in_shard, p.local.numel)
          .copy_(full.reshape({-1}).narrow(0, p.local.begin_in_param, p.local.numel));
    }
    p.param.set_data(sharded_view(p));
  }
  // Otherwise the gathered buffer is allocated at the first unshard:
  // allocating it here would hold a whole unit at once during initialisation.
  if (gathered_is_shard()) gathered_ = sharded_;
}

int64_t FlatShard::padded_numel() const { return shard_numel_ * shard_group_->size(); }

bool FlatShard::gathered_is_shard() const {
  return shard_group_->size() == 1 && param_dtype_ == master_dtype_ && !offloaded_;
}

at::Tensor FlatShard::to_host(const at::Tensor& reduced, at::ScalarType dtype, DeviceStreams& streams) const {
  DeviceStreams::StreamScope on_stream(streams, DeviceStreams::Stream::kDeviceToHost, device_);
  // Read on that stream, freed by the caller right after: the allocator
  // must not hand its memory out before the copy is done.
  if (on_stream.on_device()) reduced.record_stream(DeviceStreams::current_stream(device_));
  return memory::host_copy(reduced, dtype, pin_memory_);
}

at::Tensor FlatShard::sharded_view(const FSDPParam& p) const { return shard_view(sharded_, p); }

at::Tensor FlatShard::shard_view(const at::Tensor& flat, const FSDPParam& p) const {
  if (!placed_) return flat.narrow(0, p.local.begin_in_shard, p.local.numel);
  return flat.narrow(0, p.local.begin_in_shard, p.chunk_numel())
      .view(p.chunk_shape)
      .narrow(p.shard_dim, 0, p.rows_held(rank_));
}

bool FlatShard::chunks_are_ranges(const FSDPParam& p) const {
  if (!placed_ || p.numel == 0 || p.chunk_shape[p.shard_dim] >= p.shape[p.shard_dim]) return true;
  for (int64_t i = 0; i < p.shard_dim; ++i) {
    if (p.shape[i] != 1) return false;
  }
  return true;
}

namespace {

// Calls fn(rows, chunk) for each rank's non-empty chunk of each placed
// parameter: its rows in a parameter-major tensor, and where they sit in a
// rank-major wire buffer.
template <typename Fn>
void for_each_chunk(const std::vector<FSDPParam>& params, int ranks, int64_t shard_numel,
                    const at::Tensor& param_major, const at::Tensor& wire, Fn&& fn) {
  const at::Tensor by_rank = wire.view({ranks, shard_numel});
  for (const auto& p : params) {
    const at::Tensor full = param_major.narrow(0, p.offset, p.numel).view(p.shape);
    const int64_t chunk = p.chunk_shape[p.shard_dim];
    for (int r = 0; r < ranks && p.rows_held(r) > 0; ++r) {
      const int64_t rows = p.rows_held(r);
      const at::Tensor in_wire = by_rank[r].narrow(0, p.local.begin_in_shard, p.chunk_numel()).view(p.chunk_shape);
      fn(full.narrow(p.shard_dim, r * chunk, rows), in_wire.narrow(p.shard_dim, 0, rows));
    }
  }
}

}  // namespace

void FlatShard::copy_out(const at::Tensor& wire, const at::Tensor& out) const {
  for_each_chunk(params_, shard_group_->size(), shard_numel_, out, wire,
                 [](const at::Tensor& rows, const at::Tensor& chunk) { rows.copy_(chunk); });
}

at::Tensor FlatShard::reduce_input(const at::Tensor& grads) const {
  if (!reorders()) return grads;
  at::Tensor wire = memory::empty_flat(padded_numel(), grads.options()).zero_();
  for_each_chunk(params_, shard_group_->size(), shard_numel_, grads, wire,
                 [](const at::Tensor& rows, const at::Tensor& chunk) { chunk.copy_(rows); });
  return wire;
}

void FlatShard::start_gather(const UnitComm& over) {
  if (gathered_is_shard()) return;
  allocate_gathered();
  if (kept_.defined()) {
    gather_ = all_gather(UnitComm{*kept_group_, over.log, over.streams, over.unit}, kept_.get(), gathered_);
    return;
  }
  if (reorders()) wire_.reset(memory::empty_flat(padded_numel(), options(param_dtype_)));
  const at::Tensor& into = wire_.defined() ? wire_.get() : gathered_;
  if (offloaded_ && shard_group_->size() > 1) {
    // The host-to-device copy, cast as it copies, is the gather's input
    // ([Note: CPU offload]), made on the gather's stream; its record frees
    // it once waited.
    DeviceStreams::StreamScope on_stream(over.streams, DeviceStreams::Stream::kAllGather, device_);
    CountedTensor on_device{memory::BufferKind::kComm};
    on_device.reset(memory::device_copy(sharded_, param_dtype_, device_));
    gather_ = all_gather(over, on_device.get(), into);
    gather_.input = std::move(on_device);
    return;
  }
  gather_ = all_gather(over, sharded_, into);
}

void FlatShard::finish_gather(EventLog& log) {
  gather_.wait(log, "FSDP::all_gather_wait");
  kept_.reset();
  if (!wire_.defined()) return;
  copy_out(wire_.get(), gathered_);
  wire_.reset();
}

void FlatShard::abandon_gather(EventLog& log) noexcept {
  try {
    gather_.wait(log, "FSDP::all_gather_wait");  // marked waited in the event log, as every issued one is
  } catch (const std::exception&) {
    gather_.abandon();
  }
  wire_.reset();  // never copied out
}

at::Tensor FlatShard::copy_of_part(int ranks, int index) const {
  if (gathered_is_shard()) return at::Tensor();
  const int64_t chunk = padded_numel() / ranks;
  return gathered_.narrow(0, index * chunk, chunk).clone();
}

void FlatShard::keep_part(const at::Tensor& part, dist::ProcessGroup& within) {
  kept_.reset(part);
  kept_group_ = &within;
}

at::Tensor FlatShard::parameter_major(const at::Tensor& wire) const {
  if (!reorders()) return wire;
  at::Tensor out = at::empty_like(wire);
  copy_out(wire, out);
  return out;
}

at::Tensor FlatShard::gathered_view(const FSDPParam& p) const {
  return gathered_.narrow(0, p.offset, p.numel).view(p.shape);
}

void FlatShard::allocate_gathered() {
  if (gathered_is_shard()) return;
  const int64_t nbytes = gathered_bytes();
  if (!gathered_.defined()) {
    gathered_ = memory::empty_flat(padded_numel(), options(param_dtype_));
  } else if (static_cast<int64_t>(gathered_.storage().nbytes()) == nbytes) {
    return;
  } else {
    compat::resize_storage_bytes(gathered_, nbytes);
  }
  memory::count(memory::BufferKind::kGathered, nbytes);
}

void FlatShard::free_gathered() {
  if (gathered_is_shard() || !gathered_.defined()) return;
  const auto nbytes = static_cast<int64_t>(gathered_.storage().nbytes());
  if (nbytes == 0) return;
  compat::resize_storage_bytes(gathered_, 0);
  memory::count(memory::BufferKind::kGathered, -nbytes);
}

int64_t FlatShard::gathered_bytes_held() const {
  if (gathered_is_shard() || !gathered_.defined()) return 0;
  return static_cast<int64_t>(gathered_.storage().nbytes());
}

int64_t FlatShard::gathered_bytes() const {
  return padded_numel() * static_cast<int64_t>(c10::elementSize(param_dtype_));
}

int64_t FlatShard::reduction_bytes() const {
  // Unsharded gradients (or their cast), a receive buffer of the same size
  // (reduce-scatter built from an all-to-all) and the reduced shard.
  const auto reduce_size = static_cast<int64_t>(c10::elementSize(reduce_dtype_));
  const auto param_size = static_cast<int64_t>(c10::elementSize(param_dtype_));
  return padded_numel() * (param_size + 2 * reduce_size) + shard_numel_ * reduce_size;
}

}  // namespace fsdp
