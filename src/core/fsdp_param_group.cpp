#include "fsdp/core/fsdp_param_group.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "fsdp/common/compat.h"
#include "fsdp/common/error.h"
#include "fsdp/core/comm_context.h"
#include "fsdp/dist/flight_recorder.h"
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
// Gradients: before a unit's backward, each trainable parameter's .grad
// becomes a full-shape view of one flat gradient buffer, so autograd's
// AccumulateGrad adds into it in place (outside create_graph) and the buffer
// is the reduce-scatter's input as it stands. AccumulateGrad's post-hook
// only marks the parameter as used. When the unit's backward is done (see
// [Note: when a unit's backward ends] in fsdp_state.cpp) the unit is
// resharded and the buffer reduce-scattered asynchronously; each parameter
// then gets its sharded gradient: a 1-D tensor matching its sharded data,
// which is what the optimizer sees.
//
// set_data to another dtype (fp32 shard <-> bf16 gathered view) makes
// autograd drop the parameter's AccumulateGrad node, so hooks are
// registered again whenever the node changes (each unshard under mixed
// precision); the node keeps a hook only while someone holds it, hence
// FSDPParam::grad_accumulator.

// [Note: gradients in place]
// The gradient path (GradientPath) is decided once, at sharding, from the
// shard group's size and the dtypes:
//
//   kInPlace       one rank per shard group (W = 1, no_shard), no cast anywhere
//   kAliasedShard  one rank per shard group, gradients reduced in another dtype
//   kGathered      anything else: a gathered buffer and a reduce-scatter
//
// What each step does on each path:
//
//   step              kInPlace                    kAliasedShard               kGathered
//   unshard           nothing (the shard is       nothing (the same)          all-gather into the
//                     the unit)                                               gathered buffer
//   wait_for_unshard  params view the shard in    params view the shard in    params view the gathered
//                     full shape; existing grads  full shape; last step's     buffer; last step's
//                     become full-shape views of  sharded grads set aside     sharded grads set aside
//                     the persistent grad buffer  (stash)                     (stash)
//   prepare_gradients nothing (attached above)    existing grads become views of a flat grad buffer
//   post_backward     grads re-viewed 1-D in the  fresh grads copied into the flat buffer, missing
//                     persistent buffer           ones zeroed; cast to the reduce dtype; kept aside
//                                                 without sync, else handed to the CommContext
//   reduce            replicas: all-reduce the    the buffer is the reduced   reduce-scatter; replicas:
//                     persistent buffer           shard; replicas: all-reduce all-reduce the shard
//   assign_gradients  nothing: grads are views   divide factor and hook on the reduced shard, cast to
//                     of the reduced buffer       the master dtype; each grad becomes a view of its
//                     already                     slice (or is added to, when accumulating)
//
// On kInPlace the gradients live in one persistent flat buffer: every
// parameter's .grad is a view of it, full-shape while gathered and 1-D
// while sharded. LibTorch's AccumulateGrad adds into a defined gradient in
// place (outside create_graph), zero_grad zeroes it in place, and the only
// communication left is the all-reduce across replicas (DDP's
// gradient-as-bucket-view). A gradient the user replaced is copied back
// into the buffer. A divide factor or a reduced-gradient hook would act on
// the whole buffer, this backward's gradients and the ones kept in place
// alike, so setting one moves the unit to kAliasedShard.

namespace {

// Marks one parameter of the group as having received a gradient.
class GradUsedHook : public torch::autograd::FunctionPostHook {
 public:
  GradUsedHook(FSDPParamGroup* group, size_t index) : group_(group), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    group_->mark_used(index_);
    return outputs;
  }

 private:
  FSDPParamGroup* group_;
  size_t index_;
};

// A tensor over `flat`'s memory that autograd does not treat as a view:
// optimizers' zero_grad calls detach_() on gradients, which views refuse.
at::Tensor alias_of(const at::Tensor& flat, int64_t offset, at::IntArrayRef shape) {
  return at::empty({0}, flat.options()).set_(flat.storage(), flat.storage_offset() + offset, shape,
                                             c10::contiguous_strides(shape));
}

}  // namespace

bool FSDPParam::requires_grad() const { return param.requires_grad(); }

const char* to_string(GradientPath path) {
  switch (path) {
    case GradientPath::kInPlace: return "in_place";
    case GradientPath::kAliasedShard: return "aliased_shard";
    case GradientPath::kGathered: return "gathered";
  }
  return "?";
}

