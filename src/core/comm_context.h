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
// - The device seam: a stream per kind of transfer (all-gather,
//   reduce-scatter, replica all-reduce, and the offload's copies each way),
//   ordered by events as FSDP2 orders its streams ([Note: streams] in
//   comm_context.cpp). On the CPU there are none and every scope is a no-op.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include "fsdp/core/fsdp_event.h"

#include "core/gradient_paths.h"

namespace fsdp {


class CommContext {
 public:
  enum class Stream { kAllGather, kReduceScatter, kAllReduce, kHostToDevice, kDeviceToHost };
  static constexpr int kStreams = 5;
  // Runs what it encloses on this context's stream of that kind on
  // `device`, ordered after the work issued so far on the stream current
  // at entry (an event recorded there, waited on by the stream). No-op on
  // the CPU, where Gloo's own threads run the collectives and copies are
  // synchronous.
  class StreamScope {
   public:
    StreamScope(CommContext& context, Stream stream, const c10::Device& device);
    StreamScope(const StreamScope&) = delete;
    StreamScope& operator=(const StreamScope&) = delete;
    bool on_device() const { return guard_.has_value(); }

   private:
    std::optional<c10::StreamGuard> guard_;
  };
  // The stream current on `device` (inside a scope: the scope's).
  static c10::Stream current_stream(const c10::Device& device);
  // An event recorded on `stream` now (a GPU only), for another stream to
  // wait on later.
  std::shared_ptr<c10::Event> mark(Stream stream, const c10::Device& device);
  // The host waits for what was issued on `stream` so far: device-to-host
  // copies land before the host reads them (no-op where it was never used).
  void synchronize(Stream stream);
  // The same as a function for another thread (a no-op where the stream was
  // never used).
  std::function<void()> host_waiter(Stream stream) const;

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

  // Made at first use, on the first device a scope names (one per process).
  c10::Stream stream(Stream kind, const c10::Device& device);
  std::optional<c10::Stream> streams_[kStreams];

  std::optional<Reduction> reduce_scatter_in_flight_;
  std::optional<Reduction> all_reduce_in_flight_;
  std::deque<FSDPEvent> events_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace fsdp
