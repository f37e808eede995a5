#include "core/fsdp_state.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function_hook.h>

#include "fsdp/common/allocation_log.h"
#include "fsdp/common/error.h"

namespace fsdp {

// [Note: the training state machine]
// Each unit's TrainingState changes only through FSDPState::enter:
//
//   from \ to      forward   pre_backward   post_backward   idle
//   idle             yes        yes            yes (1)        yes
//   forward          -          -              -              yes
//   pre_backward     -          yes (2)        yes            yes (3)
//   post_backward    -          yes (4)        -              yes
//
//   (1) at the end of backward, a unit that owes a reduction (or is still
//       gathered) without having run a backward here;
//   (2) one pre-backward per call: a unit called twice gets two;
//   (3) at the end of backward, a unit without parameters of its own.
//
//   (4) only for a unit recomputed in backward after its post-backward ran
//       (see [Note: a unit used again in backward]); a pre-backward hook
//       there would be a bug.
//
// A forward recomputed inside backward (activation checkpointing) enters
// pre_backward from idle or post_backward, and stays there from
// pre_backward. The state carries weight: post-backward runs once per
// gathering in backward because it is entered once from pre_backward or
// idle (a unit in post_backward is skipped by the end of backward), and a
// transition outside the table is a bug in fsdp.cpp, reported with both
// states named.

// [Note: a unit used again in backward]
// Activation checkpointing recomputes a unit inside backward, once per
// checkpointed region that called it: two forwards before one backward
// (DPO-style losses), or one unit called in two checkpointed regions, gather
// it once per region, and the regions' backwards run one after the other.
// Each recomputation puts its own post-backward node on its inputs; each
// time the nodes pending for the unit have run, post-backward reduces the
// gradients of the uses so far and reshards. A later recomputation in the
// same backward re-enters pre_backward from post_backward (4): it first
// finishes the unit's reduction still in flight (its buffers and, on the
// in-place path, the gradient buffer autograd is about to add into), then
// gathers again, and its gradients get a post-backward and a reduction of
// their own, summed into the sharded gradients (the reductions are linear,
// so the sum of per-use reductions is the reduction of the sum). This is
// FSDP2's rule too: one reduction per gathering, never more than one
// unit's gradients held unsharded at a time, and each rank issues the same
// collectives because each recomputes the same regions. Calls in one
// forward outside checkpointing keep their gathered parameters to backward
// anyway, so they are still reduced once, after the last of them.

const char* to_string(TrainingState state) {
  switch (state) {
    case TrainingState::kIdle: return "idle";
    case TrainingState::kForward: return "forward";
    case TrainingState::kPreBackward: return "pre_backward";
    case TrainingState::kPostBackward: return "post_backward";
  }
  return "?";
}

namespace {

bool is_transition(TrainingState from, TrainingState to, bool recomputing) {
  switch (to) {
    case TrainingState::kIdle: return true;
    case TrainingState::kForward: return from == TrainingState::kIdle;
    case TrainingState::kPreBackward:
      return from == TrainingState::kIdle || from == TrainingState::kPreBackward ||
             (recomputing && from == TrainingState::kPostBackward);
    case TrainingState::kPostBackward: return from == TrainingState::kIdle || from == TrainingState::kPreBackward;
  }
  return false;
}

// An identity on a call's inputs that require gradients: autograd runs it
// once their gradients exist ([Note: when a unit's backward ends] in
// fsdp_tree.cpp). What it signals is a post-hook's (InputsGradHook).
struct PostBackwardNode : public torch::autograd::Function<PostBackwardNode> {
  // TensorList, not variable_list: autograd counts the tensors of a
  // TensorList as inputs.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* /*ctx*/, at::TensorList inputs) {
    return inputs.vec();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grads) {
    return grads;
  }
};

// Tells the unit that the gradients of one call's inputs exist. A unit
// destroyed while the graph lives is not told.
class InputsGradHook : public torch::autograd::FunctionPostHook {
 public:
  explicit InputsGradHook(std::weak_ptr<FSDPState> unit) : unit_(std::move(unit)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (const auto unit = unit_.lock()) unit->on_inputs_grad();
    return outputs;
  }