FSDPParamGroup::FSDPParamGroup(std::vector<FSDPParam> params, const dist::DeviceMesh& mesh,
                               const FullyShardOptions& options)
    : params_(std::move(params)),
      shard_group_(&mesh.shard_group()),
      replicate_group_(&mesh.replicate_group()),
      world_group_(&mesh.world().group()),
      mp_(options.mixed_precision) {
  FSDP_ASSERT(!params_.empty());
  orig_dtype_ = params_.front().param.scalar_type();
  device_ = params_.front().param.device();
  for (const auto& p : params_) {
    FSDP_CHECK(!p.param.is_meta(), "fully_shard: parameter '", p.fqn,
               "' is on the meta device, which cannot be swapped for CPU memory in place; create it with "
               "fsdp::deferred_empty(shape) and pass FullyShardOptions::param_init");
    FSDP_CHECK(p.param.scalar_type() == orig_dtype_, "fully_shard: parameter '", p.fqn, "' is ",
               p.param.scalar_type(), " but '", params_.front().fqn, "' in the same unit is ", orig_dtype_,
               ": one unit holds one dtype; convert the module (module->to(dtype)) or shard these parameters in "
               "separate units");
    FSDP_CHECK(at::isFloatingType(p.param.scalar_type()), "fully_shard: parameter '", p.fqn, "' is ",
               p.param.scalar_type(), ": only floating-point parameters can be sharded; list it in ignored_params");
    FSDP_CHECK(p.param.device() == device_, "fully_shard: parameter '", p.fqn, "' is on ", p.param.device(),
               " but '", params_.front().fqn, "' in the same unit is on ", device_,
               ": move the module to one device first");
  }
  // FSDP2 shards what it is given: a bf16 module keeps bf16 shards (no fp32
  // master copy); mixed precision over an fp32 module keeps fp32 ones.
  master_dtype_ = orig_dtype_;
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
  used_.assign(params_.size(), 0);
  init_shard(options);
}

void FSDPParamGroup::attach(CommContext* comm, const std::string* unit_name) {
  comm_ = comm;
  name_ = unit_name;
}

