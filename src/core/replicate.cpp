#include "fsdp/core/replicate.h"

#include <algorithm>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "fsdp/common/compat.h"
#include "fsdp/common/error.h"
#include "fsdp/core/fully_shard.h"
#include "fsdp/distributed/collectives.h"

#include "core/autograd_hooks.h"
#include "core/full_precision.h"
#include "core/units.h"

namespace fsdp {

// [Note: replicate's buckets]
// As DDP: the trainable parameters, in reverse registration order (the
// order backward usually meets them), fill buckets of at most
// bucket_cap_mb bytes, one dtype and device each. A post-hook on each
// parameter's AccumulateGrad node marks it ready; when every parameter of
// the next bucket in order is ready, its gradients are copied into one flat
// buffer and all-reduced (averaged) asynchronously, while backward goes on.
// Buckets start strictly in order, so every rank issues the same
// collectives in the same order whatever order its gradients arrive in.
//
// The end of backward is a callback queued on the autograd engine by the
// first gradient that reaches an output of the module's call (fsdp::call
// hooks them), so it is the outer backward's end even when activation
// checkpointing runs backwards inside it. There the buckets not started
// (a parameter without a gradient on this rank) start with zeros in its
// place, and every all-reduce is waited for. A parameter recomputed in
// several checkpointed regions gets a gradient from each region's inner
// backward, possibly after its bucket started: the ranks agree (one small
// all-reduce of a flag per bucket) on which buckets saw that, and those
// are averaged again from the gradients as they stand. Then the averages
// are written back.
// Each buffer ends with one flag per parameter (1 where this rank had a
// gradient), averaged with the rest: a parameter no rank had a gradient for
// keeps none, as in one process. A backward that throws never runs the
// callback; the guard the callback holds, destroyed with the engine's
// graph task, finishes what was started and drops the backward's buckets.

// [Note: replicate's mixed precision]
// As DDP's mixed_precision: for a forward every floating parameter's data
// becomes a copy in the param dtype (set_data, as FSDP's gathered views;
// the fp32 tensor stays aside as the master), and so it does again for the
// backward, from the first gradient that reaches the call's outputs to
// the end of backward. In between, and after, the parameters are their
// masters: an evaluation between a forward and its backward, a forward
// whose graph is dropped, a use of a parameter after the call, and the
// optimizer all see fp32. Masters are read again at each cast, so weights
// the program replaced (torch::load) are the ones cast. Gradients arrive in
// the param dtype and are copied into buckets of the reduce dtype,
// averaged there, and handed over in the master's dtype. set_data to
// another dtype makes autograd replace the parameter's AccumulateGrad, so
// the ready hooks follow the nodes (a parameter used in the call and after
// it reaches two nodes; its bucket is averaged again at the end). A
// gradient already there (micro-steps without sync, or one the program
// set) stays in the master's dtype, and AccumulateGrad adds the
// low-precision one into it in place: accumulation is in fp32, where DDP
// casts the kept gradient down to the param dtype.

namespace detail {

// A replicated module's call hooks (detail::CallHooks) and its buckets.
class Replicator : public CallHooks, public std::enable_shared_from_this<Replicator> {
 public:
  Replicator(torch::nn::Module& module, const ReplicateOptions& options);
  void pre_forward(const torch::nn::Module& module) override;
  at::Tensor cast_input(const at::Tensor& input) const override;
  void wrap_inputs(const std::vector<at::Tensor*>& /*inputs*/) override {}  // backward's start is the outputs'
  void post_forward(const torch::nn::Module& module, std::vector<at::Tensor>& outputs) override;
  // A forward that threw: the parameters get their own dtype back.
  void on_forward_error() noexcept override { use_masters(); }
  bool set_gradient_sync(bool sync) override {
    requires_gradient_sync = sync;
    return true;
  }
  void on_grad_ready(size_t index);
  // Hooks every parameter's AccumulateGrad node; once the replica is
  // owned, so the hooks reach it through a weak pointer.
  void hook_accumulators() {
    for (size_t i = 0; i < params_.size(); ++i) hook_accumulator(i);
  }
  void end_backward();
  void abandon() noexcept;
  void use_masters(bool convert_grads = true) noexcept;