 private:
  std::weak_ptr<FSDPState> unit_;
};

}  // namespace

void TrainingStateMachine::enter(TrainingState next, bool recomputing, const std::string& unit, const char* phase) {
  FSDP_CHECK(is_transition(state_, next, recomputing), "fsdp.cpp internal error: unit ", unit, " went from ",
             to_string(state_), " to ", to_string(next), " (tree phase ", phase,
             "), which the state machine does not allow; please report it with the model code");
  state_ = next;
}

FSDPState::FSDPState(std::unique_ptr<FSDPParamGroup> group, const FullyShardOptions& options)
    : group_(std::move(group)),
      mixed_precision_(options.mixed_precision),
      prefetch_depth_(options.prefetch_depth),
      strategy_(options.strategy),
      strategy_reshards_after_forward_(options.strategy == ShardingStrategy::kFullShard ||
                                       options.strategy == ShardingStrategy::kHybridShard) {
  if (options.reshard_after_forward) set_reshard_after_forward(*options.reshard_after_forward);
}

FSDPState::~FSDPState() {
  if (tree_) tree_->remove(this, is_root_);
}

void FSDPState::forget(const FSDPState* gone) {
  const auto drop = [gone](std::vector<FSDPState*>& v) { v.erase(std::remove(v.begin(), v.end(), gone), v.end()); };
  drop(forward_prefetch);
  drop(backward_prefetch);
  calls_.post_forward_indices.clear();  // the tree's post-forward order is rebuilt by the next iteration
  calls_.backward_cursor = 0;
}

void FSDPState::join_tree(const std::shared_ptr<FSDPTree>& tree, bool is_root, const std::string& name) {
  tree_ = tree;
  is_root_ = is_root;
  name_ = name.empty() ? "<root>" : name;
  phases_ = {memory::phase_id("forward " + name_), memory::phase_id("recompute " + name_),
             memory::phase_id("backward " + name_), memory::phase_id("post-backward " + name_),
             memory::phase_id("forward"), memory::phase_id("backward")};
  if (group_) group_->attach(tree_->comm(), &tree_->reductions(), &name_);
}

std::optional<int> FSDPState::post_forward_ranks() const {
  if (!group_) return std::nullopt;
  const ReshardAfterForward r =
      reshard_after_forward_set_.value_or(ReshardAfterForward(strategy_reshards_after_forward_ && !is_root_));
  // Decided on the request, not on the number of ranks: "free" over a shard
  // group of one rank is not "keep".
  if (r.ranks == ReshardAfterForward::kShardGroup) return group_->shard_group().size();
  if (r.ranks == 1) return std::nullopt;
  return r.ranks;
}

void FSDPState::set_reshard_after_forward(ReshardAfterForward reshard) {
  if (group_ && reshard.ranks != ReshardAfterForward::kShardGroup) {
    check_reshard_after_forward(reshard, group_->shard_group().size());
    group_->prepare_reshard_to(reshard.ranks);
  }
  reshard_after_forward_set_ = reshard;
}

void FSDPState::enter(TrainingState next, bool recomputing) {
  training_.enter(next, recomputing, name_, to_string(tree_->phase()));
}

void FSDPState::reset_calls() {
  calls_.reset();
  if (group_) group_->begin_iteration();
}

