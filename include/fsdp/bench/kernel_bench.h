#pragma once
// `fsdp bench kernels`: this project's CPU kernels against the LibTorch
// operators that do the same work, at a training job's shapes, side by
// side in one process: causal attention (forward and backward) against
// at::scaled_dot_product_attention, FusedAdamW against at::_fused_adamw_.
// The ATen side needs LibTorch 2.5 (scaled_dot_product_attention's
// enable_gqa; the CPU _fused_adamw_ is 2.4's); before it only ours is timed.

#include <ostream>
#include <string>
#include <vector>

#include "fsdp/common/compat.h"
#include "fsdp/plan/memory_model.h"

#define FSDP_BENCH_HAS_ATEN_KERNELS (FSDP_TORCH_VERSION >= 205)

namespace fsdp::bench {

struct KernelTiming {
  std::string kernel;         // what is timed, per step of the job
  double ours_s = 0;          // per training step: every layer's calls
  double aten_s = -1;         // the same with LibTorch's operator; -1 where it has none
  std::string aten_operator;  // its name
};

std::vector<KernelTiming> run_kernel_bench(const plan::ModelShape& shape, int64_t batch, int64_t seq_len,
                                           double seconds_per_kernel);

void print_kernel_bench(const std::vector<KernelTiming>& rows, std::ostream& out);

}  // namespace fsdp::bench
