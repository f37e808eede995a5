#include "core/fsdp_param_group.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "fsdp/common/compat.h"

#include "core/comm_context.h"

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
// back, never replacing it (FlatShard).
//
// Gradients: before a unit's backward, each trainable parameter's .grad
// becomes a full-shape view of one flat gradient buffer, so autograd's
// AccumulateGrad adds into it in place (outside create_graph) and the buffer
// is the reduce-scatter's input as it stands. AccumulateGrad's post-hook
// only marks the parameter as used. When the unit's backward is done (see
// [Note: when a unit's backward ends] in fsdp_state.cpp) the unit is
// resharded and the buffer reduce-scattered asynchronously; each parameter
// then gets its sharded gradient: a 1-D tensor matching its sharded data,
// which is what the optimizer sees. How each path does this is
// [Note: gradients in place] in gradient_paths.cpp.
//
// set_data to another dtype (fp32 shard <-> bf16 gathered view) makes
// autograd drop the parameter's AccumulateGrad node, so hooks are
// registered again whenever the node changes (each unshard under mixed
// precision); the node keeps a hook only while someone holds it, hence
// FSDPParam::grad_accumulator.

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

}  // namespace

bool FSDPParam::requires_grad() const { return param.requires_grad(); }

FSDPParamGroup::FSDPParamGroup(std::vector<FSDPParam> params, const dist::DeviceMesh& mesh,
                               const FullyShardOptions& options)
    : shard_(std::move(params), mesh, options), flow_(make_gradient_flow(shard_)) {
  used_.assign(shard_.params().size(), 0);
}

void FSDPParamGroup::attach(CommContext* comm, const std::string* unit_name) {
  comm_ = comm;
  name_ = unit_name;
}

UnitComm FSDPParamGroup::on(dist::ProcessGroup& group) const { return UnitComm{group, *comm_, *name_}; }

bool FSDPParamGroup::has_trainable_params() const {
  const auto& ps = shard_.params();
  return std::any_of(ps.begin(), ps.end(), [](const FSDPParam& p) { return p.requires_grad(); });
}

void FSDPParamGroup::unshard() {
  if (state_ == ShardedState::kUnsharded || all_gather_.in_flight() || shard_.gathered_is_shard()) return;
  shard_.allocate_gathered();
  all_gather_ = all_gather(on(shard_group()), shard_.sharded(), shard_.gathered());
}

void FSDPParamGroup::finish_all_gather() { all_gather_.wait(*comm_, "FSDP::all_gather_wait"); }

void FSDPParamGroup::wait_for_unshard() {
  if (state_ == ShardedState::kUnsharded) return;
  unshard();  // no-op when prefetched
  finish_all_gather();
  for (auto& p : shard_.params()) {
    p.param.set_data(shard_.gathered_view(p));
    flow_->on_unsharded(p);
  }
  register_grad_hooks();
  state_ = ShardedState::kUnsharded;
  ++epoch_;
}

void FSDPParamGroup::reshard() {
  if (all_gather_.in_flight()) ++epoch_;  // a pending gather dropped
  finish_all_gather();  // prefetched but never used: finish before freeing
  if (state_ == ShardedState::kUnsharded) {
    ++epoch_;
    for (auto& p : shard_.params()) {
      p.param.set_data(shard_.sharded_view(p));
      flow_->on_resharded(p);
    }
    state_ = ShardedState::kSharded;
  }
  shard_.free_gathered();
}

void FSDPParamGroup::register_grad_hooks() {
  auto& ps = shard_.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    auto& p = ps[i];
    if (!p.requires_grad()) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(p.param);
    if (accumulator == p.grad_accumulator) continue;
    accumulator->add_post_hook(std::make_unique<GradUsedHook>(this, i));
    p.grad_accumulator = std::move(accumulator);
  }
}

void FSDPParamGroup::prepare_gradients() {
  if (!has_trainable_params() || state_ != ShardedState::kUnsharded) return;
  flow_->prepare();
}

