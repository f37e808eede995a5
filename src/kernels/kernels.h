#pragma once
// Element loops that ATen runs as several passes (or through temporaries)
// and fsdp.cpp runs as one. They are free of LibTorch so they compile with
// the flags they need (CMakeLists.txt: no errno from sqrt/exp, no implicit
// fused multiply-adds, OpenMP SIMD) and, on x86-64, in one clone per ISA
// level, picked when the program loads. Callers split the work across
// threads; each function handles one range.

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#define FSDP_KERNEL_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FSDP_KERNEL_CLONES
#endif

namespace fsdp::kernels {

// One parameter's slice of the AdamW update, with the constants of its group
// and step already folded in the way torch::optim::AdamW rounds them.
struct AdamWSegment {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t numel;
  float decay;  // 1 - lr * weight_decay (1 without decay)
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bias_correction2_sqrt;
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^step)
};

// Updates elements [begin, end) of one segment in place.
void adamw_update(const AdamWSegment& s, int64_t begin, int64_t end);

// Sum of x[i]^2 over [0, n), squares and sum in double.
double sum_of_squares(const float* x, int64_t n);

// One row of logits in, its cross-entropy loss out (log-sum-exp minus the
// target's logit, in double); the row is overwritten with the loss's
// gradient, (softmax(row) - one_hot(target)) * grad_scale.
double softmax_cross_entropy_row(float* row, int64_t n, int64_t target, float grad_scale);

}  // namespace fsdp::kernels
