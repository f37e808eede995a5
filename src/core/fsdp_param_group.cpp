#include "fsdp/core/fsdp_param_group.h"

#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "fsdp/common/error.h"
#include "fsdp/core/memory.h"

namespace fsdp {

// [Note: FSDP and autograd]
// Each parameter tensor is the same object from construction to the end of
// the run; unshard/reshard swap what it points at with set_data (a shallow
// copy of storage, shape and dtype). Autograd saves leaf parameters by
// reference, so a parameter saved in forward is read in backward through the
// data it points at then: the gathered view again, since the unit is
// unsharded before its backward runs. Views of parameters saved in forward
// (w.t() in a linear layer) alias the gathered buffer's storage itself;
// that is why freeing resizes the storage to 0 bytes and gathering resizes it
// back, never replacing it.
//
// Gradients: autograd accumulates a full-shape gradient into each parameter
// (its AccumulateGrad node has our post-hook, which counts). When the last
// one of a unit has arrived, every node that reads the unit's parameters has
// run, so the gradients are moved into one flat buffer, reduce-scattered
// asynchronously and the unit is resharded. At the end of backward the root
// waits for the reduce-scatters and each parameter gets its sharded gradient:
// a 1-D tensor matching its sharded data, which is what the optimizer sees.
//
// set_data to another dtype (fp32 shard <-> bf16 gathered view) makes
// autograd drop the parameter's AccumulateGrad node, so hooks are
// registered again whenever the node changes (each unshard under mixed
// precision); the node keeps a hook only while someone holds it, hence
// FSDPParam::grad_accumulator.

// [Note: gradients in place]
// When a unit's shard group has one rank (W = 1, or no_shard) and gradients
// are reduced in the parameters' dtype, the sharded and gathered forms are
// the same memory, so gradients need not move either: every parameter's
// .grad is a view of one persistent flat buffer, full-shape while gathered
// and 1-D while sharded. LibTorch's AccumulateGrad adds into a defined
// gradient in place (outside create_graph), zero_grad zeroes it in place,
// and the only communication left is the all-reduce across replicas. A
// gradient the user replaced is copied back into the buffer.

namespace {

class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(FSDPParamGroup* group) : group_(group) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    group_->on_grad_ready();
    return outputs;
  }

 private:
  FSDPParamGroup* group_;
};

bool is_low_precision(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// A tensor over `flat`'s memory that autograd does not treat as a view:
// optimizers' zero_grad calls detach_() on gradients, which views refuse.
at::Tensor alias_of(const at::Tensor& flat, int64_t offset, at::IntArrayRef shape) {
  return at::empty({0}, flat.options()).set_(flat.storage(), flat.storage_offset() + offset, shape,
                                             c10::contiguous_strides(shape));
}

void resize_storage(const at::Tensor& t, int64_t nbytes) {
  at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), static_cast<size_t>(nbytes));
}

}  // namespace

bool FSDPParam::requires_grad() const { return param.requires_grad(); }

FSDPParamGroup::FSDPParamGroup(std::vector<FSDPParam> params, const dist::DeviceMesh& mesh,
                               const FullyShardOptions& options)
    : params_(std::move(params)),
      shard_group_(&mesh.shard_group()),
      replicate_group_(&mesh.replicate_group()),
      mp_(options.mixed_precision) {
  FSDP_ASSERT(!params_.empty());
  orig_dtype_ = params_.front().param.scalar_type();
  for (const auto& p : params_) {
    FSDP_CHECK(p.param.scalar_type() == orig_dtype_, "fully_shard: parameter '", p.fqn, "' is ",
               p.param.scalar_type(), " but '", params_.front().fqn, "' in the same unit is ", orig_dtype_,
               ": one unit holds one dtype; convert the module (module->to(dtype)) or shard these parameters in "
               "separate units");
    FSDP_CHECK(at::isFloatingType(p.param.scalar_type()), "fully_shard: parameter '", p.fqn, "' is ",
               p.param.scalar_type(), ": only floating-point parameters can be sharded; list it in ignored_params");
  }
  master_dtype_ = is_low_precision(orig_dtype_) ? at::kFloat : orig_dtype_;
  param_dtype_ = mp_.param_dtype.value_or(orig_dtype_);
  reduce_dtype_ = mp_.reduce_dtype.value_or(param_dtype_);

  int64_t offset = 0;
  for (auto& p : params_) {
    p.shape = p.param.sizes().vec();
    p.numel = p.param.numel();
    p.offset = offset;
    offset += p.numel;
  }
  total_numel_ = offset;
  const int w = shard_group_->size();
  shard_numel_ = dist::shard_numel(total_numel_, w);
  padded_numel_ = shard_numel_ * w;
  for (auto& p : params_) p.local = shard_range(p.offset, p.numel, shard_numel_, shard_group_->rank());
  for (const auto& p : params_) grads_expected_ += p.requires_grad() ? 1 : 0;
  init_shard(options);
}

