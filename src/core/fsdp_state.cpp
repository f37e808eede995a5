#include "fsdp/core/fsdp_state.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>

#include "fsdp/common/error.h"

namespace fsdp {

FSDPState::FSDPState(std::unique_ptr<FSDPParamGroup> group, const FullyShardOptions& options)
    : group_(std::move(group)),
      options_(options),
      reshard_after_forward_(options.strategy == ShardingStrategy::kFullShard ||
                             options.strategy == ShardingStrategy::kHybridShard) {}

void FSDPState::join_tree(const std::shared_ptr<FSDPTree>& tree, bool is_root) {
  tree_ = tree;
  is_root_ = is_root;
}

void FSDPState::lazy_init_as_root() {
  // A unit called with no tree around it is a root of its own. fully_shard
  // builds the tree when it shards an ancestor; this covers units used alone.
  auto tree = std::make_shared<FSDPTree>();
  tree->states.push_back(this);
  join_tree(tree, true);
}

void FSDPState::begin_iteration() {
  for (FSDPState* s : tree_->states) {
    s->training_state_ = TrainingState::kIdle;
    if (s->group_) s->group_->reset_backward_state();
  }
  tree_->callback_queued = false;
}

void FSDPState::pre_forward() {
  if (!tree_) lazy_init_as_root();
  if (tree_->in_backward) {
    // A forward inside backward (activation checkpointing recomputes a
    // block): the unit was gathered for backward already.
    if (group_) group_->wait_for_unshard();
    return;
  }
  if (is_root_) begin_iteration();
  training_state_ = TrainingState::kForward;
  if (group_) group_->wait_for_unshard();
  if (tree_->recording_order && std::find(tree_->forward_order.begin(), tree_->forward_order.end(), this) ==
                                    tree_->forward_order.end()) {
    tree_->forward_order.push_back(this);
  }
  prefetch(forward_prefetch, +1);
}

void FSDPState::prefetch(const std::vector<FSDPState*>& explicit_list, int direction) {
  if (!explicit_list.empty()) {
    for (FSDPState* s : explicit_list) {
      if (s->group_) s->group_->unshard();
    }
    return;
  }
  if (tree_->recording_order || options_.prefetch_depth <= 0) return;
  const auto& order = tree_->forward_order;
  const auto it = std::find(order.begin(), order.end(), this);
  if (it == order.end()) return;
  auto index = static_cast<int64_t>(it - order.begin());
  for (int k = 1; k <= options_.prefetch_depth; ++k) {
    const int64_t j = index + direction * k;
    if (j < 0 || j >= static_cast<int64_t>(order.size())) break;
    FSDPState* s = order[static_cast<size_t>(j)];
    if (s->group_ && !s->is_root_) s->group_->unshard();
  }
}

at::Tensor FSDPState::cast_input(const at::Tensor& input) const {
  const auto& mp = options_.mixed_precision;
  if (mp.param_dtype && mp.cast_forward_inputs && input.defined() && at::isFloatingType(input.scalar_type()) &&
      input.scalar_type() != *mp.param_dtype) {
    return input.to(*mp.param_dtype);
  }
  return input;
}

void FSDPState::post_forward(std::vector<at::Tensor>& outputs) {
  if (tree_->in_backward) return;
  const bool grad_enabled = at::GradMode::is_enabled();
  if (group_ && reshard_after_forward_ && !is_root_) group_->reshard();
  if (const auto& out_dtype = options_.mixed_precision.output_dtype) {
    for (auto& t : outputs) {
      if (t.defined() && at::isFloatingType(t.scalar_type())) t = t.to(*out_dtype);
    }
  }
  if (grad_enabled) {
    for (auto& t : outputs) {
      if (!t.defined() || !t.requires_grad()) continue;
      t.register_hook([this](const at::Tensor& grad) {
        pre_backward();
        return grad;
      });
    }
  }
  training_state_ = TrainingState::kIdle;
  if (is_root_) {
    tree_->recording_order = false;
    if (!grad_enabled) {
      // Inference: no backward will come to release the units. The root
      // stays gathered, as after every forward: its parameters (an output
      // head, say) are used after its forward returns.
      for (FSDPState* s : tree_->states) {
        if (s->group_ && s != this) s->group_->reshard();
      }
    }
  }
}

void FSDPState::pre_backward() {
  if (training_state_ == TrainingState::kPreBackward) return;
  if (is_root_ && !tree_->callback_queued) {
    tree_->callback_queued = true;
    tree_->in_backward = true;
    auto tree = tree_;
    torch::autograd::Engine::get_default_engine().queue_callback([tree] { end_of_backward(tree); });
  }
  training_state_ = TrainingState::kPreBackward;
  if (group_) group_->wait_for_unshard();
  prefetch(backward_prefetch, -1);
}

void FSDPState::end_of_backward(const std::shared_ptr<FSDPTree>& tree) {
  // Every unit, in the same order on every rank: units whose gradients never
  // all arrived (unused parameters) reduce now, so collectives still match.
  for (FSDPState* s : tree->states) {
    if (s->group_) s->group_->finalize_backward();
    s->training_state_ = TrainingState::kIdle;
  }
  tree->in_backward = false;
}

}  // namespace fsdp
