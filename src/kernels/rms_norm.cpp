#include <cmath>

#include "float_math.h"
#include "kernels.h"

namespace fsdp::kernels {
namespace {

// 1 / sqrt(mean(x^2) + eps) of a float row.
inline float row_rstd(const float* x, int64_t n, float eps) {
  float squares = 0;
#pragma omp simd reduction(+ : squares)
  for (int64_t j = 0; j < n; ++j) squares += x[j] * x[j];
  return 1.0f / std::sqrt(squares / static_cast<float>(n) + eps);
}

// dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * w and xhat = x *
// rstd; adds dy * normed into the weight gradient's float accumulator,
// `normed` being what forward multiplied the weight by.
inline void row_backward(const float* x, const float* dy, const float* w, const float* normed, float rstd, float* dx,
                         float* dw, int64_t n) {
  float gx_sum = 0;
#pragma omp simd reduction(+ : gx_sum)
  for (int64_t j = 0; j < n; ++j) gx_sum += dy[j] * w[j] * x[j];
  const float gx_mean = gx_sum * rstd / static_cast<float>(n);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float xhat = x[j] * rstd;
    dx[j] = rstd * (dy[j] * w[j] - xhat * gx_mean);
    dw[j] += dy[j] * normed[j];
  }
}

}  // namespace

FSDP_KERNEL_CLONES
void rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps, float* rstd) {
  const float r = row_rstd(x, n, eps);
  *rstd = r;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = w[j] * (x[j] * r);
}

FSDP_KERNEL_CLONES
void rms_norm_row_bf16(const uint16_t* x, const float* w, uint16_t* y, float* scratch, int64_t n, float eps,
                       float* rstd) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) scratch[j] = from_bf16(x[j]);
  const float r = row_rstd(scratch, n, eps);
  *rstd = r;
  // Rounded to bf16 before the weight and after it, as the module's formula
  // (and Hugging Face's) rounds.
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = to_bf16(w[j] * from_bf16(to_bf16(scratch[j] * r)));
}

FSDP_KERNEL_CLONES
void rms_norm_backward_row(const float* x, const float* dy, const float* w, float rstd, float* dx, float* dw,
                           float* scratch, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) scratch[j] = x[j] * rstd;
  row_backward(x, dy, w, scratch, rstd, dx, dw, n);
}

FSDP_KERNEL_CLONES
void rms_norm_backward_row_bf16(const uint16_t* x, const uint16_t* dy, const float* w, float rstd, uint16_t* dx,
                                float* dw, float* scratch, int64_t n) {
  float* xf = scratch;
  float* dyf = scratch + n;
  float* normed = scratch + 2 * n;
  float* dxf = scratch + 3 * n;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    xf[j] = from_bf16(x[j]);
    dyf[j] = from_bf16(dy[j]);
    normed[j] = from_bf16(to_bf16(xf[j] * rstd));
  }
  row_backward(xf, dyf, w, normed, rstd, dxf, dw, n);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dx[j] = to_bf16(dxf[j]);
}

}  // namespace fsdp::kernels