  bool requires_gradient_sync = true;
  ReplicateStats stats;

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    int64_t numel = 0;
    size_t ready = 0;
    at::Tensor flat;  // gradients, then one flag per parameter; while reduced
    std::optional<dist::Work> work;
    bool stale = false;  // a parameter got another gradient after the all-reduce started
  };
  void begin_backward();
  void use_low_precision();
  void hook_accumulator(size_t index);
  at::ScalarType bucket_dtype(const at::Tensor& param) const;
  void start_ready_buckets();
  void start(Bucket& bucket);
  void write_back(Bucket& bucket);
  void reset_backward();

  std::string name_;
  std::shared_ptr<dist::World> world_;
  std::vector<at::Tensor> buffers_;  // broadcast from rank 0 before each forward; empty when not
  std::vector<at::Tensor> params_;
  std::unordered_set<const void*> bucketed_;  // params_' TensorImpls
  std::vector<std::string> names_;
  std::vector<compat::AutogradNodePtr> accumulators_;
  // Mixed precision: the floating parameters cast for the forward, their
  // masters and low-precision copies, and whether they point at the copies.
  MixedPrecisionPolicy mixed_precision_;
  std::unordered_set<const void*> full_precision_;  // kept in their own dtype, by TensorImpl
  std::vector<at::Tensor> cast_params_;
  std::vector<at::Tensor> masters_;
  std::vector<at::Tensor> low_;
  bool low_precision_ = false;
  std::vector<size_t> bucket_of_;
  std::vector<uint8_t> ready_;
  std::vector<Bucket> buckets_;
  size_t next_bucket_ = 0;
  bool in_backward_ = false;
  int64_t backward_count_ = 0;
};

namespace {

struct ReplicatorHolder : CallHooksHolder {
  explicit ReplicatorHolder(std::shared_ptr<Replicator> r) : replicator(std::move(r)) {}
  CallHooks* hooks() const override { return replicator.get(); }
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& /*device*/) const override {
    throw Error("clone: a module with replicate applied cannot be cloned; clone the model before replicating it");
  }
  // Every rank holds the whole module: torch::save and torch::load see it
  // as it was before replicate.
  bool is_serializable() const override { return false; }
  std::shared_ptr<Replicator> replicator;
};

}  // namespace

