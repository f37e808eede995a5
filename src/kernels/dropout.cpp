#include "float_math.h"
#include "kernels.h"

namespace fsdp::kernels {
namespace {

// "lowbias32" (C. Wellons' integer hash search): a bijection on 32 bits
// with full avalanche, in multiplies, shifts and xors that vectorise.
inline uint32_t mix(uint32_t h) {
  h ^= h >> 16;
  h *= 0x7feb352dU;
  h ^= h >> 15;
  h *= 0x846ca68bU;
  h ^= h >> 16;
  return h;
}

// Two rounds keyed by the call's seed: element `index`'s 32 random bits.
inline uint32_t bits(uint32_t index, uint32_t key0, uint32_t key1) {
  return mix(mix(index * 0x9e3779b9U ^ key0) ^ key1);
}

// The loop both element types share: `scaled` maps a kept element to its
// output (inlined into each ISA clone below, where it vectorises).
template <typename T, typename Scaled>
inline void masked(const T* x, T* y, int64_t n, uint32_t first, uint64_t seed, uint32_t threshold, Scaled scaled) {
  const auto key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = bits(first + static_cast<uint32_t>(i), key0, key1) >= threshold;
    const T v = x[i];  // read whatever is kept: a load only under `keep` stays a branch without masks
    y[i] = keep ? scaled(v) : static_cast<T>(0);
  }
}

}  // namespace

FSDP_KERNEL_CLONES
void dropout_apply(const float* x, float* y, int64_t n, uint32_t first, uint64_t seed, uint32_t threshold,
                   float scale) {
  masked(x, y, n, first, seed, threshold, [scale](float v) { return v * scale; });
}

FSDP_KERNEL_CLONES
void dropout_apply_bf16(const uint16_t* x, uint16_t* y, int64_t n, uint32_t first, uint64_t seed, uint32_t threshold,
                        float scale) {
  masked(x, y, n, first, seed, threshold, [scale](uint16_t v) { return to_bf16(from_bf16(v) * scale); });
}

}  // namespace fsdp::kernels
