#pragma once
// `fsdp bench kernels`: this project's CPU kernels against the LibTorch
// operators that do the same work, at a training job's shapes, side by
// side in one process: causal attention (forward and backward) against
// at::scaled_dot_product_attention, FusedAdamW against at::_fused_adamw_.
// The ATen side exists from LibTorch 2.0; on 1.13 only ours is timed.

#include <ostream>
#include <string>
#include <vector>

#include "fsdp/plan/memory_model.h"

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
