#include "core/device_streams.h"

#include <c10/core/impl/VirtualGuardImpl.h>

namespace fsdp {

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

c10::Stream DeviceStreams::stream(Stream kind, const c10::Device& device) {
  auto& slot = streams_[static_cast<int>(kind)];
  if (!slot || slot->device() != device) {
    const c10::impl::VirtualGuardImpl impl(device.type());
    slot = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/kind != Stream::kDeviceToHost);
  }
  return *slot;
}

DeviceStreams::StreamScope::StreamScope(DeviceStreams& streams, Stream stream, const c10::Device& device) {
  if (device.is_cpu()) return;
  const c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream current = impl.getStream(device);
  const c10::Stream own = streams.stream(stream, device);
  c10::Event entry(device.type());
  entry.record(current);
  entry.block(own);
  guard_.emplace(own);
}

c10::Stream DeviceStreams::current_stream(const c10::Device& device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

std::shared_ptr<c10::Event> DeviceStreams::mark(Stream stream, const c10::Device& device) {
  if (device.is_cpu()) return nullptr;
  auto done = std::make_shared<c10::Event>(device.type());
  done->record(this->stream(stream, device));
  return done;
}

std::function<void()> DeviceStreams::host_waiter(Stream stream) const {
  const auto& slot = streams_[static_cast<int>(stream)];
  if (!slot) return [] {};
  const c10::Stream s = *slot;
  return [s] { s.synchronize(); };
}

void DeviceStreams::synchronize(Stream stream) {
  const auto& slot = streams_[static_cast<int>(stream)];
  if (slot) slot->synchronize();
}

}  // namespace fsdp
