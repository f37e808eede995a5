#include "core/gradient_paths.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "fsdp/common/flat_buffer.h"

#include "core/autograd_hooks.h"

namespace fsdp {

// [Note: gradients in place]
// The gradient path (GradientPath) is decided once, at sharding, from the
// shard group's size and the dtypes:
//
//   kInPlace       one rank per shard group (W = 1, no_shard), no cast anywhere
//   kAliasedShard  one rank per shard group, gradients reduced in another dtype
//   kGathered      anything else: a gathered buffer and a reduce-scatter
//
// kAliasedShard and kGathered move gradients the same way (StagedGradients:
// a flat buffer per backward, cast and reduced); they differ in the layout
// (nothing to gather when the gathered form is the shard) and in the
// reduce-scatter, which over one rank hands its input over as its output.
// kInPlace is PersistentGradients. What each step does on each path:
//
//   step              kInPlace                    kAliasedShard               kGathered
//   unshard           nothing (the shard is       nothing (the same)          all-gather into the
//                     the unit)                                               gathered buffer
//   wait_for_unshard  params view the shard in    params view the shard in    params view the gathered
//                     full shape; existing grads  full shape; last step's     buffer; last step's
//                     become full-shape views of  sharded grads set aside     sharded grads set aside
//                     the persistent grad buffer  (stash)                     (stash)
//   prepare_gradients notes which had grads    the stash settled; existing grads become views
//                     (a zero_grad may come       of a flat grad buffer
//                     after the forward)
//   post_backward     grads re-viewed 1-D in the  fresh grads copied into the flat buffer, missing
//                     persistent buffer           ones zeroed; cast to the reduce dtype; kept aside
//                                                 without sync, else handed to the CommContext
//   reduce            replicas: all-reduce the    the buffer is the reduced   reduce-scatter; replicas:
//                     persistent buffer           shard; replicas: all-reduce all-reduce the shard
//   assign            nothing: grads are views   divide factor and hook on the reduced shard, cast to
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

// [Note: where 1/W enters]
// Each rank differentiates the mean loss of its own rows, and the
// reduction averages: the 1/W of the global mean is applied after
// backward, to the summed gradients. One process on the global batch
// applies it before, in the loss's gradient. The two are the same
// function but not the same rounding: a backward that rounds to bf16 or
// fp16 on the way (a frozen bf16 base matrix beside fp32 adapters and
// norms, each computing in its own dtype) rounds g in one case and g / W
// in the other. For W a power of two these are the same numbers (scaling
// by 2^-k is exact in every float format), so W = 1, 2, 4 match one
// process to fp32 rounding; at W = 3 or 5 the roundings differ by up to
// one bf16 ulp of the gradient entering the low-precision product, and
// AdamW, which normalises each element's update, turns that into
// differences of 1e-3 relative in the parameters after five steps (the
// norms' biases, whose gradients start near zero). PyTorch's DDP and
// FSDP2 average after backward too. The averaging here is the data
// parallel average, computed exactly as one process replaying each rank's
// rows and averaging their gradients would (fp32 sum, one division), and
// tests/core/frozen_beside_trainable_test.cpp holds it to that. A program
// that needs one process's numbers at any W puts the 1/W where one
// process does: each rank's loss divided by W, and
// set_gradient_divide_factor(module, 1), under which the collectives sum
// and the sum is divided once by the factor (never averaged and multiplied
// back, which would round twice more at W = 3).

// [Note: zero_grad between forward and backward]
// While a unit is gathered (from its forward to its backward, and for the
// root through both) its parameters view the gathered buffer in full
// shape, and the sharded gradients of earlier backwards wait aside
// (StagedGradients). PyTorch's habit of zeroing after the forward
// (`out = G(z); optimizer.zero_grad(); loss.backward()`, the DCGAN
// example's) must still reach them, as FSDP2's, whose optimizer holds the
// separate sharded tensors, does. So the parameter holds a one-element
// stand-in as its gradient meanwhile, and what the program did to it is
// read before anything else touches the gradient (the unit's
// pre-backward, a pre-hook on the parameter's AccumulateGrad for a use
// outside the unit's forward, post-backward's collect, and reshard):
//
//   the stand-in, untouched        the stash comes back at reshard
//   the stand-in, zeroed in place  the stash is zeroed (zero_grad(false), 1.13's)
//   none                           the stash is dropped (zero_grad(), set to none)
//   another tensor                 the stash is dropped; that gradient is kept
//
// A unit kept gathered after a forward that no backward follows (a
// grad-enabled forward whose outputs need no gradient) is resharded at
// once, so the optimizer never meets a stand-in there; one whose outputs
// are kept alive past the optimizer step, unbackwarded, is gathered at the
// step, and LibTorch's optimizers refuse its parameters' full shapes.
// The stand-in is not a full-shape tensor: that would cost a gathered
// gradient's memory for every unit kept gathered, and AccumulateGrad would
// add into it. It lives on the CPU, so reading it never synchronises a GPU.
void settle_stashed_gradient(FSDPParam& p) {
  if (!p.stash_marker.defined()) return;
  at::Tensor& grad = p.param.mutable_grad();
  // By its memory: Module::zero_grad detaches into a new tensor over it.
  const bool marker_kept = grad.defined() && grad.is_alias_of(p.stash_marker);
  if (!marker_kept) {
    p.sharded_grad_stash = at::Tensor();
  } else {
    if (*p.stash_marker.data_ptr<float>() == 0.0F) p.sharded_grad_stash.zero_();
    grad = at::Tensor();
  }
  p.stash_marker = at::Tensor();
}

const char* to_string(GradientPath path) {
  switch (path) {
    case GradientPath::kInPlace: return "in_place";
    case GradientPath::kAliasedShard: return "aliased_shard";
    case GradientPath::kGathered: return "gathered";
  }
  return "?";
}

namespace {

// Notes, once per window of accumulation, whether the parameter had a
// gradient before the group touched it (FSDPParam::grad_existed_before).
void record_grad_existence(FSDPParam& p) {
  if (p.grad_existence_recorded) return;
  p.grad_existed_before = p.param.grad().defined();
  p.grad_existence_recorded = true;
}

// The parameter's gradient becomes `view`, keeping its value.
void rebind_grad(FSDPParam& p, const at::Tensor& view) {
  at::Tensor& grad = p.param.mutable_grad();
  if (!grad.defined()) {
    view.zero_();  // none yet, or set to none by the user: start from zero
  } else if (!grad.is_alias_of(view)) {
    view.copy_(grad.reshape(view.sizes()));  // replaced by the user or by autograd
  }
  grad = view;
}

// rebind_grad, once existence is recorded.
void attach_grad_view(FSDPParam& p, const at::Tensor& view) {
  record_grad_existence(p);
  rebind_grad(p, view);
}

// rebind_grad for a parameter that has a gradient. Without one yet,
// the parameter keeps none through backward: autograd then hands over its
// fresh gradient (no copy), and post-backward copies it into the view.
// Zeroing the view here would make autograd add into zeros instead, two
// passes more for the same result. A gradient that exists (the micro-steps
// of accumulation) is attached, and autograd adds into the buffer in place.
// Existence is recorded later, at the backward: a zero_grad may come
// between a forward and its backward.
void attach_existing_grad_view(FSDPParam& p, const at::Tensor& view) {
  if (p.param.grad().defined()) rebind_grad(p, view);
}

// The parameter's part of `flat` (laid out as `shard`), as an alias.
at::Tensor sharded_alias(const FlatShard& shard, const at::Tensor& flat, const FSDPParam& p) {
  const at::Tensor view = shard.shard_view(flat, p);
  return at::empty({0}, flat.options()).set_(flat.storage(), view.storage_offset(), view.sizes(), view.strides());
}

// kInPlace: every gradient is a view of one persistent flat buffer.
class PersistentGradients final : public GradientFlow {
 public:
  explicit PersistentGradients(FlatShard& shard) : shard_(shard) {}
  GradientPath path() const override { return GradientPath::kInPlace; }