void FSDPParamGroup::init_shard(const FullyShardOptions& options) {
  const auto on_device = at::TensorOptions().device(device_);
  sharded_flat_ = memory::empty_flat(shard_numel_, on_device.dtype(master_dtype_)).zero_();
  for (auto& p : params_) {
    at::Tensor full;
    if (is_deferred(p.param)) {
      FSDP_CHECK(static_cast<bool>(options.param_init), "fully_shard: parameter '", p.fqn,
                 "' is deferred (no memory behind it): pass FullyShardOptions::param_init to initialise it");
      // One full parameter at a time: filled, sliced, dropped.
      full = at::empty(p.shape, on_device.dtype(orig_dtype_));
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
  if (shard_group_->size() > 1 || param_dtype_ != master_dtype_) {
    path_ = GradientPath::kGathered;
  } else {
    path_ = reduce_dtype_ == param_dtype_ ? GradientPath::kInPlace : GradientPath::kAliasedShard;
  }
  // Without aliasing, the gathered buffer is allocated at the first unshard:
  // allocating it here would hold a whole unit at once during initialisation.
  if (aliased()) unsharded_flat_ = sharded_flat_;
}

at::Tensor FSDPParamGroup::sharded_view(const FSDPParam& p) const {
  return sharded_flat_.narrow(0, p.local.begin_in_shard, p.local.numel);
}

at::Tensor FSDPParamGroup::unsharded_view(const FSDPParam& p) const {
  return unsharded_flat_.narrow(0, p.offset, p.numel).view(p.shape);
}

int64_t FSDPParamGroup::gathered_bytes() const {
  return padded_numel_ * static_cast<int64_t>(c10::elementSize(param_dtype_));
}

int64_t FSDPParamGroup::reduction_bytes() const {
  // Unsharded gradients (or their cast), a receive buffer of the same size
  // (reduce-scatter built from an all-to-all) and the reduced shard.
  const auto reduce_size = static_cast<int64_t>(c10::elementSize(reduce_dtype_));
  const auto param_size = static_cast<int64_t>(c10::elementSize(param_dtype_));
  return padded_numel_ * (param_size + 2 * reduce_size) + shard_numel_ * reduce_size;
}

void FSDPParamGroup::allocate_unsharded() {
  if (aliased()) return;
  const int64_t nbytes = gathered_bytes();
  if (!unsharded_flat_.defined()) {
    unsharded_flat_ = memory::empty_flat(padded_numel_, at::TensorOptions().device(device_).dtype(param_dtype_));
  } else if (static_cast<int64_t>(unsharded_flat_.storage().nbytes()) == nbytes) {
    return;
  } else {
    compat::resize_storage_bytes(unsharded_flat_, nbytes);
  }
  memory::count(memory::BufferKind::kGathered, nbytes);
}

void FSDPParamGroup::free_unsharded() {
  if (aliased() || !unsharded_flat_.defined()) return;
  const auto nbytes = static_cast<int64_t>(unsharded_flat_.storage().nbytes());
  if (nbytes == 0) return;
  compat::resize_storage_bytes(unsharded_flat_, 0);
  memory::count(memory::BufferKind::kGathered, -nbytes);
}

void FSDPParamGroup::unshard() {
  if (state_ == ShardedState::kUnsharded || all_gather_work_ || aliased()) return;
  RECORD_USER_SCOPE("FSDP::all_gather");
  allocate_unsharded();
  CommContext::StreamScope on_stream(*comm_, CommContext::Stream::kAllGather);
  if (shard_group_->size() == 1) {
    unsharded_flat_.copy_(sharded_flat_);  // the shard is the unit: one pass, casting as it copies
    return;
  }
  if (param_dtype_ != master_dtype_) all_gather_input_.reset(memory::flat_copy(sharded_flat_, param_dtype_));
  const at::Tensor& input = param_dtype_ == master_dtype_ ? sharded_flat_ : all_gather_input_.get();
  all_gather_event_ = comm_->record(FSDPEvent::Kind::kAllGather, *name_);
  dist::CollectiveLabel label(*name_);
  all_gather_work_ = dist::all_gather_into_tensor(*shard_group_, unsharded_flat_, input);
}

void FSDPParamGroup::finish_all_gather() {
  if (!all_gather_work_) return;
  RECORD_USER_SCOPE("FSDP::all_gather_wait");
  std::optional<dist::Work> work = std::move(all_gather_work_);
  all_gather_work_.reset();
  work->wait();
  comm_->mark_waited(all_gather_event_);
  all_gather_input_.reset();
}

void FSDPParamGroup::wait_for_unshard() {
  if (state_ == ShardedState::kUnsharded) return;
  unshard();  // no-op when prefetched
  finish_all_gather();
  for (auto& p : params_) {
    p.param.set_data(unsharded_view(p));
    if (in_place()) {
      ensure_grad_flat();
      if (p.requires_grad()) attach_existing_grad_view(p, alias_of(grad_flat_, p.offset, p.shape));
    } else if (p.param.grad().defined()) {
      // Last step's sharded gradient waits aside; backward works on a full-shape one.
      p.sharded_grad_stash = p.param.grad();
      p.param.mutable_grad() = at::Tensor();
    }
  }
  register_grad_hooks();
  state_ = ShardedState::kUnsharded;
  ++epoch_;
}

void FSDPParamGroup::reshard() {
  if (all_gather_work_) ++epoch_;  // a pending gather dropped
  finish_all_gather();  // prefetched but never used: finish before freeing
  if (state_ == ShardedState::kSharded) {
    free_unsharded();
    return;
  }
  ++epoch_;
  for (auto& p : params_) {
    p.param.set_data(sharded_view(p));
    if (in_place()) {
      // After forward a parameter without a gradient keeps none (backward
      // hands one over); post-backward attaches every view.
      if (p.requires_grad()) {
        attach_existing_grad_view(p, alias_of(grad_flat_, p.local.begin_in_shard, {p.local.numel}));
      }
      continue;
    }
    // A full-shape gradient still here was never collected (an abandoned
    // backward): the sharded one from before this step takes its place.
    p.param.mutable_grad() = p.sharded_grad_stash;
    p.sharded_grad_stash = at::Tensor();
  }
  free_unsharded();
  state_ = ShardedState::kSharded;
}

void FSDPParamGroup::record_grad_existence(FSDPParam& p) {
  if (p.grad_existence_recorded) return;
  p.grad_existed_before = p.param.grad().defined();
  p.grad_existence_recorded = true;
}

void FSDPParamGroup::attach_grad_view(FSDPParam& p, const at::Tensor& view) {
  record_grad_existence(p);
  at::Tensor& grad = p.param.mutable_grad();
  if (!grad.defined()) {
    view.zero_();  // none yet, or set to none by the user: start from zero
  } else if (!grad.is_alias_of(view)) {
    view.copy_(grad.reshape(view.sizes()));  // replaced by the user or by autograd
  }
  grad = view;
}

void FSDPParamGroup::attach_existing_grad_view(FSDPParam& p, const at::Tensor& view) {
  // Without a gradient yet, the parameter keeps none through backward:
  // autograd then hands over its fresh gradient (no copy), and
  // post-backward copies it into the view. Zeroing the view here would
  // make autograd add into zeros instead, two passes more for the same
  // result. A gradient that exists (the micro-steps of accumulation) is
  // attached, and autograd adds into the buffer in place.
  record_grad_existence(p);
  if (p.param.grad().defined()) attach_grad_view(p, view);
}

void FSDPParamGroup::ensure_grad_flat() {
  // Allocated on first use, not at sharding: a model that only runs
  // inference, or is still being initialised, holds no gradient memory.
  if (!grad_flat_.defined()) {
    grad_flat_ = at::zeros({padded_numel_}, at::TensorOptions().device(device_).dtype(master_dtype_));
  }
}

void FSDPParamGroup::register_grad_hooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    if (!p.requires_grad()) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(p.param);
    if (accumulator == p.grad_accumulator) continue;
    accumulator->add_post_hook(std::make_unique<GradUsedHook>(this, i));
    p.grad_accumulator = std::move(accumulator);
  }
}