void FSDPParamGroup::post_backward() {
  RECORD_USER_SCOPE("FSDP::post_backward");
  if (!has_trainable_params()) {
    reshard();
    return;
  }
  const bool sync = settings_.requires_gradient_sync;
  flow_->collect(state_ == ShardedState::kUnsharded);
  // Kept gathered for the next micro-step's forward only: a backward that
  // syncs hands sharded gradients to sharded parameters.
  if (!flow_->may_stay_gathered() || settings_.reshard_after_backward || sync) reshard();
  flow_->stage(sync);
  // A held reduction (HSDP without all-reduce) is accumulation too: which
  // parameters got gradients is kept for the window, and decided at the sync.
  accumulating_ = !sync || holds_reduction();
  if (!sync) return;
  reduced_this_backward_ = !holds_reduction();
  comm_->reduce(*this);
}

void FSDPParamGroup::issue_reduce_scatter() { flow_->issue_reduce_scatter(on(shard_group())); }
void FSDPParamGroup::wait_reduce_scatter() { flow_->wait_reduce_scatter(*comm_); }
void FSDPParamGroup::hold_partial_reduction() { flow_->hold_partial_reduction(); }
void FSDPParamGroup::issue_replica_all_reduce() { flow_->issue_all_reduce(on(replicate_group())); }
void FSDPParamGroup::wait_replica_all_reduce() { flow_->wait_all_reduce(*comm_); }

void FSDPParamGroup::assign_gradients() {
  const double ranks = static_cast<double>(shard_group().size()) * replicate_group().size();
  flow_->assign(settings_, ranks);
}

bool FSDPParamGroup::reduces_across_replicas() const { return replicate_group().size() > 1; }

bool FSDPParamGroup::holds_reduction() const { return reduces_across_replicas() && !settings_.requires_all_reduce; }

void FSDPParamGroup::leave_in_place_path() {
  if (flow_->path() != GradientPath::kInPlace) return;
  if (comm_ != nullptr) comm_->finish(*this);  // a reduction in flight ends on the path that issued it
  reshard();
  flow_ = leave_in_place(std::move(flow_), shard_);
}

void FSDPParamGroup::set_gradient_divide_factor(std::optional<double> factor) {
  if (factor) leave_in_place_path();
  settings_.gradient_divide_factor = factor;
}

void FSDPParamGroup::set_reduced_grad_hook(ReducedGradHook hook) {
  if (hook) leave_in_place_path();
  settings_.reduced_grad_hook = std::move(hook);
}

void FSDPParamGroup::append_used(std::vector<uint8_t>& out) const {
  const auto& ps = shard_.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (ps[i].requires_grad()) out.push_back(used_[i]);
  }
}

size_t FSDPParamGroup::apply_used(const uint8_t* used_anywhere) {
  size_t k = 0;
  for (auto& p : shard_.params()) {
    if (!p.requires_grad()) continue;
    if (used_anywhere[k++] == 0 && !p.grad_existed_before) p.param.mutable_grad() = at::Tensor();
  }
  std::fill(used_.begin(), used_.end(), 0);
  return k;
}

void FSDPParamGroup::begin_iteration() {
  if (!accumulating_) {
    for (auto& p : shard_.params()) p.grad_existence_recorded = false;
  }
}

void FSDPParamGroup::end_backward() {
  reduced_this_backward_ = false;
  begin_iteration();  // the same rule: a window of accumulation keeps its records
}

void FSDPParamGroup::drop_forward() noexcept {
  flow_->drop_backward();
  try {
    reshard();  // finishes a prefetched gather, puts the stashed sharded gradients back
  } catch (const std::exception&) {
  }
}

void FSDPParamGroup::abandon() noexcept {
  try {
    finish_all_gather();  // marked waited in the event log, as every issued collective is
  } catch (const std::exception&) {
    all_gather_.abandon();
  }
  flow_->abandon();
  try {  // partial full-shape gradients give way to the sharded ones from before
    reshard();
  } catch (const std::exception&) {
  }
  std::fill(used_.begin(), used_.end(), 0);
  end_backward();
}

}  // namespace fsdp
