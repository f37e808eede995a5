#pragma once
// Where one module tree's FSDP collectives are issued, ordered and recorded
// (FSDP2's FSDPCommContext). Three jobs:
//
// - The reduction pipeline. Gradients of a unit are reduce-scattered across
//   its shard group, then (HSDP, no_shard) all-reduced across replicas. At
//   most one reduce-scatter and one replica all-reduce are in flight: issuing
//   the next unit's reduction first finishes the previous one, which frees its
//   input and staging buffers, so backward holds at most two units' gradient
//   and communication buffers however deep the model is.
// - The event log: every collective issued and waited, and every unit's
//   compute boundaries, in order, for tests (was unit i+1 gathered before unit
//   i finished?) and telemetry.
// - The device seam. Streams and events belong here; on CPU there are none,
//   so StreamScope is empty. A CUDA build gives each collective kind its own
//   stream here without touching the state machine.

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "fsdp/core/fsdp_event.h"

#include "core/gradient_paths.h"

namespace fsdp {


class CommContext {
 public:
  enum class Stream { kAllGather, kReduceScatter, kAllReduce };
  // Runs what it encloses on `stream` (ordered after the compute issued so
  // far). No-op on CPU, where Gloo's own threads run the collectives.
  class StreamScope {
   public:
    StreamScope(CommContext& /*context*/, Stream /*stream*/) {}
  };

  CommContext();

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

  // Event log, bounded to the last kMaxEvents entries.
  static constexpr size_t kMaxEvents = 8192;
  size_t record(FSDPEvent::Kind kind, const std::string& unit, int ranks = 0);
  void mark_waited(size_t sequence);
  std::vector<FSDPEvent> events() const { return {events_.begin(), events_.end()}; }
  void clear_events() { events_.clear(); }
  // The root of an earlier tree joins this context's: the events its tree
  // logged (its start-up broadcasts above all) join this log in issue
  // order, each unit's under the name it has from here (`new_names`, by
  // the name it had there). Sequence numbers are the process's, so an
  // event still in flight is marked waited where it now lies.
  void adopt(const CommContext& other, const std::unordered_map<std::string, std::string>& new_names);

 private:
  void finish_reduce_scatter();
  void finish_all_reduce();
  double now_s() const;

  std::optional<Reduction> reduce_scatter_in_flight_;
  std::optional<Reduction> all_reduce_in_flight_;
  std::deque<FSDPEvent> events_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace fsdp