  void on_unsharded(FSDPParam& p) override {
    ensure_buffer();
    if (p.requires_grad()) attach_existing_grad_view(p, flat_alias(buffer_, p.offset, p.shape));
  }
  void on_resharded(FSDPParam& p) override {
    // After forward a parameter without a gradient keeps none (backward
    // hands one over); stage() attaches every view.
    if (p.requires_grad()) attach_existing_grad_view(p, sharded_alias(shard_, buffer_, p));
  }
  void prepare(bool in_backward) override {
    // Attached at unshard; what the program left them as since (a zero_grad
    // after the forward) is what they were before this backward.
    if (!in_backward) return;
    for (auto& p : shard_.params()) {
      if (p.requires_grad()) record_grad_existence(p);
    }
  }

  void collect(bool /*unsharded*/) override { ensure_buffer(); }
  bool may_stay_gathered() const override { return false; }
  void stage(bool /*sync*/) override {
    // Every gradient becomes its view: one autograd handed over or replaced
    // is copied in, one that never came is zeros (replicas may still send
    // gradients for a unit not used on this rank).
    for (auto& p : shard_.params()) {
      if (p.requires_grad()) attach_grad_view(p, sharded_alias(shard_, buffer_, p));
    }
  }

  // Nothing to scatter: the shard is the whole unit. A held reduction stays
  // in the buffer, and the next all-reduce takes it with the rest.
  void issue_reduce_scatter(const UnitComm& /*on*/) override {}
  void wait_reduce_scatter(EventLog& /*log*/) override {}
  void hold_partial_reduction() override {}
  void issue_all_reduce(const UnitComm& on) override { all_reduce_ = all_reduce(on, buffer_); }
  void wait_all_reduce(EventLog& log) override { all_reduce_.wait(log, "FSDP::all_reduce_wait"); }
  // The gradients are views of the reduced buffer already (no factor, no hook here).
  void assign(const ReductionSettings& /*settings*/, DeviceStreams& /*streams*/) override {}