const at::Tensor& FSDPParamGroup::unsharded_grad() {
  if (!unsharded_grad_.defined()) {
    unsharded_grad_.reset(memory::empty_flat(padded_numel_, at::TensorOptions().device(device_).dtype(param_dtype_)).zero_());
  }
  return unsharded_grad_.get();
}

void FSDPParamGroup::attach_sharded_grad_views() {
  for (auto& p : params_) {
    if (p.requires_grad()) attach_grad_view(p, alias_of(grad_flat_, p.local.begin_in_shard, {p.local.numel}));
  }
}

const at::Tensor& FSDPParamGroup::unsharded_grad_unfilled() {
  if (unsharded_grad_.defined()) return unsharded_grad_.get();
  // Only what no trainable parameter covers (frozen parameters, alignment,
  // padding) is zeroed here; collect_unsharded_gradients writes or zeroes
  // each trainable parameter's slice.
  at::Tensor flat = memory::empty_flat(padded_numel_, at::TensorOptions().device(device_).dtype(param_dtype_));
  std::vector<std::pair<int64_t, int64_t>> covered;
  for (const auto& p : params_) {
    if (p.requires_grad() && p.numel > 0) covered.emplace_back(p.offset, p.offset + p.numel);
  }
  std::sort(covered.begin(), covered.end());
  int64_t next = 0;
  for (const auto& [begin, end] : covered) {
    if (begin > next) flat.narrow(0, next, begin - next).zero_();
    next = std::max(next, end);
  }
  if (next < padded_numel_) flat.narrow(0, next, padded_numel_ - next).zero_();
  unsharded_grad_.reset(flat);
  return unsharded_grad_.get();
}

void FSDPParamGroup::prepare_gradients() {
  if (in_place() || !has_trainable_params() || state_ != ShardedState::kUnsharded) return;
  // As at one rank (attach_existing_grad_view): a parameter without a
  // gradient keeps none, so autograd hands its fresh gradient over and
  // collect_unsharded_gradients copies it in, instead of autograd adding
  // into a zeroed buffer.
  const at::Tensor& flat = unsharded_grad_unfilled();
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    at::Tensor& grad = p.param.mutable_grad();
    if (!grad.defined()) continue;
    at::Tensor view = alias_of(flat, p.offset, p.shape);
    if (grad.is_alias_of(view)) continue;  // attached already: the unit runs backward twice
    // A gradient from before this pre-backward (a parameter used after its
    // unit's forward, like a tied output head, or a second call's backward)
    // becomes the buffer's content, and the rest of backward adds into it.
    view.copy_(grad.reshape(p.shape));
    grad = view;
  }
}

void FSDPParamGroup::collect_unsharded_gradients() {
  // Gradients autograd left outside the flat buffer (handed over fresh, or
  // replacing a defined one under create_graph) are copied into it, a
  // parameter that got none has its slice zeroed; then parameters drop them.
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    at::Tensor& grad = p.param.mutable_grad();
    at::Tensor view = alias_of(unsharded_grad(), p.offset, p.shape);
    if (!grad.defined()) {
      view.zero_();  // no gradient arrived here: zeros keep the reduction exact
      continue;
    }
    if (!grad.is_alias_of(view)) view.copy_(grad.reshape(p.shape));
    grad = at::Tensor();
  }
}

