#include <cmath>
#include <limits>

#include "float_math.h"
#include "kernels.h"

namespace fsdp::kernels {
namespace {

// Float sums of 512 terms (vectorised), added up in double: a plain float
// sum of 50,000 terms would lose the loss's sixth digit.
constexpr int64_t kBlock = 512;

}  // namespace

FSDP_KERNEL_CLONES
double softmax_cross_entropy_row(float* row, int64_t n, int64_t target, float grad_scale) {
  float max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max)
  for (int64_t i = 0; i < n; ++i) max = row[i] > max ? row[i] : max;
  const float target_logit = row[target];
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

// The bf16 form reads a row of bf16 logits into `scratch` (n floats, still
// in cache when the float kernel runs over it) and writes the gradient back
// over the logits in bf16: no fp32 copy of all logits in memory, no cast of
// the gradient for the backward matmuls, and one rounding, as casting the
// fp32 gradient would give.
FSDP_KERNEL_CLONES
double softmax_cross_entropy_row_bf16(uint16_t* row, float* scratch, int64_t n, int64_t target, float grad_scale) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) scratch[i] = from_bf16(row[i]);
  const double loss = softmax_cross_entropy_row(scratch, n, target, grad_scale);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) row[i] = to_bf16(scratch[i]);
  return loss;
}

// The same over columns: `logits` is (n, stride) row-major and holds the
// logits of columns [0, width) column-wise (width <= kColumns). Each of
// the three passes over the n rows reads `width` neighbouring floats per
// row (four AVX-512 vectors at 64), vectorised across the columns.
FSDP_KERNEL_CLONES
void softmax_cross_entropy_columns(float* logits, int64_t stride, int64_t n, int64_t width, const int64_t* targets,
                                   float grad_scale, double* losses) {
  float max[kColumns], part[kColumns], target_logit[kColumns];
  double sum[kColumns];
  for (int64_t j = 0; j < kColumns; ++j) {
    max[j] = -std::numeric_limits<float>::infinity();
    sum[j] = 0;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits + i * stride;
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) max[j] = row[j] > max[j] ? row[j] : max[j];
  }
  for (int64_t j = 0; j < width; ++j) target_logit[j] = logits[targets[j] * stride + j];
  for (int64_t block = 0; block < n; block += kBlock) {
    const int64_t stop = block + kBlock < n ? block + kBlock : n;
    for (int64_t j = 0; j < kColumns; ++j) part[j] = 0;
    for (int64_t i = block; i < stop; ++i) {
      float* row = logits + i * stride;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) {
        const float e = exp_nonpositive(row[j] - max[j]);
        row[j] = e;
        part[j] += e;
      }
    }
    for (int64_t j = 0; j < width; ++j) sum[j] += part[j];
  }
  float to_gradient[kColumns];
  for (int64_t j = 0; j < width; ++j) to_gradient[j] = static_cast<float>(grad_scale / sum[j]);
  for (int64_t i = 0; i < n; ++i) {
    float* row = logits + i * stride;
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) row[j] *= to_gradient[j];
  }
  for (int64_t j = 0; j < width; ++j) {
    logits[targets[j] * stride + j] -= grad_scale;
    losses[j] = static_cast<double>(max[j]) + std::log(sum[j]) - static_cast<double>(target_logit[j]);
  }
}

}  // namespace fsdp::kernels