  void append_trainable(std::vector<at::Tensor>& out) const override {
    for (const auto& p : shard_.params()) {
      if (p.requires_grad()) out.push_back(p.param);
    }
  }
  void drop_backward() noexcept override {}
  void abandon() noexcept override { all_reduce_.abandon(); }

  // Gradients that are views of the buffer get memory of their own.
  void release_buffer() {
    for (auto& p : shard_.params()) {
      at::Tensor& grad = p.param.mutable_grad();
      if (grad.defined() && buffer_.defined() && grad.is_alias_of(buffer_)) grad = grad.clone();
    }
    buffer_ = at::Tensor();
  }

 private:
  void ensure_buffer() {
    // Allocated on first use, not at sharding: a model that only runs
    // inference, or is still being initialised, holds no gradient memory.
    if (!buffer_.defined()) buffer_ = at::zeros({shard_.padded_numel()}, shard_.options(shard_.master_dtype()));
  }

  FlatShard& shard_;
  at::Tensor buffer_;  // [padded numel] every gradient's memory, for good
  PendingCollective all_reduce_;
};

// kAliasedShard and kGathered: a flat gradient buffer per backward, cast to
// the reduce dtype, reduce-scattered, and the reduced shard handed over.
class StagedGradients final : public GradientFlow {
 public:
  explicit StagedGradients(FlatShard& shard) : shard_(shard) {}
  GradientPath path() const override {
    return shard_.gathered_is_shard() ? GradientPath::kAliasedShard : GradientPath::kGathered;
  }

