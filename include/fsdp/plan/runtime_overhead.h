#pragma once
// The memory a training process holds beyond its tensors (LibTorch's code
// and data, the thread pools, oneDNN's caches), measured on this machine.

#include <cstdint>

namespace fsdp::plan {

// Resident memory of this process minus its live tensors, after one
// forward and backward of a small model (gpt2-tiny) in the compute dtype
// `bf16` or fp32, so that the kernels' libraries are loaded and warm.
int64_t measure_runtime_overhead(bool bf16);

}  // namespace fsdp::plan
