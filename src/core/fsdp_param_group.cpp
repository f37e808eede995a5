#include "core/fsdp_param_group.h"

#include <algorithm>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "fsdp/common/compat.h"
#include "fsdp/common/flat_buffer.h"

#include "core/autograd_hooks.h"
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
// [Note: when a unit's backward ends] in fsdp_tree.cpp) the unit is
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


bool FSDPParam::requires_grad() const { return param.requires_grad(); }

// [Note: a unit of several dtypes]
// A unit may hold parameters of several dtypes: fp32 norms beside bf16
// matrices, a frozen bf16 base beside fp32 adapters. Each dtype gets a flat
// shard of its own (its layout, padding, gathered buffer and gradient path),
// so every collective still moves one dtype and the one-dtype machinery is
// used unchanged. Mixed precision applies to each: with a param dtype every
// shard is gathered in it (casting those not already in it); without one,
// each is gathered in its own dtype. Gradients are reduced in the policy's
// reduce dtype, or else in the dtype they were gathered in, and handed to
// the optimizer in each parameter's own dtype. A dtype none of whose
// parameters is trainable has no gradient path at all: a frozen bf16 base
// costs one all-gather per use and no reduction. The price of the split is
// one collective per dtype instead of one per unit; FSDP2 instead gathers
// one byte buffer, which saves the extra all-gather but still needs a
// reduction per dtype.
bool FSDPParamGroup::DtypeShard::trainable() const {
  const auto& ps = shard->params();
  return std::any_of(ps.begin(), ps.end(), [](const FSDPParam& p) { return p.requires_grad(); });
}

FSDPParamGroup::FSDPParamGroup(std::vector<FSDPParam> params, const dist::DeviceMesh& mesh,
                               const FullyShardOptions& options, const TreeComm& startup)
    : mesh_(options.mesh) {
  // One flat shard per dtype and layout (flat, or placed: [Note:
  // per-parameter placements] in flat_shard.cpp), in order of first use.
  using Kind = std::tuple<at::ScalarType, bool, bool>;
  const auto kind_of = [](const FSDPParam& p) {
    return Kind{p.param.scalar_type(), p.shard_dim >= 0, p.full_precision};
  };
  std::vector<Kind> kinds;
  for (const auto& p : params) {
    if (std::find(kinds.begin(), kinds.end(), kind_of(p)) == kinds.end()) kinds.push_back(kind_of(p));
  }
  for (const Kind& kind : kinds) {
    std::vector<FSDPParam> of_dtype;
    for (auto& p : params) {
      if (!p.param.defined() || kind_of(p) != kind) continue;
      of_dtype.push_back(std::move(p));
    }
    DtypeShard part;
    part.shard = std::make_unique<FlatShard>(std::move(of_dtype), mesh, options, startup);
    part.flow = make_gradient_flow(*part.shard);
    parts_.push_back(std::move(part));
  }
  for (auto& part : parts_) {
    for (auto& p : part.shard->params()) params_.push_back(&p);
  }
  used_.assign(params_.size(), 0);
}

void FSDPParamGroup::attach(const TreeComm& comm, CommContext* reductions, const std::string* unit_name) {
  comm_.emplace(comm);
  reductions_ = reductions;
  name_ = unit_name;
}

UnitComm FSDPParamGroup::on(dist::ProcessGroup& group) const { return UnitComm{group, comm_->log, comm_->streams, *name_}; }

UnitComm FSDPParamGroup::reducing_on(dist::ProcessGroup& group) const {
  UnitComm comm = on(group);
  comm.sum = settings_.gradient_divide_factor.has_value();
  return comm;
}

bool FSDPParamGroup::has_trainable_params() const {
  return std::any_of(params_.begin(), params_.end(), [](const FSDPParam* p) { return p->requires_grad(); });
}

bool FSDPParamGroup::gather_in_flight() const {
  return std::any_of(parts_.begin(), parts_.end(), [](const DtypeShard& d) { return d.shard->gather_in_flight(); });
}

void FSDPParamGroup::unshard() {
  if (state_ == ShardedState::kUnsharded || gather_in_flight()) return;
  for (auto& part : parts_) part.shard->start_gather(on(shard_group()));
}

