#include "core/comm_context.h"

#include "core/fsdp_param_group.h"

namespace fsdp {

const char* to_string(FSDPEvent::Kind kind) {
  switch (kind) {
    case FSDPEvent::Kind::kAllGather: return "all_gather";
    case FSDPEvent::Kind::kReduceScatter: return "reduce_scatter";
    case FSDPEvent::Kind::kAllReduce: return "all_reduce";
    case FSDPEvent::Kind::kPreForward: return "pre_forward";
    case FSDPEvent::Kind::kPostForward: return "post_forward";
    case FSDPEvent::Kind::kPreBackward: return "pre_backward";
    case FSDPEvent::Kind::kPostBackward: return "post_backward";
  }
  return "?";
}

CommContext::CommContext() : start_(std::chrono::steady_clock::now()) {}

double CommContext::now_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

size_t CommContext::record(FSDPEvent::Kind kind, const std::string& unit, int ranks) {
  const bool collective =
      kind == FSDPEvent::Kind::kAllGather || kind == FSDPEvent::Kind::kReduceScatter || kind == FSDPEvent::Kind::kAllReduce;
  FSDPEvent e{kind, unit, next_sequence_++, now_s(), -1, ranks};
  if (!collective) e.waited_s = e.issued_s;
  if (events_.size() == kMaxEvents) events_.pop_front();
  events_.push_back(std::move(e));
  return static_cast<size_t>(events_.back().sequence);
}

void CommContext::mark_waited(size_t sequence) {
  if (events_.empty()) return;
  const auto first = static_cast<size_t>(events_.front().sequence);
  if (sequence < first || sequence - first >= events_.size()) return;  // dropped from the log already
  events_[sequence - first].waited_s = now_s();
}

// Moves the reduction in flight past its reduce-scatter: frees its input, and
// either assigns its gradients, holds them for a later all-reduce, or starts
// its replica all-reduce (first finishing the all-reduce before it, so at
// most one is in flight).
void CommContext::finish_reduce_scatter() {
  FSDPParamGroup* group = reduce_scatter_in_flight_;
  if (group == nullptr) return;
  reduce_scatter_in_flight_ = nullptr;
  group->wait_reduce_scatter();
  finish_all_reduce();
  if (!group->reduces_across_replicas()) {
    group->assign_gradients();
  } else if (!group->requires_all_reduce()) {
    group->hold_partial_reduction();  // HSDP accumulation: replicas meet at a later sync
  } else {
    group->issue_replica_all_reduce();
    all_reduce_in_flight_ = group;
  }
}

void CommContext::reduce(FSDPParamGroup& group) {
  finish_reduce_scatter();
  group.issue_reduce_scatter();
  reduce_scatter_in_flight_ = &group;
}

void CommContext::finish(const FSDPParamGroup& group) {
  // The reduce-scatter may hand the group on to the all-reduce stage.
  if (reduce_scatter_in_flight_ == &group) finish_reduce_scatter();
  if (all_reduce_in_flight_ == &group) finish_all_reduce();
}

void CommContext::finish_all_reduce() {
  FSDPParamGroup* group = all_reduce_in_flight_;
  if (group == nullptr) return;
  all_reduce_in_flight_ = nullptr;
  group->wait_replica_all_reduce();
  group->assign_gradients();
}

void CommContext::drain() {
  finish_reduce_scatter();
  finish_all_reduce();
}

void CommContext::abandon() noexcept {
  try {
    drain();
  } catch (const std::exception&) {
    reduce_scatter_in_flight_ = nullptr;
    all_reduce_in_flight_ = nullptr;
  }
}

}  // namespace fsdp
