#include "core/flat_shard.h"

#include <ATen/ATen.h>

#include "fsdp/common/buffer_accounting.h"
#include "fsdp/common/compat.h"
#include "fsdp/common/deferred_tensor.h"
#include "fsdp/common/error.h"
#include "fsdp/common/flat_buffer.h"
#include "fsdp/dist/collectives.h"

namespace fsdp {

FlatShard::FlatShard(std::vector<FSDPParam> params, const dist::DeviceMesh& mesh, const FullyShardOptions& options)
    : params_(std::move(params)),
      shard_group_(&mesh.shard_group()),
      replicate_group_(&mesh.replicate_group()),
      world_group_(&mesh.world().group()) {
  FSDP_ASSERT(!params_.empty());
  const FSDPParam& first = params_.front();
  master_dtype_ = first.param.scalar_type();
  device_ = first.param.device();
  for (const auto& p : params_) {
    FSDP_CHECK(!p.param.is_meta(), "fully_shard: parameter '", p.fqn,
               "' is on the meta device, which cannot be swapped for CPU memory in place; create it with "
               "fsdp::deferred_empty(shape) and pass FullyShardOptions::param_init");
    FSDP_ASSERT(p.param.scalar_type() == master_dtype_);  // the group gives each dtype a flat shard of its own
    FSDP_CHECK(at::isFloatingType(p.param.scalar_type()), "fully_shard: parameter '", p.fqn, "' is ",
               p.param.scalar_type(), ": only floating-point parameters can be sharded; list it in ignored_params");
    FSDP_CHECK(p.param.device() == device_, "fully_shard: parameter '", p.fqn, "' is on ", p.param.device(),
               " but '", first.fqn, "' in the same unit is on ", device_, ": move the module to one device first");
  }
  const auto& mp = options.mixed_precision;
  param_dtype_ = mp.param_dtype.value_or(master_dtype_);
  reduce_dtype_ = mp.reduce_dtype.value_or(param_dtype_);

  int64_t offset = 0;
  for (auto& p : params_) {
    p.shape = p.param.sizes().vec();
    p.numel = p.param.numel();
    p.offset = offset;
    offset += p.numel;
  }
  shard_numel_ = dist::shard_numel(offset, shard_group_->size());
  for (auto& p : params_) p.local = shard_range(p.offset, p.numel, shard_numel_, shard_group_->rank());
  init_shard(options);
}

void FlatShard::init_shard(const FullyShardOptions& options) {
  sharded_ = memory::empty_flat(shard_numel_, this->options(master_dtype_)).zero_();
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
      if (replicate_group_->size() > 1) dist::broadcast(*replicate_group_, buffer, 0).wait();
      if (shard_group_->size() > 1) dist::broadcast(*shard_group_, buffer, 0).wait();
      full = buffer;
    }
    if (p.local.numel > 0) {
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

bool FlatShard::gathered_is_shard() const { return shard_group_->size() == 1 && param_dtype_ == master_dtype_; }

at::Tensor FlatShard::sharded_view(const FSDPParam& p) const {
  return sharded_.narrow(0, p.local.begin_in_shard, p.local.numel);
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
