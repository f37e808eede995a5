#include <dlfcn.h>

#include <atomic>

#include "kernels.h"

namespace fsdp::kernels {
namespace {

using Sgemm = void (*)(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

// The sgemm_ the process already has, looked up once: the BLAS LibTorch
// calls (MKL inside a wheel's libtorch_cpu, the system's libblas under a
// distribution's LibTorch), so nothing is linked that could stand in for
// LibTorch's own. Declared as ATen declares it.
Sgemm process_sgemm() {
  static const auto found = reinterpret_cast<Sgemm>(dlsym(RTLD_DEFAULT, "sgemm_"));
  return found;
}

std::atomic<bool> hidden_for_testing{false};

}  // namespace

bool sgemm_available() { return process_sgemm() != nullptr && !hidden_for_testing.load(std::memory_order_relaxed); }

void set_sgemm_hidden_for_testing(bool hidden) { hidden_for_testing.store(hidden); }

void sgemm_rows(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
  // same memory, operands swapped.
  const char op_a = trans_a ? 'T' : 'N', op_b = trans_b ? 'T' : 'N';
  const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
  const int LDA = static_cast<int>(ldb), LDB = static_cast<int>(lda), LDC = static_cast<int>(ldc);
  process_sgemm()(&op_b, &op_a, &M, &N, &K, &alpha, b, &LDA, a, &LDB, &beta, c, &LDC);
}

}  // namespace fsdp::kernels
