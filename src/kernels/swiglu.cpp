#include "float_math.h"
#include "kernels.h"

namespace fsdp::kernels {
namespace {

// sigmoid(g) from e = e^-|g| <= 1: 1 / (1 + e) for g >= 0, e / (1 + e)
// below, so neither tail overflows; 1 - sigmoid(g) is the other one, which
// keeps its digits where sigmoid(g) rounds to nearly 1.
inline float sigmoid(float g, float* one_minus) {
  const float e = exp_nonpositive(g < 0 ? g : -g);
  const float inv = 1.0f / (1.0f + e);
  const float small = e * inv;
  *one_minus = g < 0 ? inv : small;
  return g < 0 ? small : inv;
}

inline float sigmoid(float g) {
  float one_minus;
  return sigmoid(g, &one_minus);
}

// d(silu(g) u): du = dh silu(g), dg = dh u s (1 + g (1 - s)).
inline void grads(float g, float u, float dh, float* dg, float* du) {
  float one_minus;
  const float s = sigmoid(g, &one_minus);
  *du = dh * g * s;
  *dg = dh * u * s * (1.0f + g * one_minus);
}

}  // namespace

FSDP_KERNEL_CLONES
void silu_mul(const float* g, const float* u, float* h, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
}

FSDP_KERNEL_CLONES
void silu_mul_backward(const float* g, const float* u, const float* dh, float* dg, float* du, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float a, b;
    grads(g[i], u[i], dh[i], &a, &b);
    dg[i] = a;
    du[i] = b;
  }
}

FSDP_KERNEL_CLONES
void silu_mul_bf16(const uint16_t* g, const uint16_t* u, uint16_t* h, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float x = from_bf16(g[i]);
    h[i] = to_bf16(x * sigmoid(x) * from_bf16(u[i]));
  }
}

FSDP_KERNEL_CLONES
void silu_mul_backward_bf16(const uint16_t* g, const uint16_t* u, const uint16_t* dh, uint16_t* dg, uint16_t* du,
                            int64_t n) {
  // Widened into float first: with the conversions inside one loop GCC 12
  // does not vectorise it (control flow it cannot if-convert).
  constexpr int64_t kChunk = 256;
  float gf[kChunk], uf[kChunk], dhf[kChunk], dgf[kChunk], duf[kChunk];
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t m = n - start < kChunk ? n - start : kChunk;
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) {
      gf[i] = from_bf16(g[start + i]);
      uf[i] = from_bf16(u[start + i]);
      dhf[i] = from_bf16(dh[start + i]);
    }
    silu_mul_backward(gf, uf, dhf, dgf, duf, m);
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) {
      dg[start + i] = to_bf16(dgf[i]);
      du[start + i] = to_bf16(duf[i]);
    }
  }
}

}  // namespace fsdp::kernels
