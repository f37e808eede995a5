#include <cmath>

#include "float_math.h"
#include "kernels.h"

namespace fsdp::kernels {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;

inline float gelu(float x) {
  float sech2;
  return 0.5f * x * one_plus_tanh(kSqrt2OverPi * (x + kCubic * x * x * x), &sech2);
}

inline float gelu_grad(float x, float dy) {
  const float x2 = x * x;
  float sech2;
  const float one_plus_t = one_plus_tanh(kSqrt2OverPi * (x + kCubic * x2 * x), &sech2);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x2);
  return dy * (0.5f * one_plus_t + 0.5f * x * sech2 * du);
}

}  // namespace

FSDP_KERNEL_CLONES
void gelu_tanh(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = gelu(x[i]);
}

FSDP_KERNEL_CLONES
void gelu_tanh_backward(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = gelu_grad(x[i], dy[i]);
}

FSDP_KERNEL_CLONES
void gelu_tanh_bf16(const uint16_t* x, uint16_t* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = to_bf16(gelu(from_bf16(x[i])));
}

FSDP_KERNEL_CLONES
void gelu_tanh_backward_bf16(const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = to_bf16(gelu_grad(from_bf16(x[i]), from_bf16(dy[i])));
}

}  // namespace fsdp::kernels
