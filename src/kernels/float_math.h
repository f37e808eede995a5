#pragma once
// Scalar float helpers written so that loops calling them vectorise (no
// libm calls, no branches the compiler cannot turn into selects).

#include <cstdint>

namespace fsdp::kernels {

// e^x for x <= 0 (Cephes' expf: round x / ln 2 to n, a degree-6 polynomial
// on the remainder, times 2^n by exponent arithmetic), within 2 ulp. Below
// -87 (e^-87 = 1.6e-38, the smallest normal float's order) it is 0, as
// with denormals flushed.
inline float exp_nonpositive(float x) {
  const float c = x > -87.0f ? x : -87.0f;  // keeps 2^n a normal number
  const float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // rounded to nearest
  float r = c - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  const float r2 = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r2 + r + 1.0f;
  const float e = y * __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
  return x < -87.0f ? 0.0f : e;
}

// 1 + tanh(u), and 1 - tanh(u)^2 into *sech2, from one e = e^(-2|u|) <= 1:
// 1 + tanh(u) is 2 / (1 + e) for u >= 0 and 2e / (1 + e) below, and
// 1 - tanh(u)^2 is 4e / (1 + e)^2. Written so, neither loses digits where
// tanh saturates (1 + t and 1 - t * t would), and nothing overflows.
inline float one_plus_tanh(float u, float* sech2) {
  const float e = exp_nonpositive(-2.0f * (u < 0 ? -u : u));
  const float inv = 1.0f / (1.0f + e);
  *sech2 = 4.0f * e * inv * inv;
  return (u < 0 ? 2.0f * e : 2.0f) * inv;
}

// bf16 as raw bits: widening is exact; narrowing rounds to nearest, ties to
// even, as c10::BFloat16 does.
inline float from_bf16(uint16_t b) { return __builtin_bit_cast(float, static_cast<uint32_t>(b) << 16); }

inline uint16_t to_bf16(float f) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, f);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace fsdp::kernels
