#pragma once
// Host memory for state offloaded from the compute device (CPU offload of
// FSDP units, the optimizer's offloaded state). On a GPU it is page-locked
// when asked, so copies to and from the device run asynchronously. On a
// CPU-only build the host and the compute device are the same memory, and
// these buffers are still separate storage from a recognisable allocator:
// an offloaded tensor is never an alias of a compute-side one, so a
// missing copy shows as a wrong number, and the accounting can tell the
// two sides apart (is_host_buffer) where their device cannot.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace fsdp::memory {

// A 1-D host tensor of `numel` elements (uninitialised). `pinned`:
// page-locked, taken only where a GPU is present.
at::Tensor empty_host(int64_t numel, at::ScalarType dtype, bool pinned);

// A copy of `t`, flattened, in `dtype`, on the host: the device-to-host
// copy of an offloaded gradient. Asynchronous into pinned memory; the
// copy is complete once the stream it was issued on has finished.
at::Tensor host_copy(const at::Tensor& t, at::ScalarType dtype, bool pinned);

// A copy of a host tensor `t`, flattened, in `dtype`, on `device` (the
// compute side), from the flat-buffer allocator: the host-to-device copy
// that starts an offloaded unit's gather.
at::Tensor device_copy(const at::Tensor& t, at::ScalarType dtype, const at::Device& device);

// Waits until copies issued to or from `device` asynchronously (host_copy,
// device_copy) have landed, before the host reads what they wrote. Nothing
// to wait for on the CPU.
void wait_for_copies(const at::Device& device);

// Whether `t`'s storage is host memory of this file's: on a CPU-only build
// by its allocator, with a GPU by being in CPU memory while the compute
// device is not.
bool is_host_buffer(const at::Tensor& t);

}  // namespace fsdp::memory