  void on_unsharded(FSDPParam& p) override {
    // Last step's sharded gradient waits aside; backward works on a
    // full-shape one ([Note: zero_grad between forward and backward]).
    if (!p.param.grad().defined()) return;
    p.sharded_grad_stash = p.param.grad();
    p.stash_marker = at::ones({1}, at::TensorOptions().dtype(at::kFloat));
    p.param.mutable_grad() = p.stash_marker;
  }
  void on_resharded(FSDPParam& p) override {
    // A full-shape gradient still here was never collected (an abandoned
    // backward): the sharded one from before this step takes its place.
    settle_stashed_gradient(p);
    p.param.mutable_grad() = p.sharded_grad_stash;
    p.sharded_grad_stash = at::Tensor();
  }

  void prepare(bool in_backward) override {
    // As at one rank (attach_existing_grad_view): a parameter without a
    // gradient keeps none, so autograd hands its fresh gradient over and
    // collect() copies it in, instead of autograd adding into a zeroed
    // buffer. A stand-in is settled when the backward starts, not after the
    // forward: a zero_grad may come between.
    const at::Tensor& flat = unfilled_buffer();
    for (auto& p : shard_.params()) {
      if (!p.requires_grad()) continue;
      if (in_backward) settle_stashed_gradient(p);
      if (p.stash_marker.defined()) continue;
      at::Tensor& grad = p.param.mutable_grad();
      if (!grad.defined()) continue;
      at::Tensor view = flat_alias(flat, p.offset, p.shape);
      if (grad.is_alias_of(view)) continue;  // attached already: the unit runs backward twice
      // A gradient from before this pre-backward (a parameter used after its
      // unit's forward, like a tied output head, or a second call's backward)
      // becomes the buffer's content, and the rest of backward adds into it.
      view.copy_(grad.reshape(p.shape));
      grad = view;
    }
  }

  void collect(bool unsharded) override {
    if (!unsharded) return;
    // Gradients autograd left outside the flat buffer (handed over fresh, or
    // replacing a defined one under create_graph) are copied into it, a
    // parameter that got none has its slice zeroed; then parameters drop them.
    for (auto& p : shard_.params()) {
      if (!p.requires_grad()) continue;
      // A unit whose pre-backward never ran (a call of several modules'
      // round left incomplete) still settles its stand-ins here.
      settle_stashed_gradient(p);
      at::Tensor& grad = p.param.mutable_grad();
      at::Tensor view = flat_alias(zeroed_buffer(), p.offset, p.shape);
      if (!grad.defined()) {
        view.zero_();  // no gradient arrived here: zeros keep the reduction exact
        continue;
      }
      if (!grad.is_alias_of(view)) view.copy_(grad.reshape(p.shape));
      grad = at::Tensor();
    }
  }
  bool may_stay_gathered() const override { return true; }
  void stage(bool sync) override {
    // Nothing arrived on this rank (the unit was not used here): zeros keep
    // the collectives matched with ranks that did use it.
    zeroed_buffer();
    at::Tensor grads = unsharded_grad_.release();
    const at::ScalarType reduce_dtype = shard_.reduce_dtype();
    at::Tensor input = grads.scalar_type() == reduce_dtype ? grads : memory::flat_copy(grads, reduce_dtype);
    grads = at::Tensor();
    if (unsynced_grads_.defined()) input.add_(unsynced_grads_.release());
    if (!sync) {
      unsynced_grads_.reset(input);
      return;
    }
    staged_.reset(input);
  }