Replicator::Replicator(torch::nn::Module& module, const ReplicateOptions& options)
    : name_(module.name()), world_(options.world), mixed_precision_(options.mixed_precision) {
  FSDP_CHECK(world_ != nullptr, "replicate: ReplicateOptions::world is required");
  FSDP_CHECK(!mixed_precision_.output_dtype, "replicate: mixed_precision.output_dtype is fully_shard's; replicate "
             "returns the forward's output as computed (in param_dtype): cast it where you use it");
  for (const auto dtype : {mixed_precision_.param_dtype, mixed_precision_.reduce_dtype}) {
    FSDP_CHECK(!dtype || at::isFloatingType(*dtype), "replicate: mixed_precision dtypes must be floating, got ",
               *dtype);
  }
  FSDP_CHECK(options.bucket_cap_mb > 0, "replicate: bucket_cap_mb must be positive, got ", options.bucket_cap_mb);
  dist::ProcessGroup& group = world_->group();
  if (options.sync_module_states && world_->size() > 1) {
    at::NoGradGuard no_grad;
    for (const auto& p : module.parameters()) dist::broadcast(group, p.detach(), 0).wait();
    for (const auto& b : module.buffers()) {
      if (b.defined()) dist::broadcast(group, b.detach(), 0).wait();
    }
  }
  if (options.broadcast_buffers && world_->size() > 1) {
    for (const auto& b : module.buffers()) {
      if (b.defined()) buffers_.push_back(b);
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> trainable;
  for (const auto& [name, p] : unique_named_parameters(module)) {
    if (p.requires_grad()) trainable.emplace_back(name, p);
  }
  for (const auto& [name, p] : trainable) {
    // One device: the hooks of one module's gradients then run on one thread.
    FSDP_CHECK(p.device() == trainable.front().second.device(), "replicate: parameter '", name, "' of ", name_,
               " is on ", p.device(), " but '", trainable.front().first, "' is on ",
               trainable.front().second.device(), ": move the module to one device first");
  }
  full_precision_ = full_precision_parameters(module, mixed_precision_);
  std::reverse(trainable.begin(), trainable.end());
  const auto cap = static_cast<int64_t>(options.bucket_cap_mb * 1024 * 1024);
  for (const auto& [name, p] : trainable) {
    const bool fits = !buckets_.empty() &&
                      params_[buckets_.back().params.front()].scalar_type() == p.scalar_type() &&
                      bucket_dtype(params_[buckets_.back().params.front()]) == bucket_dtype(p) &&
                      params_[buckets_.back().params.front()].device() == p.device() &&
                      (buckets_.back().numel + p.numel()) * static_cast<int64_t>(p.element_size()) <= cap;
    if (!fits) buckets_.emplace_back();
    const size_t index = params_.size();
    buckets_.back().params.push_back(index);
    buckets_.back().numel += p.numel();
    bucket_of_.push_back(buckets_.size() - 1);
    params_.push_back(p);
    bucketed_.insert(p.unsafeGetTensorImpl());
    names_.push_back(name);
    accumulators_.emplace_back();
  }
  ready_.assign(params_.size(), 0);
  if (mixed_precision_.param_dtype) {
    for (const auto& [name, p] : unique_named_parameters(module)) {
      if (!at::isFloatingType(p.scalar_type()) || p.scalar_type() == *mixed_precision_.param_dtype ||
          full_precision_.count(p.unsafeGetTensorImpl()) != 0) {
        continue;
      }
      cast_params_.push_back(p);
      masters_.push_back(p.data());
      low_.emplace_back();
    }
  }
  stats.buckets = static_cast<int64_t>(buckets_.size());
}

void Replicator::hook_accumulator(size_t index) {
  if (!params_[index].requires_grad()) return;  // frozen after replicate(): no node, no gradient
  std::weak_ptr<Replicator> self = weak_from_this();
  hook_grad_accumulator(params_[index], accumulators_[index], {}, [self, index] {
    if (auto replicator = self.lock()) replicator->on_grad_ready(index);
  });
}

at::ScalarType Replicator::bucket_dtype(const at::Tensor& param) const {
  if (!at::isFloatingType(param.scalar_type()) || full_precision_.count(param.unsafeGetTensorImpl()) != 0) {
    return param.scalar_type();
  }
  if (mixed_precision_.reduce_dtype) return *mixed_precision_.reduce_dtype;
  return mixed_precision_.param_dtype.value_or(param.scalar_type());
}

void Replicator::use_low_precision() {
  if (cast_params_.empty() || low_precision_) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < cast_params_.size(); ++i) {
    masters_[i] = cast_params_[i].data();  // what the parameter holds now: the master
    if (!low_[i].defined() || low_[i].sizes() != masters_[i].sizes() || low_[i].device() != masters_[i].device()) {
      low_[i] = at::empty_like(masters_[i], masters_[i].options().dtype(*mixed_precision_.param_dtype));
    }
    low_[i].copy_(masters_[i]);
    cast_params_[i].set_data(low_[i]);
  }
  low_precision_ = true;
  hook_accumulators();
}

void Replicator::use_masters(bool convert_grads) noexcept {
  if (!low_precision_) return;
  for (size_t i = 0; i < cast_params_.size(); ++i) {
    cast_params_[i].set_data(masters_[i]);
    if (!convert_grads) continue;
    at::Tensor& grad = cast_params_[i].mutable_grad();
    // A gradient of this backward not written back (no sync): the master's dtype.
    if (grad.defined() && grad.scalar_type() != masters_[i].scalar_type()) grad = grad.to(masters_[i].scalar_type());
  }
  low_precision_ = false;
}

at::Tensor Replicator::cast_input(const at::Tensor& input) const {
  return cast_forward_input(input, mixed_precision_);
}

void Replicator::post_forward(const torch::nn::Module& module, std::vector<at::Tensor>& outputs) {
  const bool backward_follows =
      at::GradMode::is_enabled() &&
      std::any_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
  // Until the backward casts them again, the parameters are their masters.
  use_masters();
  if (!backward_follows) return;
  // A parameter that became trainable after replicate() is in no bucket:
  // its gradients would differ across the ranks, and so would the models.
  // Names are looked up only for the error.
  for (const auto& p : module.parameters()) {
    if (!p.requires_grad() || bucketed_.count(p.unsafeGetTensorImpl()) > 0) continue;
    for (const auto& [name, q] : unique_named_parameters(module)) {
      FSDP_CHECK(!q.is_same(p), "replicate: parameter '", name, "' of ", name_,
                 " requires a gradient but did not when replicate() was called, so its gradients would not be "
                 "averaged over the ranks; set requires_grad before replicate()");
    }
  }
  // The masters' nodes, hooked for a parameter used after this call.
  if (!cast_params_.empty()) {
    hook_accumulators();
  }
  auto self = shared_from_this();
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    at::Tensor t = out;
    t.register_hook([self](const at::Tensor& grad) {
      self->begin_backward();
      return grad;
    });
  }
}

