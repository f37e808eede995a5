#include "core/fsdp_tree.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>

#include "fsdp/common/error.h"

#include "core/autograd_hooks.h"
#include "core/fsdp_collectives.h"
#include "core/fsdp_state.h"

namespace fsdp {

// [Note: when a unit's backward ends]
// As in FSDP2, not by counting gradients (frozen parameters never get one,
// and a count says nothing about nodes that still read the parameters):
//
// - Each call of a unit puts one autograd node (PostBackwardNode in
//   fsdp_state.cpp) on the call's inputs that require gradients. Autograd
//   runs it once the gradients of those inputs exist, which is after every
//   node of the call that leads to them, so after every read of the
//   gathered parameters on that path; AccumulateGrad nodes run as soon as
//   they are ready, before it.
// - A unit called several times (a block applied twice, two forwards before
//   one backward) is done when the nodes of all its calls have run. A call
//   whose inputs need no gradient (the first block, the root) carries no
//   node, so that unit's backward ends at the end of backward.
// - At the end of backward (FSDPTree::end_of_backward, a callback queued on
//   the autograd engine) every unit still gathered or still owing a
//   reduction runs post-backward, in module order, so every rank issues the
//   same collectives; then the reductions are drained and the ranks agree
//   on which parameters got a gradient anywhere (one small all-reduce), so
//   a parameter no rank used keeps the gradient it had (none stays none, as
//   in one process).
// - Errors: a forward that throws leaves its unit as it found it, and the
//   root's leaves the whole tree ready; a backward that throws never runs the
//   callback, and the guard the callback holds, destroyed with the engine's
//   graph task, finishes the collectives issued and reshards every unit.
// - A forward with gradients whose graph is freed without a backward (a
//   metric computed without NoGradGuard) is noticed when its last root
//   output's graph dies (DroppedGraphWatch): units go back to sharded with
//   the gradients they had, so the optimizer step that follows sees them.

// [Note: the tree's phase]
// A tree's TreePhase changes only through TreeIteration::enter:
//
//   from \ to   forward   backward   idle
//   idle          yes (2)   yes (1)    -
//   forward       -         yes        -
//   backward      -         -          yes
//
//   (1) another backward through a graph retained from an earlier one;
//   (2) the only way into forward: open_iteration, the only caller
//       entering it, resets a finished or dropped iteration to idle first,
//       so forward is never entered from forward.
//
// The paths that end an iteration without a backward (abandon, drop) go
// back to idle through reset(), which must not throw; an error that keeps
// an earlier forward's graph open leaves the phase at forward. The unit's own
// record is its TrainingState ([Note: the training state machine] in
// fsdp_state.cpp); what the open iteration recorded lives in the
// TreeIteration and each unit's UnitCalls, each emptied by one reset().

const char* to_string(TreePhase phase) {
  switch (phase) {
    case TreePhase::kIdle: return "idle";
    case TreePhase::kForward: return "forward";
    case TreePhase::kBackward: return "backward";
  }
  return "?";
}

namespace {

bool is_tree_transition(TreePhase from, TreePhase to) {
  switch (to) {
    case TreePhase::kForward: return from == TreePhase::kIdle;
    case TreePhase::kBackward: return from != TreePhase::kBackward;
    case TreePhase::kIdle: return from == TreePhase::kBackward;
  }
  return false;
}

// Owned by a pre-hook on each root output's grad_fn, so destroyed with the
// last of those graphs. Freed while its iteration is still open and not in
// backward means no backward will come for it (a forward with gradients
// whose result was dropped): FSDPTree::drop_iteration then puts the units
// back before the optimizer step that usually follows.
struct DroppedGraphWatch {
  DroppedGraphWatch(std::weak_ptr<FSDPTree> t, int64_t count) : tree(std::move(t)), backward_count(count) {}
  DroppedGraphWatch(const DroppedGraphWatch&) = delete;  // a copy's destructor would act too
  DroppedGraphWatch& operator=(const DroppedGraphWatch&) = delete;
  std::weak_ptr<FSDPTree> tree;
  int64_t backward_count;
  ~DroppedGraphWatch() {
    const auto t = tree.lock();
    if (!t || t->backward_count() != backward_count || t->phase() != TreePhase::kForward) return;
    t->drop_iteration_if_no_live_graph();
  }
};

struct DroppedGraphHook : public torch::autograd::FunctionPreHook {
  explicit DroppedGraphHook(std::shared_ptr<DroppedGraphWatch> w) : watch(std::move(w)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override { return grads; }
  std::shared_ptr<DroppedGraphWatch> watch;
};

}  // namespace

void TreeIteration::enter(TreePhase next) {
  FSDP_CHECK(is_tree_transition(phase_, next), "fsdp.cpp internal error: the tree went from phase ", to_string(phase_),
             " to ", to_string(next), ", which the tree's phases do not allow; please report it with the model code");
  phase_ = next;
}

bool TreeIteration::has_live_graph() const {
  return std::any_of(open_graphs_.begin(), open_graphs_.end(), [](const auto& g) { return !g.expired(); });
}

void FSDPTree::remove(FSDPState* unit, bool was_root) {
  const auto drop = [unit](std::vector<FSDPState*>& v) { v.erase(std::remove(v.begin(), v.end(), unit), v.end()); };
  drop(units_);
  drop(forward_order_);
  iteration_.post_forward_order.clear();  // rebuilt by the next iteration
  for (FSDPState* s : units_) s->forget(unit);
  if (!was_root) return;
  const std::vector<FSDPState*> orphans = units_;
  for (FSDPState* s : orphans) {
    auto own = std::make_shared<FSDPTree>();
    own->add(s);
    s->join_tree(own, true, "");
  }
}

bool FSDPTree::open_iteration() {
  if (iteration_.phase() == TreePhase::kForward && iteration_.has_live_graph()) return false;
  for (FSDPState* s : units_) s->reset_calls();
  iteration_.reset();
  iteration_.enter(TreePhase::kForward);
  return true;
}

void FSDPTree::record_forward(FSDPState* unit) {
  if (recording_order_ && std::find(forward_order_.begin(), forward_order_.end(), unit) == forward_order_.end()) {
    forward_order_.push_back(unit);
  }
}

std::vector<FSDPState*> FSDPTree::forward_successors(const FSDPState* unit, int depth) const {
  std::vector<FSDPState*> next_units;
  const auto& order = recording_order_ ? units_ : forward_order_;
  const auto it = std::find(order.begin(), order.end(), unit);
  if (it == order.end()) return next_units;
  for (auto next = it + 1; next != order.end() && next - it <= depth; ++next) {
    if (!(*next)->is_root()) next_units.push_back(*next);
  }
  return next_units;
}

size_t FSDPTree::record_post_forward(FSDPState* unit) {
  iteration_.post_forward_order.push_back(unit);
  return iteration_.post_forward_order.size() - 1;
}

void FSDPTree::watch_root_outputs(const std::vector<at::Tensor>& outputs) {
  // Made whether or not an output takes it: a root forward none of whose
  // outputs has a graph (ids, a detached result) leaves the watch here, and
  // its destructor ends the iteration at once, as nothing can backward it.
  auto watch = std::make_shared<DroppedGraphWatch>(weak_from_this(), backward_count_);
  for (const auto& t : outputs) {
    if (!t.defined() || !t.requires_grad() || !t.grad_fn()) continue;
    iteration_.add_graph(t.grad_fn());
    t.grad_fn()->add_pre_hook(std::make_unique<DroppedGraphHook>(watch));
  }
}

void FSDPTree::end_root_forward(FSDPState* root, bool grad_enabled) {
  recording_order_ = false;
  for (FSDPState* s : units_) {
    if (s != root) s->close_open_round(grad_enabled);
  }
}

void FSDPTree::release_unused_prefetches(FSDPState* root) {
  for (FSDPState* s : units_) {
    if (s != root) s->release_unused_prefetch();
  }
}

void FSDPTree::begin_backward() {
  if (iteration_.phase() == TreePhase::kBackward) return;
  iteration_.enter(TreePhase::kBackward);
  // The tree lives until one of the two ran; a backward that throws
  // abandons the iteration.
  auto tree = shared_from_this();
  queue_end_of_backward([tree] { tree->end_of_backward(); },
                        [tree] { tree->abandon_iteration(/*keep_open=*/false); });
}

void FSDPTree::end_of_backward() {
  RECORD_USER_SCOPE("FSDP::end_of_backward");
  for (FSDPState* s : units_) s->close_open_round(/*grad_enabled=*/true);
  // Units owing a reduction reduce even if unused here: the peers may not agree.
  for (FSDPState* s : units_) {
    if (s->owes_post_backward()) s->post_backward();
  }
  reductions_.drain();
  agree_on_used_parameters();
  for (FSDPState* s : units_) s->finish_backward();
  // The graph's records stay for another backward through it (retain_graph).
  iteration_.enter(TreePhase::kIdle);
  ++backward_count_;
}

void FSDPTree::agree_on_used_parameters() {
  std::vector<uint8_t> used;
  std::vector<FSDPParamGroup*> reduced;
  for (FSDPState* s : units_) {
    if (s->group() && s->group()->reduced_this_backward()) {
      s->group()->append_used(used);
      reduced.push_back(s->group());
    }
  }
  if (used.empty()) return;
  at::Tensor flags = at::from_blob(used.data(), {static_cast<int64_t>(used.size())}, at::kByte);
  dist::ProcessGroup& world = reduced.front()->world_group();
  if (world.size() > 1) {
    // On the units' device: NCCL takes no host tensors.
    at::Tensor on_device = flags.to(reduced.front()->device());
    static const std::string kUnit = "<root>";
    any_rank(UnitComm{world, log_, streams_, kUnit}, on_device).wait(log_, "FSDP::used_parameters_wait");
    if (!on_device.is_same(flags)) flags.copy_(on_device);
  }
  size_t offset = 0;
  for (FSDPParamGroup* g : reduced) offset += g->apply_used(used.data() + offset);
}

void FSDPTree::drop_iteration_if_no_live_graph() noexcept {
  if (!iteration_.has_live_graph()) drop_iteration();
}

void FSDPTree::drop_iteration() noexcept {
  for (FSDPState* s : units_) s->drop_forward();
  iteration_.reset();
}

void FSDPTree::abandon_iteration(bool keep_open) noexcept {
  reductions_.abandon();
  for (FSDPState* s : units_) s->abandon(keep_open);
  ++backward_count_;
  // Kept open (an error in a later forward), the earlier forward's records
  // stay for its backward.
  if (!keep_open) iteration_.reset();
}

}  // namespace fsdp