  void issue_reduce_scatter(const UnitComm& on) override {
    const at::Tensor input = shard_.reduce_input(staged_.get());
    if (!input.is_same(staged_.get())) staged_.reset(input);
    reduce_scatter_ = reduce_scatter(on, std::move(staged_));
  }
  void wait_reduce_scatter(EventLog& log) override {
    reduce_scatter_.wait(log, "FSDP::reduce_scatter_wait");
    if (reduce_scatter_.output.defined()) reduced_ = std::move(reduce_scatter_.output);
  }
  void hold_partial_reduction() override {
    if (partial_.defined()) {
      partial_.get().add_(reduced_.get());
      reduced_.reset();
    } else {
      partial_ = std::move(reduced_);
    }
  }
  void issue_all_reduce(const UnitComm& on) override {
    if (partial_.defined()) reduced_.get().add_(partial_.release());
    all_reduce_ = all_reduce(on, reduced_.get());
  }
  void wait_all_reduce(EventLog& log) override { all_reduce_.wait(log, "FSDP::all_reduce_wait"); }

  void assign(const ReductionSettings& settings, DeviceStreams& streams) override {
    // The reduced shard (a flat buffer) becomes the gradients' memory: each
    // parameter without one gets an alias of its slice, so no per-parameter
    // copies are made, and the buffer goes back to the flat-buffer cache when
    // the optimizer sets them to none.
    at::Tensor reduced = reduced_.get();
    // The collectives averaged, or, under a divide factor, summed: the sum
    // is divided once ([Note: where 1/W enters]).
    if (settings.gradient_divide_factor) reduced.div_(*settings.gradient_divide_factor);
    if (settings.reduced_grad_hook) settings.reduced_grad_hook(reduced);
    if (shard_.offloaded()) {
      reduced = shard_.to_host(reduced, shard_.master_dtype(), streams);  // [Note: CPU offload]
      // Added into gradients on the host now (accumulating): the copy must
      // have landed. Otherwise the end of backward waits for it.
      const bool adds = std::any_of(shard_.params().begin(), shard_.params().end(),
                                    [](const FSDPParam& p) { return p.requires_grad() && p.param.grad().defined(); });
      if (adds) streams.synchronize(DeviceStreams::Stream::kDeviceToHost);
    } else if (reduced.scalar_type() != shard_.master_dtype()) {
      reduced = memory::flat_copy(reduced, shard_.master_dtype());
    }
    for (auto& p : shard_.params()) {
      if (!p.requires_grad()) continue;
      at::Tensor& grad = p.param.mutable_grad();
      // The first reduction of this backward sees the gradient from before
      // it; a second one (a unit recomputed again) sees the first's.
      record_grad_existence(p);
      if (grad.defined()) {
        grad.add_(shard_.shard_view(reduced, p));  // accumulates unless set to none
      } else {
        grad = sharded_alias(shard_, reduced, p);
      }
    }
    reduced_.reset();
  }

  void append_trainable(std::vector<at::Tensor>& out) const override {
    for (const auto& p : shard_.params()) {
      if (p.requires_grad()) out.push_back(p.param);
    }
  }
  void drop_backward() noexcept override { unsharded_grad_.reset(); }
  void abandon() noexcept override {
    reduce_scatter_.abandon();
    all_reduce_.abandon();
    staged_.reset();
    reduced_.reset();
    partial_.reset();
    unsharded_grad_.reset();
  }

 private:
  // The flat unsharded gradient buffer, allocated (zeroed) on first use.
  const at::Tensor& zeroed_buffer() {
    if (!unsharded_grad_.defined()) {
      unsharded_grad_.reset(memory::empty_flat(shard_.padded_numel(), shard_.options(shard_.param_dtype())).zero_());
    }
    return unsharded_grad_.get();
  }
  // The same, allocated with only what no trainable parameter covers
  // (frozen parameters, alignment, padding) zeroed: collect() writes or
  // zeroes each trainable parameter's slice.
  const at::Tensor& unfilled_buffer() {
    if (unsharded_grad_.defined()) return unsharded_grad_.get();
    const int64_t padded = shard_.padded_numel();
    at::Tensor flat = memory::empty_flat(padded, shard_.options(shard_.param_dtype()));
    std::vector<std::pair<int64_t, int64_t>> covered;
    for (const auto& p : shard_.params()) {
      if (p.requires_grad() && p.numel > 0) covered.emplace_back(p.offset, p.offset + p.numel);
    }
    std::sort(covered.begin(), covered.end());
    int64_t next = 0;
    for (const auto& [begin, end] : covered) {
      if (begin > next) flat.narrow(0, next, begin - next).zero_();
      next = std::max(next, end);
    }
    if (next < padded) flat.narrow(0, next, padded - next).zero_();
    unsharded_grad_.reset(flat);
    return unsharded_grad_.get();
  }

