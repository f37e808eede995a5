#include "fsdp/common/host_buffer.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Context.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#ifdef FSDP_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "fsdp/common/compat.h"
#include "fsdp/common/flat_buffer.h"

namespace fsdp::memory {
namespace {

// LibTorch's default CPU allocator under an address of its own: storage
// from here is host memory, whatever device the tensor says (all CPU on a
// CPU-only build). Not the process's counted allocator (flat_buffer.h):
// host memory is not the compute side's, so the trainer's peak of
// allocated bytes leaves it out, as a GPU's allocator would.
class HostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) FSDP_ALLOCATE_CONST override {
    return c10::GetDefaultCPUAllocator()->allocate(nbytes);
  }
  c10::DeleterFnPtr raw_deleter() const override { return c10::GetDefaultCPUAllocator()->raw_deleter(); }
#if FSDP_ALLOCATOR_NEEDS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
};

// Never destroyed: tensors freed during static destruction may reach it.
HostAllocator& host_allocator = *new HostAllocator();

}  // namespace

at::Tensor empty_host(int64_t numel, at::ScalarType dtype, bool pinned) {
  if (pinned && at::hasCUDA()) {
    return at::empty({numel}, at::TensorOptions().dtype(dtype).pinned_memory(true));
  }
  const auto key = c10::computeDispatchKey(dtype, at::kStrided, at::Device(at::kCPU));
  return at::Tensor(
      at::detail::empty_generic({numel}, &host_allocator, c10::DispatchKeySet(key), dtype, c10::nullopt));
}

at::Tensor host_copy(const at::Tensor& t, at::ScalarType dtype, bool pinned) {
  at::Tensor out = empty_host(t.numel(), dtype, pinned);
  // Into pinned memory the copy may run on the device's stream while the
  // host goes on; a pageable target makes it synchronous.
  out.copy_(t.reshape({-1}), /*non_blocking=*/pinned && at::hasCUDA());
  return out;
}

at::Tensor device_copy(const at::Tensor& t, at::ScalarType dtype, const at::Device& device) {
  at::Tensor out = empty_flat(t.numel(), at::TensorOptions().dtype(dtype).device(device));
  out.copy_(t.reshape({-1}), /*non_blocking=*/!device.is_cpu());
  return out;
}

void wait_for_copies(const at::Device& device) {
#ifdef FSDP_WITH_CUDA
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#else
  (void)device;
#endif
}

bool is_host_buffer(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || !t.device().is_cpu()) return false;
  if (t.storage().allocator() == &host_allocator) return true;
  return at::hasCUDA() && t.is_pinned();
}

}  // namespace fsdp::memory
