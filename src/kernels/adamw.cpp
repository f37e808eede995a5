#include <cmath>

#include "kernels.h"

namespace fsdp::kernels {

// Each element is read once and written once: parameter, both moments, and
// the gradient read. The arithmetic is torch::optim::AdamW's in its order
// and float rounding: decay first; both moments with the fused
// multiply-adds of ATen's vectorised add_ and addcmul_; sqrt(v) divided by
// the bias correction's root, plus eps. A clipping factor scales the
// gradient as it is read, rounded as the in-place multiply would round it. On this project's machines the
// result is bit-equal to torch's (tests/optim/fused_adamw_test.cpp).
FSDP_KERNEL_CLONES
void adamw_update(const AdamWSegment& s, int64_t begin, int64_t end) {
  float* __restrict p = s.param;
  const float* __restrict g = s.grad;
  float* __restrict m = s.exp_avg;
  float* __restrict v = s.exp_avg_sq;
  const float decay = s.decay, beta1 = s.beta1, one_minus_beta1 = s.one_minus_beta1, beta2 = s.beta2,
              one_minus_beta2 = s.one_minus_beta2, root = s.bias_correction2_sqrt, eps = s.eps,
              neg_step = s.neg_step_size, grad_scale = s.grad_scale;
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const float gi = g[i] * grad_scale;  // as grad.mul_(scale) would leave it; exact for 1
    const float mi = std::fma(gi, one_minus_beta1, m[i] * beta1);
    const float vi = std::fma(one_minus_beta2 * gi, gi, v[i] * beta2);
    const float denom = std::sqrt(vi) / root + eps;
    p[i] = p[i] * decay + neg_step * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace fsdp::kernels
