#include "core/fsdp_state.h"

#include <algorithm>
#include <cstdio>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include "fsdp/common/allocation_log.h"
#include "fsdp/common/error.h"
#include "fsdp/common/error_text.h"
#include "fsdp/dist/collectives.h"

namespace fsdp {

// [Note: when a unit's backward ends]
// As in FSDP2, not by counting gradients (frozen parameters never get one,
// and a count says nothing about nodes that still read the parameters):
//
// - Each call of a unit puts one autograd node (PostBackwardNode) on the
//   call's inputs that require gradients. Autograd runs it once the
//   gradients of those inputs exist, which is after every node of the call
//   that leads to them, so after every read of the gathered parameters on
//   that path; AccumulateGrad nodes run as soon as they are ready, before it.
// - A unit called several times (a block applied twice, two forwards before
//   one backward) is done when the nodes of all its calls have run. A call
//   whose inputs need no gradient (the first block, the root) carries no
//   node, so that unit's backward ends at the end of backward.
// - At the end of backward (a callback queued on the autograd engine) every
//   unit still gathered or still owing a reduction runs post-backward, in
//   module order, so every rank issues the same collectives; then the
//   reductions are drained and the ranks agree on which parameters got a
//   gradient anywhere (one small all-reduce), so a parameter no rank used
//   keeps the gradient it had (none stays none, as in one process).
// - Errors: a forward that throws leaves its unit as it found it, and the
//   root's leaves the whole tree ready; a backward that throws never runs the
//   callback, and the guard the callback holds, destroyed with the engine's
//   graph task, finishes the collectives issued and reshards every unit.
// - A forward with gradients whose graph is freed without a backward (a
//   metric computed without NoGradGuard) is noticed when its last root
//   output's graph dies (DroppedGraphWatch): units go back to sharded with
//   the gradients they had, so the optimizer step that follows sees them.

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
// anyway, so they are still reduced once, after the last of them. The tree's phase (TreePhase)
// says whether an iteration is open and whether a backward runs; what the
// iteration recorded lives in TreeIteration and each unit's UnitCalls, each
// emptied by one reset().

const char* to_string(TrainingState state) {
  switch (state) {
    case TrainingState::kIdle: return "idle";
    case TrainingState::kForward: return "forward";
    case TrainingState::kPreBackward: return "pre_backward";
    case TrainingState::kPostBackward: return "post_backward";
  }
  return "?";
}

const char* to_string(TreePhase phase) {
  switch (phase) {
    case TreePhase::kIdle: return "idle";
    case TreePhase::kForward: return "forward";
    case TreePhase::kBackward: return "backward";
  }
  return "?";
}

bool TreeIteration::has_live_graph() const {
  return std::any_of(open_graphs.begin(), open_graphs.end(), [](const auto& g) { return !g.expired(); });
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

struct PostBackwardNode : public torch::autograd::Function<PostBackwardNode> {
  // TensorList, not variable_list: autograd counts the tensors of a
  // TensorList as inputs, but takes a std::vector for one opaque argument.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                                                int64_t state) {
    ctx->saved_data["state"] = state;
    return inputs.vec();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    reinterpret_cast<FSDPState*>(ctx->saved_data["state"].toInt())->on_inputs_grad();
    grads.emplace_back();  // the state pointer has no gradient
    return grads;
  }
};

// Held by the end-of-backward callback: if the graph task dies without
// running it (backward threw), the iteration is abandoned.
struct BackwardGuard {
  std::shared_ptr<FSDPTree> tree;
  bool completed = false;
  explicit BackwardGuard(std::shared_ptr<FSDPTree> t) : tree(std::move(t)) {}
  BackwardGuard(const BackwardGuard&) = delete;
  BackwardGuard& operator=(const BackwardGuard&) = delete;
  ~BackwardGuard() {
    if (!completed) FSDPState::abandon_iteration(*tree, /*keep_open=*/false);
  }
};

// Owned by a pre-hook on each root output's grad_fn, so destroyed with the
// last of those graphs. Freed while its iteration is still open and not in
// backward means no backward will come for it (a forward with gradients
// whose result was dropped): FSDPState::drop_iteration then puts the units
// back before the optimizer step that usually follows.
struct DroppedGraphWatch {
  DroppedGraphWatch(std::weak_ptr<FSDPTree> t, int64_t count) : tree(std::move(t)), backward_count(count) {}
  DroppedGraphWatch(const DroppedGraphWatch&) = delete;  // a copy's destructor would act too
  DroppedGraphWatch& operator=(const DroppedGraphWatch&) = delete;
  std::weak_ptr<FSDPTree> tree;
  int64_t backward_count;
  ~DroppedGraphWatch() {
    const auto t = tree.lock();
    if (!t || t->backward_count != backward_count || t->iteration.phase != TreePhase::kForward) return;
    if (!t->iteration.has_live_graph()) FSDPState::drop_iteration(*t);
  }
};

struct DroppedGraphHook : public torch::autograd::FunctionPreHook {
  explicit DroppedGraphHook(std::shared_ptr<DroppedGraphWatch> w) : watch(std::move(w)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override { return grads; }
  std::shared_ptr<DroppedGraphWatch> watch;
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
  if (!tree_) return;
  const auto drop = [this](std::vector<FSDPState*>& v) { v.erase(std::remove(v.begin(), v.end(), this), v.end()); };
  drop(tree_->states);
  drop(tree_->forward_order);
  tree_->iteration.post_forward_order.clear();  // rebuilt by the next iteration
  for (FSDPState* s : tree_->states) {
    drop(s->forward_prefetch);
    drop(s->backward_prefetch);
    s->calls_.post_forward_indices.clear();
    s->calls_.backward_cursor = 0;
  }
  if (!is_root_) return;
  const std::vector<FSDPState*> orphans = tree_->states;
  for (FSDPState* s : orphans) {
    auto own = std::make_shared<FSDPTree>();
    own->states.push_back(s);
    s->join_tree(own, true, "");
  }
}

void FSDPState::join_tree(const std::shared_ptr<FSDPTree>& tree, bool is_root, const std::string& name) {
  tree_ = tree;
  is_root_ = is_root;
  name_ = name.empty() ? "<root>" : name;
  phases_ = {memory::phase_id("forward " + name_), memory::phase_id("recompute " + name_),
             memory::phase_id("backward " + name_), memory::phase_id("post-backward " + name_),
             memory::phase_id("forward"), memory::phase_id("backward")};
  if (group_) group_->attach(&tree_->comm, &name_);
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

void FSDPState::check_reshard_after_forward(ReshardAfterForward reshard, int shard_group_size) {
  if (reshard.ranks == ReshardAfterForward::kShardGroup) return;
  FSDP_CHECK(reshard.ranks >= 1 && shard_group_size % reshard.ranks == 0, "reshard_after_forward=", reshard.ranks,
             ": the number of ranks to keep the parameters sharded over after forward must divide the shard "
             "group's size, ", shard_group_size, " (true frees them, false keeps them gathered)");
}

void FSDPState::set_reshard_after_forward(ReshardAfterForward reshard) {
  if (group_ && reshard.ranks != ReshardAfterForward::kShardGroup) {
    check_reshard_after_forward(reshard, group_->shard_group().size());
    group_->prepare_reshard_to(reshard.ranks);
  }
  reshard_after_forward_set_ = reshard;
}

void FSDPState::enter(TrainingState next, bool recomputing) {
  training_.enter(next, recomputing, name_, to_string(tree_->iteration.phase));
}

void FSDPState::begin_iteration() {
  for (FSDPState* s : tree_->states) {
    s->calls_.reset();
    if (s->group_) s->group_->begin_iteration();
  }
  tree_->iteration.reset();
  tree_->iteration.phase = TreePhase::kForward;
}

void FSDPState::pre_forward(const torch::nn::Module& module) {
  CallFrame frame;
  frame.module = &module;
  frame.grad_enabled = at::GradMode::is_enabled();
  frame.in_backward = tree_->iteration.phase == TreePhase::kBackward;
  frame.was_unsharded = group_ && group_->sharded_state() == ShardedState::kUnsharded;
  if (frame.in_backward) {
    // Recomputed inside backward (activation checkpointing): gathered for
    // the backward that follows. See [Note: a unit used again in backward].
    memory::set_phase(phases_.recompute);
    if (training_.get() == TrainingState::kPostBackward && group_) tree_->comm.finish(*group_);
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
  if (is_root_ && frame.grad_enabled) {
    // A new iteration unless an earlier forward's graph still awaits its
    // backward (two forwards, one backward); a graph that was dropped
    // without a backward does not count.
    if (tree_->iteration.phase != TreePhase::kForward || !tree_->iteration.has_live_graph()) {
      begin_iteration();
      frame.opened_iteration = true;
    }
  }
  enter(TrainingState::kForward);
  tree_->comm.record(FSDPEvent::Kind::kPreForward, name_);
  if (group_) group_->wait_for_unshard();
  if (tree_->recording_order &&
      std::find(tree_->forward_order.begin(), tree_->forward_order.end(), this) == tree_->forward_order.end()) {
    tree_->forward_order.push_back(this);
  }
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
  wrapped = PostBackwardNode::apply(at::TensorList(wrapped), reinterpret_cast<int64_t>(this));
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
  const auto& mp = mixed_precision_;
  if (mp.param_dtype && mp.cast_forward_inputs && input.defined() && at::isFloatingType(input.scalar_type()) &&
      input.scalar_type() != *mp.param_dtype) {
    return input.to(*mp.param_dtype);
  }
  return input;
}

void FSDPState::post_forward(std::vector<at::Tensor>& outputs) {
  FSDP_ASSERT(!open_calls_.empty());
  const CallFrame frame = open_calls_.back();
  open_calls_.pop_back();
  post_forward(frame, outputs);
}

void FSDPState::post_forward(const CallFrame& call, std::vector<at::Tensor>& outputs) {
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
  tree_->comm.record(FSDPEvent::Kind::kPostForward, name_);
  enter(TrainingState::kIdle);
  cast_outputs();
  if (is_root_) {
    tree_->recording_order = false;
    // A unit of several modules whose round did not finish (one of them did
    // not run) is finished here, as FSDP2's root post-forward does.
    for (FSDPState* s : tree_->states) {
      if (s != this) s->close_open_round(frame.grad_enabled);
    }
  }
  if (!frame.grad_enabled) {
    // No backward follows: leave every unit as this forward found it
    // (units awaiting a backward gather again in their pre-backward).
    if (group_ && !frame.was_unsharded) group_->reshard();
    if (is_root_) {
      for (FSDPState* s : tree_->states) {
        // Prefetched for a call that never came: finish and free.
        if (s != this && s->group_ && s->group_->sharded_state() == ShardedState::kSharded) s->group_->reshard();
      }
    }
    return;
  }
  const bool needs_backward =
      std::any_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
  auto& order = tree_->iteration.post_forward_order;
  if (needs_backward) {
    if (!frame.wrapped_inputs) calls_.unsignalled = true;
    calls_.post_forward_indices.push_back(order.size());
    order.push_back(this);
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
  // One pre-backward per call and backward, whichever of its outputs gets a
  // gradient first (a retained graph can be backwarded again).
  auto fired_in = std::make_shared<int64_t>(-1);
  std::shared_ptr<DroppedGraphWatch> watch;
  if (is_root_) watch = std::make_shared<DroppedGraphWatch>(tree_, tree_->backward_count);
  for (auto& t : outputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    t.register_hook([this, fired_in](const at::Tensor& grad) {
      if (*fired_in != tree_->backward_count) {
        *fired_in = tree_->backward_count;
        pre_backward();
      }
      return grad;
    });
    if (is_root_ && t.grad_fn()) {
      tree_->iteration.open_graphs.emplace_back(t.grad_fn());
      t.grad_fn()->add_pre_hook(std::make_unique<DroppedGraphHook>(watch));
    }
  }
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
    abandon_iteration(*tree_, /*keep_open=*/tree_->iteration.phase == TreePhase::kForward && !frame.opened_iteration);
    return;
  }
  if (group_ && !frame.was_unsharded) group_->abandon();
}

void FSDPState::pre_backward() {
  RECORD_USER_SCOPE("FSDP::pre_backward");
  if (tree_->iteration.phase != TreePhase::kBackward) {
    tree_->iteration.phase = TreePhase::kBackward;
    auto guard = std::make_shared<BackwardGuard>(tree_);
    torch::autograd::Engine::get_default_engine().queue_callback([guard] {
      end_of_backward(*guard->tree);
      guard->completed = true;
    });
  }
  tree_->comm.record(FSDPEvent::Kind::kPreBackward, name_);
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
  tree_->comm.record(FSDPEvent::Kind::kPostBackward, name_);
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
  // Until the first forward has recorded the order, module order stands in.
  const auto& order = tree_->recording_order ? tree_->states : tree_->forward_order;
  const auto it = std::find(order.begin(), order.end(), this);
  if (it == order.end()) return;
  for (auto next = it + 1; next != order.end() && next - it <= prefetch_depth_; ++next) {
    if (!(*next)->is_root_) issue_unshard(*next);
  }
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
  const auto& order = tree_->iteration.post_forward_order;
  for (size_t k = 1; k <= static_cast<size_t>(prefetch_depth_) && k <= index; ++k) {
    issue_unshard(order[index - k]);
  }
}

void FSDPState::end_of_backward(FSDPTree& tree) {
  RECORD_USER_SCOPE("FSDP::end_of_backward");
  for (FSDPState* s : tree.states) s->close_open_round(/*grad_enabled=*/true);
  for (FSDPState* s : tree.states) {
    FSDPParamGroup* g = s->group_.get();
    if (g == nullptr || s->training_.get() == TrainingState::kPostBackward) continue;
    // Units owing a reduction reduce even if unused here: the peers may not agree.
    const bool owes_reduction = g->has_trainable_params() && g->requires_gradient_sync();
    if (owes_reduction || g->sharded_state() == ShardedState::kUnsharded) s->post_backward();
  }
  tree.comm.drain();

  std::vector<uint8_t> used;
  std::vector<FSDPParamGroup*> reduced;
  for (FSDPState* s : tree.states) {
    if (s->group_ && s->group_->reduced_this_backward()) {
      s->group_->append_used(used);
      reduced.push_back(s->group_.get());
    }
  }
  if (!used.empty()) {
    at::Tensor flags = at::from_blob(used.data(), {static_cast<int64_t>(used.size())}, at::kByte);
    dist::ProcessGroup& world = reduced.front()->world_group();
    if (world.size() > 1) {
      // On the units' device: NCCL takes no host tensors.
      at::Tensor on_device = flags.to(reduced.front()->device());
      dist::all_reduce(world, on_device, dist::ReduceOp::kMax).wait();
      if (!on_device.is_same(flags)) flags.copy_(on_device);
    }
    size_t offset = 0;
    for (FSDPParamGroup* g : reduced) offset += g->apply_used(used.data() + offset);
  }

  for (FSDPState* s : tree.states) {
    s->enter(TrainingState::kIdle);
    s->calls_.rearm();
    if (!s->group_) continue;
    // A gather prefetched for a unit that did not run (a conditional path,
    // an explicit list naming it) is finished and freed, as FSDP2 discards
    // a mistargeted unshard: never held through step(), never consumed
    // stale by a later forward.
    if (s->group_->sharded_state() == ShardedState::kSharded) s->group_->reshard();
    s->group_->end_backward();
  }
  // The graph's records stay for another backward through it (retain_graph).
  tree.iteration.phase = TreePhase::kIdle;
  ++tree.backward_count;
}

void FSDPState::drop_iteration(FSDPTree& tree) noexcept {
  for (FSDPState* s : tree.states) {
    s->training_.enter_idle();
    s->calls_.reset();
    if (s->group_) s->group_->drop_forward();
  }
  tree.iteration.reset();
}

void FSDPState::abandon_iteration(FSDPTree& tree, bool keep_open) noexcept {
  tree.comm.abandon();
  for (FSDPState* s : tree.states) {
    s->training_.enter_idle();
    if (s->group_) s->group_->abandon();
    if (keep_open) {
      s->calls_.unsignalled = true;  // the earlier graph's calls end at the end of backward
      s->calls_.modules_to_run.clear();
    } else {
      s->calls_.reset();
    }
  }
  ++tree.backward_count;
  if (keep_open) {
    tree.iteration.phase = TreePhase::kForward;
  } else {
    tree.iteration.reset();
  }
}

}  // namespace fsdp
