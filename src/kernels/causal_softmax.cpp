#include <limits>

#include "float_math.h"
#include "kernels.h"

namespace fsdp::kernels {

// Rows are short (a query sees i + 1 keys), so a loop's scalar remainder,
// up to 15 exponentials one at a time, cost more than its vector part: at
// T = 256 the row took 1.1 ns an element, at T = 64 2.9. The last partial
// 16 go through a padded copy instead, so every exponential runs in a
// whole vector (the padding's set to 0 after).
constexpr int64_t kLanes = 16;
constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

FSDP_KERNEL_CLONES
void causal_softmax_row(float* row, int64_t count, int64_t n, float scale) {
  const int64_t whole = count / kLanes * kLanes;
  float tail[kLanes];
#pragma omp simd
  for (int64_t j = 0; j < kLanes; ++j) tail[j] = whole + j < count ? row[whole + j] : kMinusInfinity;
  float max = kMinusInfinity;
#pragma omp simd reduction(max : max)
  for (int64_t j = 0; j < whole; ++j) max = row[j] > max ? row[j] : max;
#pragma omp simd reduction(max : max)
  for (int64_t j = 0; j < kLanes; ++j) max = tail[j] > max ? tail[j] : max;
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < whole; ++j) {
    const float e = exp_nonpositive((row[j] - max) * scale);
    row[j] = e;
    sum += e;
  }
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < kLanes; ++j) {
    const float e = whole + j < count ? exp_nonpositive((tail[j] - max) * scale) : 0.0f;
    tail[j] = e;
    sum += e;
  }
  const float inverse = 1.0f / sum;
#pragma omp simd
  for (int64_t j = 0; j < whole; ++j) row[j] *= inverse;
  for (int64_t j = whole; j < count; ++j) row[j] = tail[j - whole] * inverse;
  for (int64_t j = count; j < n; ++j) row[j] = 0;
}

FSDP_KERNEL_CLONES
void causal_softmax_backward_row(const float* p, float* dp, int64_t count, int64_t n, float scale) {
  float dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < count; ++j) dot += p[j] * dp[j];
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) dp[j] = scale * (p[j] * (dp[j] - dot));
  for (int64_t j = count; j < n; ++j) dp[j] = 0;
}

// bf16 rows go through a float scratch row (in cache) and are rounded once
// on the way back, as ATen's bf16 softmax rounds its float result.
FSDP_KERNEL_CLONES
void causal_softmax_row_bf16(uint16_t* row, float* scratch, int64_t count, int64_t n, float scale) {
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) scratch[j] = from_bf16(row[j]);
  causal_softmax_row(scratch, count, count, scale);
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) row[j] = to_bf16(scratch[j]);
  for (int64_t j = count; j < n; ++j) row[j] = 0;
}

FSDP_KERNEL_CLONES
void causal_softmax_backward_row_bf16(const uint16_t* p, uint16_t* dp, float* scratch, int64_t count, int64_t n,
                                      float scale) {
  float dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < count; ++j) {
    scratch[j] = from_bf16(dp[j]);
    dot += from_bf16(p[j]) * scratch[j];
  }
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) dp[j] = to_bf16(scale * (from_bf16(p[j]) * (scratch[j] - dot)));
  for (int64_t j = count; j < n; ++j) dp[j] = 0;
}

}  // namespace fsdp::kernels