void FSDPParamGroup::finish_all_gather() {
  for (auto& part : parts_) part.shard->finish_gather(comm_->log);
}

// [Note: resharding to fewer ranks]
// reshard_after_forward = k keeps, between a unit's forward and its
// backward, 1/k of the gathered buffer on each rank instead of 1/W: rank
// j of each group of k consecutive ranks (of the shard group) keeps the
// buffer's j-th k-th. The buffer is padded to a multiple of W, so of k
// too, and the k parts laid end to end are the buffer: backward's gather
// is an all-gather inside the group, from the kept parts, in the gathered
// dtype (no cast). Any reshard before that (a no-grad forward, an error, a
// unit that did not run backward) drops the kept part, and the next gather
// is the full one from the shards: slower, never wrong.
void FSDPParamGroup::reshard_to(int ranks) {
  dist::ProcessGroup& within = mesh_->shard_subgroup(ranks);
  if (state_ != ShardedState::kUnsharded || within.size() == shard_group().size()) {
    reshard();
    return;
  }
  std::vector<at::Tensor> kept;
  for (const auto& part : parts_) kept.push_back(part.shard->copy_of_part(ranks, within.rank()));
  reshard();
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (kept[i].defined()) parts_[i].shard->keep_part(kept[i], within);
  }
}

void FSDPParamGroup::wait_for_unshard() {
  if (state_ == ShardedState::kUnsharded) return;
  unshard();  // no-op when prefetched
  finish_all_gather();
  for (auto& part : parts_) {
    for (auto& p : part.shard->params()) {
      p.param.set_data(part.shard->gathered_view(p));
      part.flow->on_unsharded(p);
    }
  }
  register_grad_hooks();
  state_ = ShardedState::kUnsharded;
  ++epoch_;
}

void FSDPParamGroup::reshard() {
  if (gather_in_flight()) ++epoch_;  // a pending gather dropped
  finish_all_gather();  // prefetched but never used: finish before freeing
  if (state_ == ShardedState::kUnsharded) {
    ++epoch_;
    for (auto& part : parts_) {
      for (auto& p : part.shard->params()) {
        p.param.set_data(part.shard->sharded_view(p));
        part.flow->on_resharded(p);
      }
    }
    state_ = ShardedState::kSharded;
  }
  for (auto& part : parts_) part.shard->free_gathered();
}

void FSDPParamGroup::register_grad_hooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    FSDPParam& p = *params_[i];
    if (!p.requires_grad()) continue;
    // Before AccumulateGrad adds into the gradient, a stand-in left by
    // unshard is settled first, for a parameter used outside its unit's
    // forward, whose gradient can arrive before the unit's pre-backward
    // ([Note: zero_grad between forward and backward]); after it, the
    // parameter is marked used.
    std::weak_ptr<FSDPParamGroup> self = weak_from_this();
    hook_grad_accumulator(
        p.param, p.grad_accumulator,
        [self, i] {
          if (auto group = self.lock()) settle_stashed_gradient(*group->params_[i]);
        },
        [self, i] {
          if (auto group = self.lock()) group->mark_used(i);
        });
  }
}

void FSDPParamGroup::prepare_gradients(bool in_backward) {
  if (state_ != ShardedState::kUnsharded) return;
  for (auto& part : parts_) {
    if (part.trainable()) part.flow->prepare(in_backward);
  }
}

void FSDPParamGroup::post_backward() {
  RECORD_USER_SCOPE("FSDP::post_backward");
  if (!has_trainable_params()) {
    reshard();
    return;
  }
  const bool sync = settings_.requires_gradient_sync;
  bool may_stay_gathered = true;
  for (auto& part : parts_) {
    if (!part.trainable()) continue;
    part.flow->collect(state_ == ShardedState::kUnsharded);
    may_stay_gathered = may_stay_gathered && part.flow->may_stay_gathered();
  }
  // Kept gathered for the next micro-step's forward only: a backward that
  // syncs hands sharded gradients to sharded parameters.
  if (!may_stay_gathered || settings_.reshard_after_backward || sync) reshard();
  std::vector<GradientFlow*> flows;
  for (auto& part : parts_) {
    if (!part.trainable()) continue;
    part.flow->stage(sync);
    flows.push_back(part.flow.get());
  }
  // A held reduction (HSDP without all-reduce) is accumulation too: which
  // parameters got gradients is kept for the window, and decided at the sync.
  accumulating_ = !sync || holds_reduction();
  if (!sync) return;
  reduced_this_backward_ = !holds_reduction();
  const Reduction::Then then = !reduces_across_replicas() ? Reduction::Then::kAssign
                               : holds_reduction()        ? Reduction::Then::kHold
                                                          : Reduction::Then::kAllReduce;
  reductions_->reduce(Reduction(this, std::move(flows), reducing_on(shard_group()), reducing_on(replicate_group()), then,
                          settings_));
}

