#include <cmath>

#include "float_math.h"
#include "kernels.h"

namespace fsdp::kernels {
namespace {

// Mean and 1 / sqrt(variance + eps) of a float row, the variance from the
// deviations (two passes over a row that is in cache), as ATen computes it.
inline void row_moments(const float* x, int64_t n, float eps, float* mean, float* rstd) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  const float m = sum / static_cast<float>(n);
  float squares = 0;
#pragma omp simd reduction(+ : squares)
  for (int64_t j = 0; j < n; ++j) squares += (x[j] - m) * (x[j] - m);
  *mean = m;
  *rstd = 1.0f / std::sqrt(squares / static_cast<float>(n) + eps);
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w; adds
// dy * xhat and dy into the weight and bias gradients' float accumulators.
inline void row_backward(const float* x, const float* dy, const float* w, float mean, float rstd, float* dx,
                         float* dw, float* db, int64_t n) {
  float g_sum = 0, gx_sum = 0;
#pragma omp simd reduction(+ : g_sum, gx_sum)
  for (int64_t j = 0; j < n; ++j) {
    const float g = dy[j] * w[j];
    g_sum += g;
    gx_sum += g * (x[j] - mean) * rstd;
  }
  const float g_mean = g_sum / static_cast<float>(n), gx_mean = gx_sum / static_cast<float>(n);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float xhat = (x[j] - mean) * rstd;
    dx[j] = rstd * (dy[j] * w[j] - g_mean - xhat * gx_mean);
    dw[j] += dy[j] * xhat;
    db[j] += dy[j];
  }
}

}  // namespace

FSDP_KERNEL_CLONES
void layer_norm_row(const float* x, const float* w, const float* b, float* y, int64_t n, float eps, float* mean,
                    float* rstd) {
  row_moments(x, n, eps, mean, rstd);
  const float m = *mean, r = *rstd;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - m) * r * w[j] + b[j];
}

FSDP_KERNEL_CLONES
void layer_norm_row_bf16(const uint16_t* x, const float* w, const float* b, uint16_t* y, float* scratch, int64_t n,
                         float eps, float* mean, float* rstd) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) scratch[j] = from_bf16(x[j]);
  row_moments(scratch, n, eps, mean, rstd);
  const float m = *mean, r = *rstd;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = to_bf16((scratch[j] - m) * r * w[j] + b[j]);
}

FSDP_KERNEL_CLONES
void layer_norm_backward_row(const float* x, const float* dy, const float* w, float mean, float rstd, float* dx,
                             float* dw, float* db, int64_t n) {
  row_backward(x, dy, w, mean, rstd, dx, dw, db, n);
}

FSDP_KERNEL_CLONES
void layer_norm_backward_row_bf16(const uint16_t* x, const uint16_t* dy, const float* w, float mean, float rstd,
                                  uint16_t* dx, float* dw, float* db, float* scratch, int64_t n) {
  float* xf = scratch;
  float* dyf = scratch + n;
  float* dxf = scratch + 2 * n;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    xf[j] = from_bf16(x[j]);
    dyf[j] = from_bf16(dy[j]);
  }
  row_backward(xf, dyf, w, mean, rstd, dxf, dw, db, n);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dx[j] = to_bf16(dxf[j]);
}

}  // namespace fsdp::kernels
