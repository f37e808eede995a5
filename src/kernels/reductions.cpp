#include "kernels.h"

namespace fsdp::kernels {

// A float squared is exact in double; the sum is reassociated across SIMD
// lanes, so it is reproducible for a given range, not bit-equal to a
// sequential loop.
FSDP_KERNEL_CLONES
double sum_of_squares(const float* x, int64_t n) {
  double total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) {
    const double xi = x[i];
    total += xi * xi;
  }
  return total;
}

}  // namespace fsdp::kernels