void FSDPState::pre_forward(const torch::nn::Module& module) {
  CallFrame frame;
  frame.module = &module;
  frame.grad_enabled = at::GradMode::is_enabled();
  frame.in_backward = tree_->phase() == TreePhase::kBackward;
  frame.was_unsharded = group_ && group_->sharded_state() == ShardedState::kUnsharded;
  if (frame.in_backward) {
    // Recomputed inside backward (activation checkpointing): gathered for
    // the backward that follows. See [Note: a unit used again in backward].
    memory::set_phase(phases_.recompute);
    if (training_.get() == TrainingState::kPostBackward && group_) tree_->reductions().finish(group_.get());
    if (training_.get() != TrainingState::kPreBackward) enter(TrainingState::kPreBackward, /*recomputing=*/true);
    if (group_) {
      group_->wait_for_unshard();
      if (frame.grad_enabled) group_->prepare_gradients(/*in_backward=*/true);
    }
    open_calls_.push_back(frame);
    return;
  }
  if (modules_.size() > 1 && !calls_.modules_to_run.empty()) {
    // Several modules, one unit: the round's first call ran the hooks for
    // all of them; until every module has run, a call is an inner one (a
    // module called twice in a round included, as in FSDP2).
    frame.inner = true;
    open_calls_.push_back(frame);
    return;
  }
  RECORD_USER_SCOPE("FSDP::pre_forward");
  memory::set_phase(phases_.forward);
  if (is_root_ && frame.grad_enabled) frame.opened_iteration = tree_->open_iteration();
  enter(TrainingState::kForward);
  tree_->log().record(FSDPEvent::Kind::kPreForward, name_);
  if (group_) group_->wait_for_unshard();
  tree_->record_forward(this);
  prefetch_forward();
  if (modules_.size() > 1) {
    calls_.modules_to_run = modules_;
    calls_.round_frame = frame;
  }
  open_calls_.push_back(frame);
}

void FSDPState::wrap_inputs(const std::vector<at::Tensor*>& inputs) {
  FSDP_ASSERT(!open_calls_.empty());
  CallFrame& frame = open_calls_.back();
  if (!frame.grad_enabled || frame.inner) return;
  torch::autograd::variable_list wrapped;
  for (at::Tensor* t : inputs) {
    if (t->defined() && t->requires_grad()) wrapped.push_back(*t);
  }
  if (wrapped.empty()) return;
  wrapped = PostBackwardNode::apply(at::TensorList(wrapped));
  wrapped.front().grad_fn()->add_post_hook(std::make_unique<InputsGradHook>(weak_from_this()));
  size_t i = 0;
  for (at::Tensor* t : inputs) {
    if (t->defined() && t->requires_grad()) *t = wrapped[i++];
  }
  frame.wrapped_inputs = true;
  ++calls_.pending_backward;
  // A recomputation's node belongs to this backward only; another backward
  // through a retained graph recomputes, and registers, again.
  if (frame.in_backward) return;
  if (modules_.size() > 1) calls_.round_frame.wrapped_inputs = true;
  ++calls_.registered;
}

at::Tensor FSDPState::cast_input(const at::Tensor& input) const {
  return cast_forward_input(input, mixed_precision_);
}

void FSDPState::post_forward(const torch::nn::Module& /*module*/, std::vector<at::Tensor>& outputs) {
  FSDP_ASSERT(!open_calls_.empty());
  const CallFrame frame = open_calls_.back();
  open_calls_.pop_back();
  finish_call(frame, outputs);
}