template <typename Fn>
int64_t FSDPParamGroup::sum_over_shards(Fn&& of) const {
  int64_t total = 0;
  for (const auto& part : parts_) total += of(*part.shard);
  return total;
}

int64_t FSDPParamGroup::sharded_param_bytes() const {
  return sum_over_shards([](const FlatShard& s) { return s.sharded_bytes(); });
}
int64_t FSDPParamGroup::host_param_bytes() const {
  return sum_over_shards([](const FlatShard& s) { return s.offloaded() ? s.sharded_bytes() : 0; });
}
int64_t FSDPParamGroup::unsharded_bytes_held() const {
  return sum_over_shards([](const FlatShard& s) { return s.gathered_bytes_held(); });
}
int64_t FSDPParamGroup::flat_numel() const {
  return sum_over_shards([](const FlatShard& s) { return s.padded_numel(); });
}
int64_t FSDPParamGroup::gathered_bytes() const {
  return sum_over_shards([](const FlatShard& s) { return s.gather_bytes_in_flight(); });
}
int64_t FSDPParamGroup::reduction_bytes() const {
  return sum_over_shards([](const FlatShard& s) { return s.reduction_bytes(); });
}

bool FSDPParamGroup::reduces_across_replicas() const { return replicate_group().size() > 1; }

bool FSDPParamGroup::holds_reduction() const { return reduces_across_replicas() && !settings_.requires_all_reduce; }

void FSDPParamGroup::leave_in_place_path() {
  const bool in_place = std::any_of(parts_.begin(), parts_.end(),
                                    [](const DtypeShard& d) { return d.flow->path() == GradientPath::kInPlace; });
  if (!in_place) return;
  if (reductions_ != nullptr) reductions_->finish(this);  // a reduction in flight ends on the path that issued it
  reshard();
  for (auto& part : parts_) part.flow = leave_in_place(std::move(part.flow), *part.shard);
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
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i]->requires_grad()) out.push_back(used_[i]);
  }
}

size_t FSDPParamGroup::apply_used(const uint8_t* used_anywhere) {
  size_t k = 0;
  for (FSDPParam* p : params_) {
    if (!p->requires_grad()) continue;
    if (used_anywhere[k++] == 0 && !p->grad_existed_before) p->param.mutable_grad() = at::Tensor();
  }
  std::fill(used_.begin(), used_.end(), 0);
  return k;
}

void FSDPParamGroup::begin_iteration() {
  if (!accumulating_) {
    for (FSDPParam* p : params_) p->grad_existence_recorded = false;
  }
}

void FSDPParamGroup::end_backward() {
  reduced_this_backward_ = false;
  begin_iteration();  // the same rule: a window of accumulation keeps its records
}

void FSDPParamGroup::drop_forward() noexcept {
  for (auto& part : parts_) part.flow->drop_backward();
  try {
    reshard();  // finishes a prefetched gather, puts the stashed sharded gradients back
  } catch (const std::exception&) {
    for (auto& part : parts_) part.shard->abandon_gather(comm_->log);
  }
}

void FSDPParamGroup::abandon() noexcept {
  for (auto& part : parts_) {
    part.shard->abandon_gather(comm_->log);
    part.flow->abandon();
  }
  try {  // partial full-shape gradients give way to the sharded ones from before
    reshard();
  } catch (const std::exception&) {
  }
  std::fill(used_.begin(), used_.end(), 0);
  end_backward();
}

}  // namespace fsdp