void FSDPParamGroup::post_backward() {
  RECORD_USER_SCOPE("FSDP::post_backward");
  if (!has_trainable_params()) {
    reshard();
    return;
  }
  if (in_place()) {
    ensure_grad_flat();
    // Every gradient becomes its view: one autograd handed over or replaced
    // is copied in, one that never came is zeros (replicas may still send
    // gradients for a unit not used on this rank).
    if (state_ == ShardedState::kUnsharded) reshard();
    attach_sharded_grad_views();
    accumulating_ = !requires_gradient_sync || holds_reduction();
    if (!requires_gradient_sync) return;
    reduced_this_backward_ = !holds_reduction();
    comm_->reduce(*this);
    return;
  }
  if (state_ == ShardedState::kUnsharded) collect_unsharded_gradients();
  // Kept gathered for the next micro-step's forward only: a backward that
  // syncs hands sharded gradients to sharded parameters.
  if (reshard_after_backward || requires_gradient_sync) reshard();
  // Nothing arrived on this rank (the unit was not used here): zeros keep
  // the collectives matched with ranks that did use it.
  unsharded_grad();
  at::Tensor grads = unsharded_grad_.release();
  at::Tensor input = reduce_dtype_ == param_dtype_ ? grads : memory::flat_copy(grads, reduce_dtype_);
  grads = at::Tensor();
  if (unsynced_grads_.defined()) input.add_(unsynced_grads_.release());
  accumulating_ = !requires_gradient_sync || holds_reduction();
  if (!requires_gradient_sync) {
    unsynced_grads_.reset(input);
    return;
  }
  // A held reduction (HSDP without all-reduce) is accumulation too: which
  // parameters got gradients is kept for the window, and decided at the sync.
  reduced_this_backward_ = !holds_reduction();
  reduce_input_.reset(input);
  comm_->reduce(*this);
}

void FSDPParamGroup::issue_reduce_scatter() {
  if (in_place()) return;  // nothing to scatter: the shard is the whole unit
  if (shard_group_->size() == 1) {
    reduce_output_.reset(reduce_input_.release());
    return;
  }
  RECORD_USER_SCOPE("FSDP::reduce_scatter");
  CommContext::StreamScope on_stream(*comm_, CommContext::Stream::kReduceScatter);
  reduce_output_.reset(memory::empty_flat(shard_numel_, at::TensorOptions().device(device_).dtype(reduce_dtype_)));
  reduce_event_ = comm_->record(FSDPEvent::Kind::kReduceScatter, *name_);
  dist::CollectiveLabel label(*name_);
  reduce_work_ = dist::reduce_scatter_tensor(*shard_group_, reduce_output_.get(), reduce_input_.get(),
                                             dist::ReduceOp::kAvg);
}

void FSDPParamGroup::wait_reduce_scatter() {
  if (reduce_work_) {
    RECORD_USER_SCOPE("FSDP::reduce_scatter_wait");
    std::optional<dist::Work> work = std::move(reduce_work_);
    reduce_work_.reset();
    work->wait();
    comm_->mark_waited(reduce_event_);
  }
  reduce_input_.reset();  // freed as soon as its collective is done
}

bool FSDPParamGroup::has_trainable_params() const {
  return std::any_of(params_.begin(), params_.end(), [](const FSDPParam& p) { return p.requires_grad(); });
}

bool FSDPParamGroup::reduces_across_replicas() const { return replicate_group_->size() > 1; }

bool FSDPParamGroup::holds_reduction() const { return reduces_across_replicas() && !requires_all_reduce; }

void FSDPParamGroup::leave_in_place_path() {
  if (path_ != GradientPath::kInPlace) return;
  // Gradients become tensors of their own (the buffer goes), so that a
  // divide factor or hook acts on each backward's reduced gradients only,
  // not again on the sum kept in place.
  reshard();
  for (auto& p : params_) {
    at::Tensor& grad = p.param.mutable_grad();
    if (grad.defined() && grad_flat_.defined() && grad.is_alias_of(grad_flat_)) grad = grad.clone();
  }
  grad_flat_ = at::Tensor();
  path_ = GradientPath::kAliasedShard;
}

void FSDPParamGroup::hold_partial_reduction() {
  // In place, this backward's gradients stay in the buffer and the next
  // all-reduce takes them with the rest.
  if (in_place()) return;
  if (partial_reduction_.defined()) {
    partial_reduction_.get().add_(reduce_output_.get());
    reduce_output_.reset();
  } else {
    partial_reduction_.reset(reduce_output_.release());
  }
}

