#pragma once
// `fsdp bench matmul`: this machine's sustained GEMM rate at one training
// step's own matmul shapes, and the step's matmul-limited time (every
// matmul of the step at the rate measured for its shape): the CPU's
// analogue of MFU's denominator.

#include <ostream>
#include <string>
#include <vector>

#include <ATen/core/ScalarType.h>
#include <nlohmann/json_fwd.hpp>

#include "fsdp/plan/memory_model.h"

namespace fsdp::bench {

// C (m x n) = op(A) (m x k) * op(B) (k x n), `count` times per step.
// transpose_a / transpose_b give the operand layouts the step uses
// (a Linear's forward reads its [out, in] weight transposed; the weight
// gradient reads the activations transposed). batch > 1 runs as one
// batched product, as attention's per-head products do.
struct Gemm {
  std::string what;
  int64_t m = 0, k = 0, n = 0;
  int64_t batch = 1;
  bool transpose_a = false, transpose_b = false;
  int64_t count = 0;
  // Also timed as C^T = op(B)^T op(A)^T into padded rows, the faster kept:
  // the head's wide output runs at a different rate each way round.
  bool either_way = false;

  double flops() const { return 2.0 * static_cast<double>(batch * m * k) * static_cast<double>(n); }
};

// The matmuls of one training step on one rank, forward and backward:
// every Linear's three products, the head's, and attention's six per
// (sequence, head) over the whole causal square. With `recompute`
// (activation checkpointing) the blocks' forward products run twice.
std::vector<Gemm> step_gemms(const plan::ModelShape& shape, int64_t batch, int64_t seq_len, bool recompute);

struct GemmTiming {
  Gemm gemm;
  double seconds = 0;       // one product, the best of several bursts
  bool transposed = false;  // either_way, and C^T was the faster
  double flops_per_s() const { return gemm.flops() / seconds; }
};

struct MatmulBenchResult {
  at::ScalarType dtype = at::kFloat;
  int threads = 1;
  std::vector<GemmTiming> rows;
  double step_flops = 0;                                     // sum of count x flops
  double step_seconds = 0;                                   // sum of count x seconds: the matmul-limited step time
  double rate() const { return step_flops / step_seconds; }  // sustained FLOP/s over the step's mix
};

// Times each product with the threads of this process, for at least
// `seconds_per_gemm` in bursts, and keeps the best burst (interference only
// ever slows one).
MatmulBenchResult run_matmul_bench(const std::vector<Gemm>& gemms, at::ScalarType dtype, double seconds_per_gemm);

void print_matmul_bench(const MatmulBenchResult& result, std::ostream& out);
nlohmann::json matmul_bench_json(const MatmulBenchResult& result);

}  // namespace fsdp::bench
