#include <dlfcn.h>

#include <atomic>

#include "float_math.h"
#include "kernels.h"

namespace fsdp::kernels {
namespace {

// Declared as ATen declares sgemm_, and as MKL declares gemm_bf16bf16f32_
// (its LP64 interface: 32-bit integers; bf16 as raw bits).
template <typename In>
using Gemm = void (*)(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                      const float* alpha, const In* a, const int* lda, const In* b, const int* ldb,
                      const float* beta, float* c, const int* ldc);

// The symbol the process already has, looked up once: the BLAS LibTorch
// calls (MKL inside a wheel's libtorch_cpu, the system's libblas under a
// distribution's LibTorch), so nothing is linked that could stand in for
// LibTorch's own.
template <typename In>
Gemm<In> process_gemm(const char* name) {
  return reinterpret_cast<Gemm<In>>(dlsym(RTLD_DEFAULT, name));
}

Gemm<float> process_sgemm() {
  static const auto found = process_gemm<float>("sgemm_");
  return found;
}

Gemm<uint16_t> process_gemm_bf16() {
  static const auto found = process_gemm<uint16_t>("gemm_bf16bf16f32_");
  return found;
}

std::atomic<bool> hidden_for_testing{false};

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
// same memory, operands swapped.
template <typename In>
void gemm_rows(Gemm<In> gemm, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const In* a,
               int64_t lda, const In* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const char op_a = trans_a ? 'T' : 'N', op_b = trans_b ? 'T' : 'N';
  const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
  const int LDA = static_cast<int>(ldb), LDB = static_cast<int>(lda), LDC = static_cast<int>(ldc);
  gemm(&op_b, &op_a, &M, &N, &K, &alpha, b, &LDA, a, &LDB, &beta, c, &LDC);
}

}  // namespace

bool sgemm_available() { return process_sgemm() != nullptr && !hidden_for_testing.load(std::memory_order_relaxed); }

bool gemm_bf16_available() {
  return process_gemm_bf16() != nullptr && !hidden_for_testing.load(std::memory_order_relaxed);
}

void set_blas_hidden_for_testing(bool hidden) { hidden_for_testing.store(hidden); }

void sgemm_rows(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_rows(process_sgemm(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_bf16_rows(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
                    int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_rows(process_gemm_bf16(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The operands gemm_bf16_rows takes, from float ones.
FSDP_KERNEL_CLONES void float_to_bf16(const float* x, uint16_t* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = to_bf16(x[i]);
}

void float_to_bf16_rows(const float* x, int64_t ldx, uint16_t* y, int64_t ldy, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) float_to_bf16(x + r * ldx, y + r * ldy, cols);
}

}  // namespace fsdp::kernels
