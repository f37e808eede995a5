#include <cmath>
#include <cstring>
#include <limits>

#include "kernels.h"

namespace fsdp::kernels {
namespace {

// e^x for x <= 0 (Cephes' expf: round x / ln 2 to n, a degree-6 polynomial
// on the remainder, times 2^n by exponent arithmetic), within 2 ulp, in a
// form the compiler vectorises. Below -87.3 the result would be subnormal:
// it is 0, as with denormals flushed.
inline float exp_nonpositive(float x) {
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  const float r2 = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r2 + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < -87.3f ? 0.0f : y * scale;
}

}  // namespace

FSDP_KERNEL_CLONES
double softmax_cross_entropy_row(float* row, int64_t n, int64_t target, float grad_scale) {
  float max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max)
  for (int64_t i = 0; i < n; ++i) max = row[i] > max ? row[i] : max;
  const float target_logit = row[target];
  double sum = 0;  // 50,000 terms: a float sum would lose the loss's 6th digit
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    const float e = exp_nonpositive(row[i] - max);
    row[i] = e;
    sum += e;
  }
  const auto to_gradient = static_cast<float>(grad_scale / sum);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) row[i] *= to_gradient;
  row[target] -= grad_scale;
  return static_cast<double>(max) + std::log(sum) - static_cast<double>(target_logit);
}

}  // namespace fsdp::kernels
