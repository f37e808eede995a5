#include "core/comm_context.h"

#include <algorithm>
#include <atomic>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "fsdp/common/error.h"


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
    case FSDPEvent::Kind::kUsedParameters: return "used_parameters";
    case FSDPEvent::Kind::kBroadcast: return "broadcast";
  }
  return "?";
}

CommContext::CommContext() : start_(std::chrono::steady_clock::now()) {}

double CommContext::now_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

namespace {
// Issue order across every log of the process: a tree's log may adopt
// another's without renumbering either.
std::atomic<int64_t> next_event_sequence{0};
}  // namespace

size_t CommContext::record(FSDPEvent::Kind kind, const std::string& unit, int ranks) {
  const bool collective = kind == FSDPEvent::Kind::kAllGather || kind == FSDPEvent::Kind::kReduceScatter ||
                          kind == FSDPEvent::Kind::kAllReduce || kind == FSDPEvent::Kind::kUsedParameters ||
                          kind == FSDPEvent::Kind::kBroadcast;
  FSDPEvent e{kind, unit, next_event_sequence++, now_s(), -1, ranks};
  if (!collective) e.waited_s = e.issued_s;
  if (events_.size() == kMaxEvents) events_.pop_front();
  events_.push_back(std::move(e));
  return static_cast<size_t>(events_.back().sequence);
}

void CommContext::adopt(const CommContext& other, const std::unordered_map<std::string, std::string>& new_names) {
  const double shift = std::chrono::duration<double>(other.start_ - start_).count();
  std::vector<FSDPEvent> merged(events_.begin(), events_.end());
  for (FSDPEvent e : other.events_) {
    const auto renamed = new_names.find(e.unit);
    if (renamed != new_names.end()) e.unit = renamed->second;
    e.issued_s += shift;
    if (e.waited_s >= 0) e.waited_s += shift;
    merged.push_back(std::move(e));
  }
  std::sort(merged.begin(), merged.end(), [](const FSDPEvent& a, const FSDPEvent& b) { return a.sequence < b.sequence; });
  if (merged.size() > kMaxEvents) merged.erase(merged.begin(), merged.end() - kMaxEvents);
  events_.assign(merged.begin(), merged.end());
}

void CommContext::mark_waited(size_t sequence) {
  // The log is in issue order; an entry dropped from its front is not found.
  const auto target = static_cast<int64_t>(sequence);
  const auto it = std::lower_bound(events_.begin(), events_.end(), target,
                                   [](const FSDPEvent& e, int64_t s) { return e.sequence < s; });
  if (it != events_.end() && it->sequence == target) it->waited_s = now_s();
}

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
  synchronize(Stream::kDeviceToHost);
}

// [Note: streams]
// On a GPU each kind of transfer has a stream of its own, as FSDP2 has
// (all_gather_copy_in / all_gather, reduce_scatter, all_reduce), and the
// offload's copies one each way:
//
//   kAllGather      the gather's input (cast, or the offloaded shard's
//                   host-to-device copy) and the collective's issue: the
//                   next unit's gather runs under the current unit's
//                   compute, and c10d makes the compute stream wait for it
//                   only at wait_for_unshard (PendingCollective::wait).
//   kReduceScatter  a unit's reduce-scatter, under the next unit's backward;
//                   its output shard is allocated before the scope (on the
//                   compute stream that reads it), so the caching allocator
//                   never hands it to another stream early.
//   kAllReduce      the replicas' all-reduce after it (HSDP, no_shard).
//   kDeviceToHost   an offloaded unit's reduced gradient copied to the host,
//                   during the next unit's backward; the host waits for the
//                   stream (synchronize) at the end of backward, before the
//                   optimizer or the gradient norm reads a gradient there.
//
// Each scope begins with an event recorded on the stream current at entry
// (the compute stream) and waited on by its own stream, so what it issues
// reads only what was computed before; buffers allocated inside a scope and
// freed after its collective was waited are recorded on the collective's
// stream by c10d. On the CPU, Gloo's threads run the collectives and every
// copy is synchronous: no stream, no event, and the CPU build behaves as
// it did before streams existed.

c10::Stream CommContext::stream(Stream kind, const c10::Device& device) {
  auto& slot = streams_[static_cast<int>(kind)];
  if (!slot || slot->device() != device) {
    const c10::impl::VirtualGuardImpl impl(device.type());
    slot = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/kind != Stream::kDeviceToHost);
  }
  return *slot;
}

CommContext::StreamScope::StreamScope(CommContext& context, Stream stream, const c10::Device& device) {
  if (device.is_cpu()) return;
  const c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream current = impl.getStream(device);
  const c10::Stream own = context.stream(stream, device);
  c10::Event entry(device.type());
  entry.record(current);
  entry.block(own);
  guard_.emplace(own);
}

c10::Stream CommContext::current_stream(const c10::Device& device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

std::shared_ptr<c10::Event> CommContext::mark(Stream stream, const c10::Device& device) {
  if (device.is_cpu()) return nullptr;
  auto done = std::make_shared<c10::Event>(device.type());
  done->record(this->stream(stream, device));
  return done;
}

std::function<void()> CommContext::host_waiter(Stream stream) const {
  const auto& slot = streams_[static_cast<int>(stream)];
  if (!slot) return [] {};
  const c10::Stream s = *slot;
  return [s] { s.synchronize(); };
}

void CommContext::synchronize(Stream stream) {
  const auto& slot = streams_[static_cast<int>(stream)];
  if (slot) slot->synchronize();
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
