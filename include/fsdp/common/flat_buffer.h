#pragma once
// Large CPU buffers: FSDP's flat buffers (unit shards, gathered parameters,
// unsharded gradients, collective staging) and, once the runtime installs
// it, every CPU tensor of 1 MiB or more. See [Note: large CPU buffers] in
// flat_buffer.cpp.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace fsdp::memory {

// A 1-D tensor of `numel` elements from the flat-buffer allocator
// (uninitialised). Its storage stays with that allocator when resized.
at::Tensor empty_flat(int64_t numel, const at::TensorOptions& options);

// A copy of `t`, flattened, in `dtype`, from the flat-buffer allocator.
at::Tensor flat_copy(const at::Tensor& t, at::ScalarType dtype);

// Whether `t`'s storage came from the flat-buffer allocator: a parameter
// whose data lives in one is held by an FSDP unit already.
bool is_flat_buffer(const at::Tensor& t);

// Makes LibTorch's CPU allocator the caching one for large tensors too
// (init_runtime does, unless FSDP_CPU_CACHE=0). Idempotent.
void cache_large_cpu_allocations();

// From now on every CPU tensor's block, large or small, FSDP's flat buffers
// included, is reported to allocation_log.h (installing this allocator
// without its cache when FSDP_CPU_CACHE=0 left it out). Blocks allocated
// before the call are not counted. Idempotent.
void count_cpu_allocations();

// Bytes of large CPU blocks in use, and freed but kept for reuse; handing
// the kept ones back to the system (as CUDA's empty_cache does).
int64_t large_cpu_bytes_in_use();
int64_t cached_cpu_bytes();
void release_cached_cpu_blocks();

}  // namespace fsdp::memory