void FSDPState::finish_call(const CallFrame& call, std::vector<at::Tensor>& outputs) {
  const auto cast_outputs = [&] {
    if (const auto& out_dtype = mixed_precision_.output_dtype) {
      for (auto& t : outputs) {
        if (t.defined() && at::isFloatingType(t.scalar_type())) t = t.to(*out_dtype);
      }
    }
  };
  if (call.in_backward) {
    // Recomputed as the forward ran, and gathered until its backward ends:
    // a recomputation with no node on its inputs (none needs a gradient)
    // cannot tell when that is, so the unit waits for the end of backward.
    cast_outputs();
    const bool needs_backward = std::any_of(outputs.begin(), outputs.end(),
                                            [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
    if (needs_backward && !call.wrapped_inputs) calls_.unsignalled = true;
    return;
  }
  if (modules_.size() > 1) {
    // The round's last module to finish runs the post-forward of them all;
    // the others only cast their outputs, as a unit of one module would.
    auto& left = calls_.modules_to_run;
    left.erase(std::remove(left.begin(), left.end(), call.module), left.end());
    if (!left.empty()) {
      cast_outputs();
      return;
    }
  }
  const CallFrame& frame = modules_.size() > 1 ? calls_.round_frame : call;
  RECORD_USER_SCOPE("FSDP::post_forward");
  memory::set_phase(phases_.between_forward);
  tree_->log().record(FSDPEvent::Kind::kPostForward, name_);
  enter(TrainingState::kIdle);
  cast_outputs();
  if (is_root_) tree_->end_root_forward(this, frame.grad_enabled);
  if (!frame.grad_enabled) {
    // No backward follows: leave every unit as this forward found it
    // (units awaiting a backward gather again in their pre-backward).
    if (group_ && !frame.was_unsharded) group_->reshard();
    if (is_root_) tree_->release_unused_prefetches(this);
    return;
  }
  const bool needs_backward =
      std::any_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
  if (needs_backward) {
    if (!frame.wrapped_inputs) calls_.unsignalled = true;
    calls_.post_forward_indices.push_back(tree_->record_post_forward(this));
    calls_.backward_cursor = calls_.post_forward_indices.size();
  }
  const std::optional<int> keep_over = post_forward_ranks();
  if (group_ && keep_over) {
    // Without a backward to come nothing is kept for one.
    if (needs_backward) {
      group_->reshard_to(*keep_over);  // over the whole shard group: a plain reshard
    } else {
      group_->reshard();
    }
  } else if (group_ && needs_backward) {
    // Staying gathered (the root, shard_grad_op): gradient views now, so a
    // parameter used after this forward (a tied output head) accumulates
    // into the flat buffer in place instead of into a tensor of its own.
    group_->prepare_gradients(/*in_backward=*/false);
  } else if (group_ && !frame.was_unsharded) {
    // No backward follows (no output needs a gradient): as after a no-grad
    // forward, nothing is kept for one.
    group_->reshard();
  }
  arm_pre_backward(outputs);
  if (is_root_) tree_->watch_root_outputs(outputs);
}

void FSDPState::arm_pre_backward(std::vector<at::Tensor>& outputs) {
  // One pre-backward per call and backward, whichever of its outputs gets a
  // gradient first (a retained graph can be backwarded again). A unit
  // destroyed while the graph lives is not called.
  auto fired_in = std::make_shared<int64_t>(-1);
  const std::weak_ptr<FSDPState> unit = weak_from_this();
  for (auto& t : outputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    t.register_hook([unit, fired_in](const at::Tensor& grad) {
      const auto self = unit.lock();
      if (self && *fired_in != self->tree_->backward_count()) {
        *fired_in = self->tree_->backward_count();
        self->pre_backward();
      }
      return grad;
    });
  }
}

void FSDPState::release_unused_prefetch() {
  // A gather in flight on a sharded unit: prefetched for a call that never
  // came. Finished and freed.
  if (group_ && group_->sharded_state() == ShardedState::kSharded) group_->reshard();
}

void FSDPState::close_open_round(bool grad_enabled) {
  if (calls_.modules_to_run.empty()) return;
  calls_.modules_to_run.clear();
  training_.enter_idle();
  if (grad_enabled) {
    // Its last module's outputs carry no pre-backward hook: the unit stays
    // gathered, and its backward ends at the end of backward.
    calls_.unsignalled = true;
  } else if (group_ && !calls_.round_frame.was_unsharded) {
    group_->reshard();
  }
}

void FSDPState::on_forward_error() noexcept {
  if (open_calls_.empty()) return;
  const CallFrame call = open_calls_.back();
  open_calls_.pop_back();
  if (call.in_backward) return;  // the backward's own error handling takes over
  training_.enter_idle();
  const CallFrame frame = call.inner ? calls_.round_frame : call;
  calls_.modules_to_run.clear();
  if (is_root_) {
    tree_->abandon_iteration(/*keep_open=*/tree_->phase() == TreePhase::kForward && !frame.opened_iteration);
    return;
  }
  if (group_ && !frame.was_unsharded) group_->abandon();
}

void FSDPState::pre_backward() {
  RECORD_USER_SCOPE("FSDP::pre_backward");
  tree_->begin_backward();
  tree_->log().record(FSDPEvent::Kind::kPreBackward, name_);
  memory::set_phase(phases_.backward);
  enter(TrainingState::kPreBackward);
  if (group_) {
    group_->wait_for_unshard();
    group_->prepare_gradients(/*in_backward=*/true);
  }
  prefetch_backward();
}

void FSDPState::on_inputs_grad() {
  if (--calls_.pending_backward > 0 || calls_.unsignalled) return;
  post_backward();
}

void FSDPState::post_backward() {
  if (training_.get() == TrainingState::kPostBackward) return;  // once per gathering in backward
  tree_->log().record(FSDPEvent::Kind::kPostBackward, name_);
  memory::set_phase(phases_.post_backward);
  enter(TrainingState::kPostBackward);
  if (group_) group_->post_backward();
  memory::set_phase(phases_.between_backward);  // no unit's until the next pre-backward
}

void FSDPState::issue_unshard(FSDPState* s) const {
  if (s->group_ && s->group_->sharded_state() == ShardedState::kSharded) s->group_->unshard();
}

void FSDPState::prefetch_forward() {
  if (!forward_prefetch.empty()) {
    for (FSDPState* s : forward_prefetch) issue_unshard(s);
    return;
  }
  if (prefetch_depth_ <= 0) return;
  for (FSDPState* s : tree_->forward_successors(this, prefetch_depth_)) issue_unshard(s);
}

void FSDPState::prefetch_backward() {
  if (!backward_prefetch.empty()) {
    for (FSDPState* s : backward_prefetch) issue_unshard(s);
    return;
  }
  // The units that finished their forward just before this call did are
  // the next to run backward (FSDP2's post-forward order).
  if (prefetch_depth_ <= 0 || calls_.backward_cursor == 0) return;
  const size_t index = calls_.post_forward_indices[--calls_.backward_cursor];
  for (size_t k = 1; k <= static_cast<size_t>(prefetch_depth_) && k <= index; ++k) {
    issue_unshard(tree_->post_forward_at(index - k));
  }
}

bool FSDPState::owes_post_backward() const {
  if (!group_ || training_.get() == TrainingState::kPostBackward) return false;
  const bool owes_reduction = group_->has_trainable_params() && group_->requires_gradient_sync();
  return owes_reduction || group_->sharded_state() == ShardedState::kUnsharded;
}

void FSDPState::finish_backward() {
  enter(TrainingState::kIdle);
  calls_.rearm();
  if (!group_) return;
  // A gather prefetched for a unit that did not run (a conditional path,
  // an explicit list naming it) is finished and freed, as FSDP2 discards
  // a mistargeted unshard: never held through step(), never consumed
  // stale by a later forward.
  if (group_->sharded_state() == ShardedState::kSharded) group_->reshard();
  group_->end_backward();
}

void FSDPState::drop_forward() noexcept {
  training_.enter_idle();
  calls_.reset();
  if (group_) group_->drop_forward();
}

void FSDPState::abandon(bool keep_open) noexcept {
  training_.enter_idle();
  if (group_) group_->abandon();
  if (keep_open) {
    calls_.unsignalled = true;  // the earlier graph's calls end at the end of backward
    calls_.modules_to_run.clear();
  } else {
    calls_.reset();
  }
}

}  // namespace fsdp
