#include "core/comm_context.h"

#include <exception>

namespace fsdp {

// Moves the reduction in flight past its reduce-scatter: frees its input, and
// either assigns its gradients, holds them for a later all-reduce, or starts
// its replica all-reduce (first finishing the all-reduce before it, so at
// most one is in flight).
void CommContext::finish_reduce_scatter() {
  if (!reduce_scatter_in_flight_) return;
  Reduction reduction = std::move(*reduce_scatter_in_flight_);
  reduce_scatter_in_flight_.reset();
  reduction.wait_reduce_scatter();
  finish_all_reduce();
  if (reduction.hand_on()) all_reduce_in_flight_.emplace(std::move(reduction));
}

void CommContext::finish_all_reduce() {
  if (!all_reduce_in_flight_) return;
  Reduction reduction = std::move(*all_reduce_in_flight_);
  all_reduce_in_flight_.reset();
  reduction.finish_all_reduce();
}

void CommContext::reduce(Reduction reduction) {
  finish_reduce_scatter();
  reduction.issue_reduce_scatter();
  reduce_scatter_in_flight_.emplace(std::move(reduction));
}

void CommContext::finish(const FSDPParamGroup* unit) {
  // The reduce-scatter may hand the unit on to the all-reduce stage.
  if (reduce_scatter_in_flight_ && reduce_scatter_in_flight_->unit() == unit) finish_reduce_scatter();
  if (all_reduce_in_flight_ && all_reduce_in_flight_->unit() == unit) finish_all_reduce();
}

void CommContext::drain() {
  finish_reduce_scatter();
  finish_all_reduce();
  // Offloaded gradients are read on the host next ([Note: streams]).
  streams_.synchronize(DeviceStreams::Stream::kDeviceToHost);
}

void CommContext::abandon() noexcept {
  try {
    drain();
  } catch (const std::exception&) {
    reduce_scatter_in_flight_.reset();
    all_reduce_in_flight_.reset();
  }
}

}  // namespace fsdp