void Replicator::begin_backward() {
  if (in_backward_) return;
  in_backward_ = true;
  use_low_precision();  // the backward computes in the param dtype, as the forward did
  if (requires_gradient_sync) stats.reduced_during_backward = 0;
  // A backward that throws never runs the callback: the replica abandons it.
  auto self = shared_from_this();
  queue_end_of_backward([self] { self->end_backward(); }, [self] { self->abandon(); });
}

void Replicator::on_grad_ready(size_t index) {
  if (!requires_gradient_sync) return;
  FSDP_CHECK(in_backward_, "replicate: parameter '", names_[index], "' of ", name_,
             " got a gradient in a backward that did not start at the outputs of a call of ", name_,
             ": call the replicated module as fsdp::call(model, x), or as model(x) with an FSDP_MODULE holder; "
             "model->forward(x) skips the hooks that average its gradients over the ranks");
  Bucket& bucket = buckets_[bucket_of_[index]];
  if (ready_[index] != 0) {
    // Another gradient in this backward, from a backward run inside it
    // (a checkpointed region recomputed): averaged again at the end.
    if (bucket.work) bucket.stale = true;
    return;
  }
  ready_[index] = 1;
  ++bucket.ready;
  start_ready_buckets();
}

void Replicator::start_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].ready == buckets_[next_bucket_].params.size()) {
    start(buckets_[next_bucket_++]);
    ++stats.reduced_during_backward;
  }
}

void Replicator::start(Bucket& bucket) {
  RECORD_USER_SCOPE("replicate::all_reduce");
  const at::Tensor& first = params_[bucket.params.front()];
  const auto n = static_cast<int64_t>(bucket.params.size());
  bucket.flat = at::empty({bucket.numel + n}, first.options().dtype(bucket_dtype(first)).requires_grad(false));
  std::vector<float> flags(static_cast<size_t>(n), 0.0f);
  int64_t offset = 0;
  for (int64_t k = 0; k < n; ++k) {
    const at::Tensor& p = params_[bucket.params[static_cast<size_t>(k)]];
    at::Tensor slice = bucket.flat.narrow(0, offset, p.numel());
    if (p.grad().defined()) {
      slice.copy_(p.grad().reshape({-1}));
      flags[static_cast<size_t>(k)] = 1.0f;
    } else {
      slice.zero_();
    }
    offset += p.numel();
  }
  bucket.flat.narrow(0, bucket.numel, n).copy_(at::from_blob(flags.data(), {n}, at::kFloat));
  bucket.work = dist::all_reduce(world_->group(), bucket.flat, dist::ReduceOp::kAvg);
}

void Replicator::write_back(Bucket& bucket) {
  bucket.work->wait();
  const auto n = static_cast<int64_t>(bucket.params.size());
  const at::Tensor used = bucket.flat.narrow(0, bucket.numel, n).to(at::kFloat).cpu().contiguous();
  const auto* used_anywhere = used.data_ptr<float>();
  int64_t begin = 0;
  for (int64_t k = 0; k < n; ++k) {
    at::Tensor& p = params_[bucket.params[static_cast<size_t>(k)]];
    const int64_t at = begin;
    begin += p.numel();
    if (used_anywhere[k] == 0.0f) continue;  // no rank had a gradient: none stays none
    // The gradient becomes the buffer's memory instead of a copy of it: a
    // tensor over its storage that autograd does not treat as a view
    // (optimizers' zero_grad calls detach_(), which views refuse); under
    // mixed precision, a copy in the master's dtype when the bucket's differs.
    at::Tensor grad = flat_alias(bucket.flat, at, p.sizes());
    p.mutable_grad() = grad.scalar_type() == p.scalar_type() ? grad : grad.to(p.scalar_type());
  }
}