void FSDPParamGroup::init_shard(const FullyShardOptions& options) {
  sharded_flat_ = at::zeros({shard_numel_}, at::TensorOptions().dtype(master_dtype_));
  for (auto& p : params_) {
    at::Tensor full;
    FSDP_CHECK(!p.param.is_meta(), "fully_shard: parameter '", p.fqn,
               "' is on the meta device, which cannot be swapped for CPU memory in place; create it with "
               "fsdp::deferred_empty(shape) and pass FullyShardOptions::param_init");
    if (is_deferred(p.param)) {
      FSDP_CHECK(static_cast<bool>(options.param_init), "fully_shard: parameter '", p.fqn,
                 "' is deferred (no memory behind it): pass FullyShardOptions::param_init to initialise it");
      // One full parameter at a time: filled, sliced, dropped.
      full = at::empty(p.shape, at::TensorOptions().dtype(orig_dtype_));
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
      sharded_flat_.narrow(0, p.local.begin_in_shard, p.local.numel)
          .copy_(full.reshape({-1}).narrow(0, p.local.begin_in_param, p.local.numel));
    }
    p.param.set_data(sharded_view(p));
  }
  unsharded_aliases_sharded_ = shard_group_->size() == 1 && param_dtype_ == master_dtype_;
  grads_in_place_ = unsharded_aliases_sharded_ && reduce_dtype_ == param_dtype_;
  // Without aliasing, the gathered buffer is allocated at the first unshard:
  // allocating it here would hold a whole unit at once during initialisation.
  if (unsharded_aliases_sharded_) unsharded_flat_ = sharded_flat_;
}

at::Tensor FSDPParamGroup::sharded_view(const FSDPParam& p) const {
  return sharded_flat_.narrow(0, p.local.begin_in_shard, p.local.numel);
}

at::Tensor FSDPParamGroup::unsharded_view(const FSDPParam& p) const {
  return unsharded_flat_.narrow(0, p.offset, p.numel).view(p.shape);
}

void FSDPParamGroup::allocate_unsharded() {
  if (unsharded_aliases_sharded_) return;
  const int64_t nbytes = padded_numel_ * static_cast<int64_t>(c10::elementSize(param_dtype_));
  if (!unsharded_flat_.defined()) {
    unsharded_flat_ = at::empty({padded_numel_}, at::TensorOptions().dtype(param_dtype_));
  } else if (static_cast<int64_t>(unsharded_flat_.storage().nbytes()) == nbytes) {
    return;
  } else {
    resize_storage(unsharded_flat_, nbytes);
  }
  memory::on_gathered(nbytes);
}

void FSDPParamGroup::free_unsharded() {
  if (unsharded_aliases_sharded_ || !unsharded_flat_.defined()) return;
  const auto nbytes = static_cast<int64_t>(unsharded_flat_.storage().nbytes());
  if (nbytes == 0) return;
  resize_storage(unsharded_flat_, 0);
  memory::on_gathered(-nbytes);
}

void FSDPParamGroup::unshard() {
  if (state_ == ShardedState::kUnsharded || all_gather_work_ || unsharded_aliases_sharded_) return;
  allocate_unsharded();
  at::Tensor input = param_dtype_ == master_dtype_ ? sharded_flat_ : sharded_flat_.to(param_dtype_);
  if (shard_group_->size() == 1) {
    unsharded_flat_.copy_(input);
    return;
  }
  all_gather_input_ = input;
  all_gather_work_ = dist::all_gather_into_tensor(*shard_group_, unsharded_flat_, all_gather_input_);
}

void FSDPParamGroup::wait_for_unshard() {
  if (state_ == ShardedState::kUnsharded) return;
  unshard();  // no-op when prefetched
  if (all_gather_work_) {
    all_gather_work_->wait();
    all_gather_work_.reset();
    all_gather_input_ = at::Tensor();
  }
  for (auto& p : params_) {
    p.param.set_data(unsharded_view(p));
    if (grads_in_place_) {
      ensure_grad_flat();
      if (p.requires_grad()) attach_grad_view(p, alias_of(grad_flat_, p.offset, p.shape));
    } else if (p.param.grad().defined()) {
      // Last step's sharded gradient waits aside; autograd starts a fresh one.
      p.sharded_grad_stash = p.param.grad();
      p.param.mutable_grad() = at::Tensor();
    }
  }
  register_grad_hooks();
  state_ = ShardedState::kUnsharded;
}

void FSDPParamGroup::reshard() {
  if (all_gather_work_) {  // prefetched but never used: finish before freeing
    all_gather_work_->wait();
    all_gather_work_.reset();
    all_gather_input_ = at::Tensor();
  }
  if (state_ == ShardedState::kSharded) {
    free_unsharded();
    return;
  }
  for (auto& p : params_) {
    p.param.set_data(sharded_view(p));
    if (grads_in_place_) {
      ensure_grad_flat();
      if (p.requires_grad()) attach_grad_view(p, alias_of(grad_flat_, p.local.begin_in_shard, {p.local.numel}));
      continue;
    }
    if (p.sharded_grad_stash.defined() && !p.param.grad().defined()) {
      p.param.mutable_grad() = p.sharded_grad_stash;
    }
    p.sharded_grad_stash = at::Tensor();
  }
  free_unsharded();
  state_ = ShardedState::kSharded;
}

