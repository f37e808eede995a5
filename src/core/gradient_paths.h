#pragma once
// How a unit's gradients travel from autograd to the optimizer: one class
// per path, decided once at sharding (see [Note: gradients in place] in
// gradient_paths.cpp for what each step does on each path). Each owns its
// gradient buffers and the records of its reductions; the group calls
// them at its hooks, and a Reduction at its pipeline's stages.

#include <memory>
#include <optional>
#include <vector>

#include "fsdp/core/options.h"

#include "core/flat_shard.h"
#include "core/fsdp_collectives.h"

namespace fsdp {

class FSDPParamGroup;

enum class GradientPath {
  // One rank per shard group, no cast anywhere: parameters and gradients
  // are views of persistent flat buffers in both states; autograd adds into
  // them; only replicas communicate (an all-reduce).
  kInPlace,
  // One rank per shard group, gradients reduced in another dtype: the
  // parameters alias their shard (no gather), gradients go through a flat
  // buffer that is cast and handed over as the reduced shard.
  kAliasedShard,
  // A gathered buffer per unshard, a flat gradient buffer per backward, a
  // reduce-scatter (and an all-reduce across replicas).
  kGathered,
};
const char* to_string(GradientPath path);

// The run-time knobs the reduction reads (FSDP2's setters of the same names).
struct ReductionSettings {
  bool requires_gradient_sync = true;
  bool requires_all_reduce = true;     // HSDP: all-reduce across replicas on sync
  bool reshard_after_backward = true;  // false: stays gathered after a backward that does not sync
  // Gradients are summed across ranks and divided by this instead of the
  // number of ranks (token-normalised losses); unset: averaged.
  std::optional<double> gradient_divide_factor;
  ReducedGradHook reduced_grad_hook;
  GradientsReadyHook gradients_ready_hook;
};

// Settles a gradient set aside at unshard against what the program did to
// the stand-in since: kept, zeroed, set to none or replaced. Called before
// anything reads or accumulates into the parameter's gradient.
void settle_stashed_gradient(FSDPParam& p);

class GradientFlow {
 public:
  virtual ~GradientFlow() = default;
  virtual GradientPath path() const = 0;

  // The parameter now points at its gathered form (at its shard): its
  // gradient follows it there.
  virtual void on_unsharded(FSDPParam& p) = 0;
  virtual void on_resharded(FSDPParam& p) = 0;
  // On a gathered unit with trainable parameters: gradients become views of
  // the buffer autograd accumulates into. Called when the backward starts
  // (`in_backward`), and before, after the forward of a unit that stays
  // gathered; what a gradient was before this backward is read at the first.
  virtual void prepare(bool in_backward) = 0;

  // Post-backward, in this order. Before the unit reshards (`unsharded`:
  // it is gathered now): gradients autograd left outside the buffer are
  // collected into it.
  virtual void collect(bool unsharded) = 0;
  // Whether the unit may stay gathered after a backward without sync.
  virtual bool may_stay_gathered() const = 0;
  // After any reshard: this backward's gradients join those kept from
  // micro-steps without sync and, with `sync`, wait to be reduced.
  virtual void stage(bool sync) = 0;

  // The reduction's stages, run by CommContext's Reduction, each only where
  // its Reduction::Then needs it: the reduce-scatter is issued and waited
  // (no-ops on the in-place path, whose gradients are its buffer already);
  // then either the gradients are assigned (kAssign), the partial
  // reduction held (kHold), or the all-reduce across replicas issued,
  // waited and the gradients assigned (kAllReduce).
  virtual void issue_reduce_scatter(const UnitComm& on) = 0;
  virtual void wait_reduce_scatter(EventLog& log) = 0;
  // HSDP without requires_all_reduce: this backward's reduce-scatter output
  // is kept and added to the next one's before its all-reduce.
  virtual void hold_partial_reduction() = 0;
  virtual void issue_all_reduce(const UnitComm& on) = 0;
  virtual void wait_all_reduce(EventLog& log) = 0;
  // The reduced gradients handed to the parameters (divided by the divide
  // factor, when one is set: the collectives summed).
  // An offloaded shard's copy to the host runs on the tree's stream for it.
  virtual void assign(const ReductionSettings& settings, DeviceStreams& streams) = 0;

  // The trainable parameters whose gradients this path assigns.
  virtual void append_trainable(std::vector<at::Tensor>& out) const = 0;

  // A forward whose graph was dropped: its gradient buffer goes, the
  // gradients of earlier iterations stay.
  virtual void drop_backward() noexcept = 0;
  // After an error: reductions in flight finished, this backward's partial
  // gradients dropped.
  virtual void abandon() noexcept = 0;
};

// One backward's reduction of one unit's gradients, handed by the unit to
// CommContext's pipeline as a value: the gradient paths it covers (one per
// dtype with trainable parameters), where its collectives run, and what
// follows its reduce-scatter. CommContext runs its stages in order, and the
// unit does not hear of it again.
class Reduction {
 public:
  enum class Then {
    kAssign,     // no replicas: the reduce-scatter's output is the gradient
    kHold,       // HSDP without requires_all_reduce: kept for a later sync
    kAllReduce,  // HSDP, no_shard: all-reduced across the replicas, then assigned
  };
  // `settings` are read when the gradients are assigned, and outlive the
  // reduction (a unit finishes its reduction before they change).
  Reduction(const FSDPParamGroup* unit, std::vector<GradientFlow*> flows, UnitComm within_shard,
            UnitComm across_replicas, Then then, const ReductionSettings& settings);

  // Whose reduction it is (CommContext::finish).
  const FSDPParamGroup* unit() const { return unit_; }
  void issue_reduce_scatter();
  void wait_reduce_scatter();
  // After the wait: assigns or holds the gradients, or issues the
  // all-reduce across replicas and returns true (still in flight).
  bool hand_on();
  // Waits for that all-reduce and assigns the gradients.
  void finish_all_reduce();

 private:
  // After the gradients are assigned: the settings' gradients_ready_hook.
  void tell_ready(DeviceStreams& streams) const;

  const FSDPParamGroup* unit_;
  std::vector<GradientFlow*> flows_;
  UnitComm within_shard_;
  UnitComm across_replicas_;
  Then then_;
  const ReductionSettings* settings_;
};

// The path `shard` allows: in place when nothing is gathered or cast.
std::unique_ptr<GradientFlow> make_gradient_flow(FlatShard& shard);
// Off the in-place path (before a divide factor or a reduced-gradient hook
// is set): the unit must be sharded; gradients get memory of their own.
std::unique_ptr<GradientFlow> leave_in_place(std::unique_ptr<GradientFlow> flow, FlatShard& shard);

}  // namespace fsdp
