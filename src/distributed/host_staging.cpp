#include "distributed/host_staging.h"

#include <map>
#include <mutex>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace fsdp::dist {

// [Note: many ranks on one GPU]
// NCCL takes one rank per GPU ("Duplicate GPU detected"), so where more
// ranks of a host than it has GPUs compute on them, World::init picks Gloo
// and the group's collectives go through host memory: the shared-memory
// transport where the members share the host, else Gloo's TCP. Each device
// tensor a collective reads is copied to pinned host memory, and each it
// writes is copied back when the collective is waited for:
//
// - The copies run on a side stream of the device (one per device), which
//   first waits for an event on the current stream, so a copy never reads a
//   tensor before the compute that writes it. The device-to-host copy is
//   waited for on the host before the transport reads the buffer; the copy
//   back is not: the current stream waits for it on the device, so the host
//   moves on while it runs.
// - Device buffers stay owned by the current stream's allocator: nothing is
//   freed or reused before the current stream has waited for the copy.
//   Pinned buffers handed to an asynchronous copy are held by PyTorch's
//   host allocator until the copy's event has passed.
// - The reduction itself runs on the host, in the order and precision of
//   the CPU path, so ranks sharing a GPU compute what ranks on CPUs do.

namespace {

c10::Stream side_stream(const c10::Device& device) {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, c10::Stream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = streams.find(device.index());
  if (found != streams.end()) return found->second;
  const c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream stream = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  streams.emplace(device.index(), stream);
  return stream;
}

c10::Stream current_stream(const c10::Device& device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

// `later` waits on the device for what `earlier` has issued so far.
void order_after(const c10::Stream& earlier, const c10::Stream& later) {
  c10::Event event(earlier.device_type());
  event.record(earlier);
  event.block(later);
}

}  // namespace

at::Tensor stage_to_host(const at::Tensor& t, bool with_values) {
  const bool on_device = !t.is_cpu();
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(on_device));
  if (!with_values) return host;
  if (!on_device) return host.copy_(t);  // a host stand-in (ProcessGroup::stage_host_tensors)
  const c10::Device device = t.device();
  const c10::Stream side = side_stream(device);
  order_after(current_stream(device), side);
  {
    const c10::StreamGuard on_side(side);
    host.copy_(t, /*non_blocking=*/true);
  }
  side.synchronize();
  return host;
}

void unstage_from_host(const at::Tensor& device_tensor, const at::Tensor& host) {
  if (device_tensor.is_cpu()) {
    device_tensor.copy_(host);
    return;
  }
  const c10::Device device = device_tensor.device();
  const c10::Stream side = side_stream(device);
  const c10::Stream current = current_stream(device);
  order_after(current, side);  // nothing issued before still reads the tensor we overwrite
  {
    const c10::StreamGuard on_side(side);
    device_tensor.copy_(host, /*non_blocking=*/true);
  }
  order_after(side, current);
}

}  // namespace fsdp::dist