void FSDPParamGroup::attach_grad_view(FSDPParam& p, const at::Tensor& view) {
  // `view` is over grad_flat_, which exists from the first use on (see alias_of callers).
  at::Tensor& grad = p.param.mutable_grad();
  if (!grad.defined()) {
    view.zero_();  // set to none by the user: start from zero
  } else if (!grad.is_alias_of(view)) {
    view.copy_(grad.reshape(view.sizes()));  // replaced by the user or by autograd
  }
  grad = view;
}

void FSDPParamGroup::ensure_grad_flat() {
  // Allocated on first use, not at sharding: a model that only runs
  // inference, or is still being initialised, holds no gradient memory.
  if (!grad_flat_.defined()) grad_flat_ = at::zeros({padded_numel_}, at::TensorOptions().dtype(master_dtype_));
}

void FSDPParamGroup::register_grad_hooks() {
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(p.param);
    if (accumulator == p.grad_accumulator) continue;
    accumulator->add_post_hook(std::make_unique<GradReadyHook>(this));
    p.grad_accumulator = std::move(accumulator);
  }
}

void FSDPParamGroup::reset_backward_state() {
  grads_ready_ = 0;
  post_backward_done_ = false;
  reduced_this_backward_ = false;
}

void FSDPParamGroup::on_grad_ready() {
  if (++grads_ready_ == grads_expected_) post_backward();
}

void FSDPParamGroup::post_backward() {
  if (post_backward_done_) return;
  post_backward_done_ = true;
  if (grads_expected_ == 0) {
    reshard();
    return;
  }
  if (grads_in_place_) {
    reshard();  // re-attaches every gradient view, copying any that autograd replaced
    if (!requires_gradient_sync) return;
    reduced_this_backward_ = true;
    if (replicate_group_->size() > 1) {
      reduce_work_ = dist::all_reduce(*replicate_group_, grad_flat_, dist::ReduceOp::kAvg);
    }
    return;
  }
  // Move the full-shape gradients into one flat buffer; the padding is zero.
  at::Tensor flat = at::empty({padded_numel_}, at::TensorOptions().dtype(reduce_dtype_));
  flat.narrow(0, total_numel_, padded_numel_ - total_numel_).zero_();
  for (auto& p : params_) {
    at::Tensor slice = flat.narrow(0, p.offset, p.numel);
    const at::Tensor& grad = p.param.grad();
    if (grad.defined() && state_ == ShardedState::kUnsharded) {
      slice.copy_(grad.reshape({-1}));
      p.param.mutable_grad() = at::Tensor();
    } else {
      slice.zero_();  // not used in this forward
    }
  }
  if (unsynced_grads_.defined()) {
    flat.add_(unsynced_grads_);
    unsynced_grads_ = at::Tensor();
  }
  reshard();
  if (!requires_gradient_sync) {
    unsynced_grads_ = flat;
    return;
  }
  reduced_this_backward_ = true;
  if (shard_group_->size() == 1) {
    reduce_output_ = flat;
    return;
  }
  reduce_input_ = flat;
  reduce_output_ = at::empty({shard_numel_}, at::TensorOptions().dtype(reduce_dtype_));
  reduce_work_ = dist::reduce_scatter_tensor(*shard_group_, reduce_output_, reduce_input_, dist::ReduceOp::kAvg);
}

void FSDPParamGroup::finalize_backward() {
  post_backward();
  if (reduce_work_) {
    reduce_work_->wait();
    reduce_work_.reset();
    reduce_input_ = at::Tensor();
  }
  if (!reduced_this_backward_) return;
  if (grads_in_place_) {
    reduced_this_backward_ = false;
    return;
  }
  if (replicate_group_->size() > 1) dist::all_reduce(*replicate_group_, reduce_output_, dist::ReduceOp::kAvg).wait();
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    const at::Tensor reduced = reduce_output_.narrow(0, p.local.begin_in_shard, p.local.numel);
    if (p.param.grad().defined()) {
      p.param.mutable_grad().add_(reduced);  // accumulates across steps unless zeroed
    } else {
      p.param.mutable_grad() = reduced.to(master_dtype_, /*non_blocking=*/false, /*copy=*/true);
    }
  }
  reduce_output_ = at::Tensor();
  reduced_this_backward_ = false;
}

int64_t FSDPParamGroup::sharded_param_bytes() const { return static_cast<int64_t>(sharded_flat_.nbytes()); }

int64_t FSDPParamGroup::unsharded_bytes_held() const {
  if (unsharded_aliases_sharded_ || !unsharded_flat_.defined()) return 0;
  return static_cast<int64_t>(unsharded_flat_.storage().nbytes());
}

}  // namespace fsdp