void FSDPParamGroup::issue_replica_all_reduce() {
  RECORD_USER_SCOPE("FSDP::all_reduce");
  CommContext::StreamScope on_stream(*comm_, CommContext::Stream::kAllReduce);
  if (partial_reduction_.defined()) reduce_output_.get().add_(partial_reduction_.release());
  const at::Tensor& buffer = in_place() ? grad_flat_ : reduce_output_.get();
  reduce_event_ = comm_->record(FSDPEvent::Kind::kAllReduce, *name_);
  dist::CollectiveLabel label(*name_);
  reduce_work_ = dist::all_reduce(*replicate_group_, buffer, dist::ReduceOp::kAvg);
}

void FSDPParamGroup::wait_replica_all_reduce() { wait_reduce_scatter(); }

void FSDPParamGroup::finish_reduced(at::Tensor& reduced) {
  if (gradient_divide_factor) {
    // The collectives average; a divide factor asks for the sum over it.
    const double ranks = static_cast<double>(shard_group_->size()) * replicate_group_->size();
    reduced.mul_(ranks / *gradient_divide_factor);
  }
  if (reduced_grad_hook) reduced_grad_hook(reduced);
}

void FSDPParamGroup::assign_gradients() {
  if (in_place()) return;  // the gradients are views of the reduced buffer already (no factor, no hook there)
  // The reduced shard (a flat buffer) becomes the gradients' memory: each
  // parameter without one gets an alias of its slice, so no per-parameter
  // copies are made, and the buffer goes back to the flat-buffer cache when
  // the optimizer sets them to none.
  at::Tensor reduced = reduce_output_.get();
  finish_reduced(reduced);
  if (reduced.scalar_type() != master_dtype_) reduced = memory::flat_copy(reduced, master_dtype_);
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    at::Tensor& grad = p.param.mutable_grad();
    // The first reduction of this backward sees the gradient from before
    // it; a second one (a unit recomputed again) sees the first's.
    record_grad_existence(p);
    if (grad.defined()) {
      grad.add_(reduced.narrow(0, p.local.begin_in_shard, p.local.numel));  // accumulates unless set to none
    } else {
      grad = alias_of(reduced, p.local.begin_in_shard, {p.local.numel});
    }
  }
  reduce_output_.reset();
}

void FSDPParamGroup::append_used(std::vector<uint8_t>& out) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].requires_grad()) out.push_back(used_[i]);
  }
}

size_t FSDPParamGroup::apply_used(const uint8_t* used_anywhere) {
  size_t k = 0;
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    if (used_anywhere[k++] == 0 && !p.grad_existed_before) p.param.mutable_grad() = at::Tensor();
  }
  std::fill(used_.begin(), used_.end(), 0);
  return k;
}

void FSDPParamGroup::begin_iteration() {
  if (!accumulating_) {
    for (auto& p : params_) p.grad_existence_recorded = false;
  }
}

void FSDPParamGroup::end_backward() {
  reduced_this_backward_ = false;
  if (!accumulating_) {
    for (auto& p : params_) p.grad_existence_recorded = false;
  }
}

void FSDPParamGroup::drop_forward() noexcept {
  unsharded_grad_.reset();
  try {
    reshard();  // finishes a prefetched gather, puts the stashed sharded gradients back
  } catch (const std::exception&) {
  }
}

void FSDPParamGroup::abandon() noexcept {
  try {
    finish_all_gather();
  } catch (const std::exception&) {
  }
  if (reduce_work_) {
    try {
      reduce_work_->wait();
    } catch (const std::exception&) {
    }
    reduce_work_.reset();
  }
  reduce_input_.reset();
  reduce_output_.reset();
  partial_reduction_.reset();
  unsharded_grad_.reset();
  try {  // partial full-shape gradients give way to the sharded ones from before

    reshard();
  } catch (const std::exception&) {
  }
  std::fill(used_.begin(), used_.end(), 0);
  end_backward();
}

int64_t FSDPParamGroup::sharded_param_bytes() const { return static_cast<int64_t>(sharded_flat_.nbytes()); }

int64_t FSDPParamGroup::unsharded_bytes_held() const {
  if (aliased() || !unsharded_flat_.defined()) return 0;
  return static_cast<int64_t>(unsharded_flat_.storage().nbytes());
}

}  // namespace fsdp
