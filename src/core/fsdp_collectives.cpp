#include "core/fsdp_collectives.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "fsdp/common/flat_buffer.h"
#include "fsdp/distributed/flight_recorder.h"


namespace fsdp {

void PendingCollective::wait(EventLog& log, const char* scope) {
  if (work) {
    RECORD_USER_SCOPE(scope);
    std::optional<dist::Work> w = std::move(work);
    work.reset();
    w->wait();
    log.mark_waited(event);
  }
  if (copied) {
    const c10::Device device(copied->device_type(), copied->device_index());
    copied->block(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
    copied.reset();
  }
  copied_only = false;
  input.reset();
}

void PendingCollective::abandon() noexcept {
  if (work) {
    try {
      work->wait();
    } catch (const std::exception&) {
    }
    work.reset();
  }
  copied_only = false;
  copied.reset();
  input.reset();
  output.reset();
}

PendingCollective all_gather(const UnitComm& on, const at::Tensor& shard, const at::Tensor& gathered) {
  PendingCollective out;
  RECORD_USER_SCOPE("FSDP::all_gather");
  DeviceStreams::StreamScope on_stream(on.streams, DeviceStreams::Stream::kAllGather, gathered.device());
  if (on.group.size() == 1) {
    // The shard is the unit: one pass, casting as it copies (from the
    // host, an offloaded shard's copy in). On a GPU it is asynchronous, and
    // the compute stream waits for it where it waits for any gather.
    gathered.copy_(shard, /*non_blocking=*/on_stream.on_device());
    if (on_stream.on_device()) out.copied = on.streams.mark(DeviceStreams::Stream::kAllGather, gathered.device());
    out.copied_only = true;
    return out;
  }
  if (gathered.scalar_type() != shard.scalar_type()) {
    out.input.reset(memory::flat_copy(shard, gathered.scalar_type()));
  }
  const at::Tensor& input = out.input.defined() ? out.input.get() : shard;
  out.event = on.log.record(FSDPEvent::Kind::kAllGather, on.unit, on.group.size());
  dist::CollectiveLabel label(on.unit);
  out.work = dist::all_gather_into_tensor(on.group, gathered, input);
  return out;
}

PendingCollective reduce_scatter(const UnitComm& on, CountedTensor input) {
  PendingCollective out;
  if (on.group.size() == 1) {
    out.output = std::move(input);
    return out;
  }
  RECORD_USER_SCOPE("FSDP::reduce_scatter");
  const at::Tensor& in = input.get();
  // Allocated on the stream that will read it ([Note: streams]).
  out.output.reset(memory::empty_flat(in.numel() / on.group.size(), in.options()));
  DeviceStreams::StreamScope on_stream(on.streams, DeviceStreams::Stream::kReduceScatter, in.device());
  out.input = std::move(input);
  out.event = on.log.record(FSDPEvent::Kind::kReduceScatter, on.unit, on.group.size());
  dist::CollectiveLabel label(on.unit);
  out.work = dist::reduce_scatter_tensor(on.group, out.output.get(), out.input.get(),
                                       on.sum ? dist::ReduceOp::kSum : dist::ReduceOp::kAvg);
  return out;
}

namespace {

// An all-reduce in place, logged as `kind` and profiled under `scope`.
// `unit_traffic`: one of a unit's reductions, labelled with the unit in
// the flight recorder, whose labelled totals are the trainer's
// fsdp_collectives and fsdp_comm_mb.
PendingCollective all_reduce_logged(const UnitComm& on, const at::Tensor& buffer, dist::ReduceOp op,
                                    FSDPEvent::Kind kind, const char* scope, bool unit_traffic) {
  PendingCollective out;
  RECORD_USER_SCOPE(scope);
  DeviceStreams::StreamScope on_stream(on.streams, DeviceStreams::Stream::kAllReduce, buffer.device());
  out.event = on.log.record(kind, on.unit, on.group.size());
  std::optional<dist::CollectiveLabel> label;
  if (unit_traffic) label.emplace(on.unit);
  out.work = dist::all_reduce(on.group, buffer, op);
  return out;
}

}  // namespace

PendingCollective all_reduce(const UnitComm& on, const at::Tensor& buffer) {
  return all_reduce_logged(on, buffer, on.sum ? dist::ReduceOp::kSum : dist::ReduceOp::kAvg,
                           FSDPEvent::Kind::kAllReduce, "FSDP::all_reduce", /*unit_traffic=*/true);
}

PendingCollective any_rank(const UnitComm& on, const at::Tensor& flags) {
  // The tree's bookkeeping, not a unit's traffic: unlabelled, as before it
  // was logged here.
  return all_reduce_logged(on, flags, dist::ReduceOp::kMax, FSDPEvent::Kind::kUsedParameters,
                           "FSDP::used_parameters", /*unit_traffic=*/false);
}

void broadcast_from_rank0(const UnitComm& on, const at::Tensor& buffer) {
  if (on.group.size() == 1) return;
  PendingCollective out;
  RECORD_USER_SCOPE("FSDP::broadcast");
  out.event = on.log.record(FSDPEvent::Kind::kBroadcast, on.unit, on.group.size());
  out.work = dist::broadcast(on.group, buffer, 0);  // start-up, not a step's traffic: unlabelled
  out.wait(on.log, "FSDP::broadcast_wait");
}

}  // namespace fsdp
