#include "kernels.h"

#ifdef FSDP_HAVE_SGEMM
// The BLAS LibTorch itself calls (CMakeLists.txt finds which), declared as
// ATen declares it.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);
#endif

namespace fsdp::kernels {

bool sgemm_available() {
#ifdef FSDP_HAVE_SGEMM
  return true;
#else
  return false;
#endif
}

void sgemm_rows(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#ifdef FSDP_HAVE_SGEMM
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
  // same memory, operands swapped.
  const char op_a = trans_a ? 'T' : 'N', op_b = trans_b ? 'T' : 'N';
  const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
  const int LDA = static_cast<int>(ldb), LDB = static_cast<int>(lda), LDC = static_cast<int>(ldc);
  sgemm_(&op_b, &op_a, &M, &N, &K, &alpha, b, &LDA, a, &LDB, &beta, c, &LDC);
#else
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb,
      (void)beta, (void)c, (void)ldc;
#endif
}

}  // namespace fsdp::kernels
