#include <cmath>
#include <limits>

#include "kernels.h"

namespace fsdp::kernels {
namespace {

// e^x for x <= 0 (Cephes' expf: round x / ln 2 to n, a degree-6 polynomial
// on the remainder, times 2^n by exponent arithmetic), within 2 ulp, in a
// form the compiler vectorises. x is clamped at -87 (e^-87 = 1.6e-38, the
// smallest normal float's order), so 2^n stays a normal number.
inline float exp_nonpositive(float x) {
  x = x > -87.0f ? x : -87.0f;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // rounded to nearest
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
  return y * __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
}

}  // namespace

FSDP_KERNEL_CLONES
double softmax_cross_entropy_row(float* row, int64_t n, int64_t target, float grad_scale) {
  float max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max)
  for (int64_t i = 0; i < n; ++i) max = row[i] > max ? row[i] : max;
  const float target_logit = row[target];
  // Float sums of 512 terms (vectorised), added up in double: a plain
  // float sum of 50,000 terms would lose the loss's sixth digit.
  constexpr int64_t kBlock = 512;
  double sum = 0;
  for (int64_t block = 0; block < n; block += kBlock) {
    const int64_t stop = block + kBlock < n ? block + kBlock : n;
    float part = 0;
#pragma omp simd reduction(+ : part)
    for (int64_t i = block; i < stop; ++i) {
      const float e = exp_nonpositive(row[i] - max);
      row[i] = e;
      part += e;
    }
    sum += part;
  }
  const auto to_gradient = static_cast<float>(grad_scale / sum);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) row[i] *= to_gradient;
  row[target] -= grad_scale;
  return static_cast<double>(max) + std::log(sum) - static_cast<double>(target_logit);
}

}  // namespace fsdp::kernels
