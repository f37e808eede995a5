#include "core/fsdp_collectives.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "fsdp/common/flat_buffer.h"
#include "fsdp/dist/flight_recorder.h"

#include "core/comm_context.h"

namespace fsdp {

void PendingCollective::wait(CommContext& comm, const char* scope) {
  if (work) {
    RECORD_USER_SCOPE(scope);
    std::optional<dist::Work> w = std::move(work);
    work.reset();
    w->wait();
    comm.mark_waited(event);
  }
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
  input.reset();
  output.reset();
}

PendingCollective all_gather(const UnitComm& on, const at::Tensor& shard, const at::Tensor& gathered) {
  PendingCollective out;
  RECORD_USER_SCOPE("FSDP::all_gather");
  CommContext::StreamScope on_stream(on.comm, CommContext::Stream::kAllGather);
  if (on.group.size() == 1) {
    gathered.copy_(shard);  // the shard is the unit: one pass, casting as it copies
    return out;
  }
  if (gathered.scalar_type() != shard.scalar_type()) {
    out.input.reset(memory::flat_copy(shard, gathered.scalar_type()));
  }
  const at::Tensor& input = out.input.defined() ? out.input.get() : shard;
  out.event = on.comm.record(FSDPEvent::Kind::kAllGather, on.unit, on.group.size());
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
  CommContext::StreamScope on_stream(on.comm, CommContext::Stream::kReduceScatter);
  const at::Tensor& in = input.get();
  out.output.reset(memory::empty_flat(in.numel() / on.group.size(), in.options()));
  out.input = std::move(input);
  out.event = on.comm.record(FSDPEvent::Kind::kReduceScatter, on.unit, on.group.size());
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
  CommContext::StreamScope on_stream(on.comm, CommContext::Stream::kAllReduce);
  out.event = on.comm.record(kind, on.unit, on.group.size());
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
  out.event = on.comm.record(FSDPEvent::Kind::kBroadcast, on.unit, on.group.size());
  out.work = dist::broadcast(on.group, buffer, 0);  // start-up, not a step's traffic: unlabelled
  out.wait(on.comm, "FSDP::broadcast_wait");
}

}  // namespace fsdp
