#pragma once
// The reduction pipeline of one module tree (FSDP2's FSDPCommContext, its
// reduce-scatter and all-reduce states). Gradients of a unit are
// reduce-scattered across its shard group, then (HSDP, no_shard)
// all-reduced across replicas. At most one reduce-scatter and one replica
// all-reduce are in flight: issuing the next unit's reduction first
// finishes the previous one, which frees its input and staging buffers, so
// backward holds at most two units' gradient and communication buffers
// however deep the model is. What the collectives log goes to the tree's
// EventLog (event_log.h) and which stream they run on to its
// DeviceStreams (device_streams.h): both leaves, below this room.

#include <optional>

#include "core/device_streams.h"
#include "core/gradient_paths.h"

namespace fsdp {

class CommContext {
 public:
  // `streams`: the tree's, whose device-to-host copies drain() waits for.
  explicit CommContext(DeviceStreams& streams) : streams_(streams) {}

  // Starts a unit's reduction (it has staged its gradients), first
  // finishing the one issued before it.
  void reduce(Reduction reduction);
  // Finishes the reductions in flight if one of them is `unit`'s: before
  // a unit gathers again in the backward that reduced it (a recomputation
  // after its post-backward), whose next reduction reuses its buffers.
  void finish(const FSDPParamGroup* unit);
  // End of backward: finishes every reduction still in flight.
  void drain();
  // After an error: finishes what was issued (the peers issued it too),
  // swallowing failures so the caller's own error is the one reported.
  void abandon() noexcept;

 private:
  void finish_reduce_scatter();
  void finish_all_reduce();

  DeviceStreams& streams_;
  std::optional<Reduction> reduce_scatter_in_flight_;
  std::optional<Reduction> all_reduce_in_flight_;
};

}  // namespace fsdp