  FlatShard& shard_;
  CountedTensor unsharded_grad_{memory::BufferKind::kGradient};  // [padded] param dtype: what autograd adds into
  CountedTensor unsynced_grads_{memory::BufferKind::kGradient};  // [padded] reduce dtype: micro-steps without sync
  CountedTensor staged_{memory::BufferKind::kComm};    // [padded] reduce dtype, until its reduce-scatter is issued
  CountedTensor reduced_{memory::BufferKind::kComm};   // [shard] the reduced shard, until assigned
  CountedTensor partial_{memory::BufferKind::kGradient};  // [shard] held without all-reduce
  PendingCollective reduce_scatter_;
  PendingCollective all_reduce_;
};

}  // namespace

Reduction::Reduction(const FSDPParamGroup* unit, std::vector<GradientFlow*> flows, UnitComm within_shard,
                     UnitComm across_replicas, Then then, const ReductionSettings& settings)
    : unit_(unit),
      flows_(std::move(flows)),
      within_shard_(within_shard),
      across_replicas_(across_replicas),
      then_(then),
      settings_(&settings) {}

void Reduction::issue_reduce_scatter() {
  for (GradientFlow* f : flows_) f->issue_reduce_scatter(within_shard_);
}

void Reduction::wait_reduce_scatter() {
  for (GradientFlow* f : flows_) f->wait_reduce_scatter(within_shard_.log);
}

bool Reduction::hand_on() {
  switch (then_) {
    case Then::kAssign:
      for (GradientFlow* f : flows_) f->assign(*settings_, within_shard_.streams);
      tell_ready(within_shard_.streams);
      return false;
    case Then::kHold:
      for (GradientFlow* f : flows_) f->hold_partial_reduction();
      return false;
    case Then::kAllReduce:
      for (GradientFlow* f : flows_) f->issue_all_reduce(across_replicas_);
      return true;
  }
  return false;
}

void Reduction::finish_all_reduce() {
  for (GradientFlow* f : flows_) f->wait_all_reduce(across_replicas_.log);
  for (GradientFlow* f : flows_) f->assign(*settings_, across_replicas_.streams);
  tell_ready(across_replicas_.streams);
}

void Reduction::tell_ready(DeviceStreams& streams) const {
  if (!settings_->gradients_ready_hook) return;
  GradientsReady ready;
  for (const GradientFlow* f : flows_) f->append_trainable(ready.params);
  ready.wait_until_readable = streams.host_waiter(DeviceStreams::Stream::kDeviceToHost);
  settings_->gradients_ready_hook(ready);
}

std::unique_ptr<GradientFlow> make_gradient_flow(FlatShard& shard) {
  if (shard.gathered_is_shard() && shard.reduce_dtype() == shard.param_dtype()) {
    return std::make_unique<PersistentGradients>(shard);
  }
  return std::make_unique<StagedGradients>(shard);
}

std::unique_ptr<GradientFlow> leave_in_place(std::unique_ptr<GradientFlow> flow, FlatShard& shard) {
  auto* persistent = dynamic_cast<PersistentGradients*>(flow.get());
  if (persistent == nullptr) return flow;
  // Gradients become tensors of their own (the buffer goes), so that a
  // divide factor or hook acts on each backward's reduced gradients only,
  // not again on the sum kept in place.
  persistent->release_buffer();
  return std::make_unique<StagedGradients>(shard);
}

}  // namespace fsdp