void Replicator::end_backward() {
  RECORD_USER_SCOPE("replicate::end_of_backward");
  if (!requires_gradient_sync) use_masters();
  if (requires_gradient_sync) {
    // Buckets with a parameter this rank had no gradient for start now, in order.
    while (next_bucket_ < buckets_.size()) start(buckets_[next_bucket_++]);
    for (Bucket& bucket : buckets_) bucket.work->wait();
    // Buckets any rank saw a gradient arrive in after their all-reduce
    // started are averaged again, from the gradients as they stand now.
    std::vector<float> stale(buckets_.size());
    for (size_t b = 0; b < buckets_.size(); ++b) stale[b] = buckets_[b].stale ? 1.0f : 0.0f;
    // On the group's device: NCCL reduces device tensors only.
    at::Tensor agreed = at::tensor(stale).to(world_->device());
    dist::all_reduce(world_->group(), agreed, dist::ReduceOp::kMax).wait();
    agreed = agreed.cpu();
    stats.reduced_again = 0;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (agreed[static_cast<int64_t>(b)].item<float>() == 0.0f) continue;
      start(buckets_[b]);
      ++stats.reduced_again;
    }
    use_masters(/*convert_grads=*/false);  // write_back hands over the averages in the masters' dtype
    for (Bucket& bucket : buckets_) write_back(bucket);
    ++stats.synchronised_backwards;
  }
  reset_backward();
}

void Replicator::reset_backward() {
  for (Bucket& bucket : buckets_) {
    bucket.ready = 0;
    bucket.flat = at::Tensor();
    bucket.work.reset();
    bucket.stale = false;
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  next_bucket_ = 0;
  in_backward_ = false;
  ++backward_count_;
}

void Replicator::abandon() noexcept {
  use_masters();
  for (Bucket& bucket : buckets_) {
    if (!bucket.work) continue;
    try {
      bucket.work->wait();
    } catch (const std::exception&) {
    }
  }
  reset_backward();
  stats.reduced_during_backward = 0;
}

Replicator* replicator_of(const torch::nn::Module& module) { return dynamic_cast<Replicator*>(hooks_of(module)); }

// [Note: buffers under replicate]
// Running statistics follow each rank's own batch, so ranks' buffers drift
// apart. As DDP's broadcast_buffers does, every forward starts from rank
// 0's: what rank 0 holds after a step is its own batch's update of rank 0's
// buffers, whatever the world size, and that is what a checkpoint saves.
void Replicator::pre_forward(const torch::nn::Module& /*module*/) {
  use_low_precision();
  if (buffers_.empty()) return;
  at::NoGradGuard no_grad;
  for (const auto& b : buffers_) {
    at::Tensor data = b.detach();
    if (data.is_contiguous()) {
      dist::broadcast(world_->group(), data, 0).wait();
    } else {
      at::Tensor copy = data.contiguous();
      dist::broadcast(world_->group(), copy, 0).wait();
      data.copy_(copy);
    }
  }
}

}  // namespace detail

void replicate(torch::nn::Module& module, const ReplicateOptions& options) {
  FSDP_CHECK(!is_replicated(module), "replicate: module ", module.name(), " is replicated already");
  FSDP_CHECK(!is_fully_sharded(module), "replicate: module ", module.name(),
             " is sharded by fully_shard; use one of the two (fully_shard with ShardingStrategy::kNoShard is "
             "replication with FSDP's units)");
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    FSDP_CHECK(!is_fully_sharded(*item.value()), "replicate: submodule ", item.key(), " of ", module.name(),
               " is sharded by fully_shard; a replicated module holds no sharded units");
  }
  auto replicator = std::make_shared<detail::Replicator>(module, options);
  replicator->hook_accumulators();
  attach_call_hooks(module, std::make_shared<detail::ReplicatorHolder>(replicator));
}

bool is_replicated(const torch::nn::Module& module) { return detail::replicator_of(module) != nullptr; }

ReplicateStats replicate_stats(const torch::nn::Module& module) {
  const detail::Replicator* r = detail::replicator_of(module);
  FSDP_CHECK(r != nullptr, "replicate_stats: module ", module.name(), " is not replicated; apply replicate first");
  return r->stats;
}

}  // namespace fsdp
