#pragma once
// Element loops that ATen runs as several passes (or through temporaries)
// and fsdp.cpp runs as one. They are free of LibTorch so they compile with
// the flags they need (CMakeLists.txt: no errno from sqrt/exp, no implicit
// fused multiply-adds, OpenMP SIMD) and, on x86-64, in one clone per ISA
// level, picked when the program loads. Callers split the work across
// threads; each function handles one range.

#include <cmath>
#include <cstdint>

// A build may pin one level instead: FSDP_KERNEL_CLONES defined empty and
// -march set (tests/kernels/ builds the AVX2 and baseline levels so).
#if defined(FSDP_KERNEL_CLONES)
#elif defined(__x86_64__) && defined(__GNUC__)
#define FSDP_KERNEL_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FSDP_KERNEL_CLONES
#endif

namespace fsdp::kernels {

// One parameter's slice of the AdamW update, with the constants of its group
// and step already folded in the way torch::optim::AdamW rounds them.
struct AdamWSegment {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t numel;
  float decay;  // 1 - lr * weight_decay (1 without decay)
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bias_correction2_sqrt;
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^step)
  float grad_scale;     // each gradient is used as grad * grad_scale (gradient clipping)
};

// Updates elements [begin, end) of one segment in place.
void adamw_update(const AdamWSegment& s, int64_t begin, int64_t end);

// Sum of x[i]^2 over [0, n), squares and sum in double.
double sum_of_squares(const float* x, int64_t n);

// One row of logits in, its cross-entropy loss out (log-sum-exp minus the
// target's logit, in double); the row is overwritten with the loss's
// gradient, (softmax(row) - one_hot(target)) * grad_scale.
double softmax_cross_entropy_row(float* row, int64_t n, int64_t target, float grad_scale);
// The same on a row of bf16 (raw bits), computed in float in `scratch` (n
// floats), the gradient written back in bf16.
double softmax_cross_entropy_row_bf16(uint16_t* row, float* scratch, int64_t n, int64_t target, float grad_scale);

// The same for logits stored transposed, (n, stride) with one column per
// token: columns [0, width) of `logits`, width <= kColumns, their targets
// and their losses (width of each). 64 columns a block: on gpt2-d6's
// logits (50257 x 1024) the kernel took 53 ms a step with 32, 40 with 64,
// 37 with 128, the last two within this machine's run-to-run spread; 64
// leaves twice the blocks to share between threads at small batches.
constexpr int64_t kColumns = 64;
void softmax_cross_entropy_columns(float* logits, int64_t stride, int64_t n, int64_t width, const int64_t* targets,
                                   float grad_scale, double* losses);

// GPT-2's GELU (tanh approximation) and its backward, element-wise, in
// fp32 or on bf16 bits (computed in float, rounded once).
// Dropout by a counter-based generator: element i of a call (i counted
// from `first` over the call's whole tensor) is kept when 32 bits hashed
// from (i, seed) are at least `threshold` (p * 2^32), and scaled by
// `scale`; forward and backward apply the same function, so the mask is
// never stored and does not depend on how the work is split.
void dropout_apply(const float* x, float* y, int64_t n, uint32_t first, uint64_t seed, uint32_t threshold,
                   float scale);
// The threshold for dropout probability p (0 <= p < 1): p * 2^32.
inline uint32_t dropout_threshold(double p) { return static_cast<uint32_t>(std::ldexp(p, 32)); }
void dropout_apply_bf16(const uint16_t* x, uint16_t* y, int64_t n, uint32_t first, uint64_t seed, uint32_t threshold,
                        float scale);

void gelu_tanh(const float* x, float* y, int64_t n);
void gelu_tanh_backward(const float* x, const float* dy, float* dx, int64_t n);
void gelu_tanh_bf16(const uint16_t* x, uint16_t* y, int64_t n);
void gelu_tanh_backward_bf16(const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n);

// Row i of a causal attention score matrix with n columns, count = i + 1:
// row[j] becomes softmax over j < count of scale * row[j], and 0 for
// j >= count (the future), in place.
void causal_softmax_row(float* row, int64_t count, int64_t n, float scale);
// Its backward in place over dp: scale * p * (dp - sum(p * dp)) for
// j < count, 0 after.
void causal_softmax_backward_row(const float* p, float* dp, int64_t count, int64_t n, float scale);
// The same on bf16 bits, computed in float (`scratch`: count floats).
void causal_softmax_row_bf16(uint16_t* row, float* scratch, int64_t count, int64_t n, float scale);
void causal_softmax_backward_row_bf16(const uint16_t* p, uint16_t* dp, float* scratch, int64_t count, int64_t n,
                                      float scale);

// Attention's weights by blocks of query rows (src/models/attention.cpp): a
// block holds queries [first, first + count), query i's weights over keys
// [0, first + count) in row i - first, so each row is first + count long.
// `starts`, indexed by query, is where each query's example starts in
// packed rows (its weights before it are 0); null when the rows are not
// packed. Softmax: each row as causal_softmax_row from its example's start,
// zeros before it; backward in place over dp, likewise. bf16 `scratch`:
// first + count floats.
void attention_softmax_block(float* block, int64_t first, int64_t count, const int64_t* starts, float scale);
void attention_softmax_block_bf16(uint16_t* block, float* scratch, int64_t first, int64_t count, const int64_t* starts,
                                  float scale);
void attention_softmax_backward_block(const float* p, float* dp, int64_t first, int64_t count, const int64_t* starts,
                                      float scale);
void attention_softmax_backward_block_bf16(const uint16_t* p, uint16_t* dp, float* scratch, int64_t first,
                                           int64_t count, const int64_t* starts, float scale);
// Dropout (dropout_apply) of a block's rows into `out`, which may be `in`:
// weight (i, j) is element i * positions + j of its head's square, whatever
// the blocking, so backward draws forward's mask; that index counts in 32
// bits (the caller keeps positions small enough). Whole rows, the zeros
// after the diagonal included.
void attention_dropout_block(const float* in, float* out, int64_t first, int64_t count, int64_t positions,
                             uint64_t seed, uint32_t threshold, float scale);
void attention_dropout_block_bf16(const uint16_t* in, uint16_t* out, int64_t first, int64_t count, int64_t positions,
                                  uint64_t seed, uint32_t threshold, float scale);

// Layer norm over one row of n values: y = (x - mean) * rstd * w + b, with
// the row's mean and rstd = 1 / sqrt(var + eps) written out for backward.
// w and b are float; x and y fp32 or bf16 bits (`scratch`: n floats).
void layer_norm_row(const float* x, const float* w, const float* b, float* y, int64_t n, float eps, float* mean,
                    float* rstd);
void layer_norm_row_bf16(const uint16_t* x, const float* w, const float* b, uint16_t* y, float* scratch, int64_t n,
                         float eps, float* mean, float* rstd);
// Its backward for one row: dx written; dy * xhat added into dw and dy
// into db (float accumulators of n). bf16 `scratch`: 3n floats.
void layer_norm_backward_row(const float* x, const float* dy, const float* w, float mean, float rstd, float* dx,
                             float* dw, float* db, int64_t n);
void layer_norm_backward_row_bf16(const uint16_t* x, const uint16_t* dy, const float* w, float mean, float rstd,
                                  uint16_t* dx, float* dw, float* db, float* scratch, int64_t n);

// RMS norm over one row of n values: y = w * (x * rstd), rstd = 1 /
// sqrt(mean(x^2) + eps) written out for backward. w is float; x and y
// fp32 or bf16 bits (`scratch`: n floats), bf16 rounded before the weight
// and after it, as Hugging Face's formula rounds.
void rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps, float* rstd);
void rms_norm_row_bf16(const uint16_t* x, const float* w, uint16_t* y, float* scratch, int64_t n, float eps,
                       float* rstd);
// Its backward for one row: dx written, dy * x * rstd (as forward rounded
// it) added into dw, a float accumulator of n. `scratch`: n floats in
// fp32, 4n in bf16.
void rms_norm_backward_row(const float* x, const float* dy, const float* w, float rstd, float* dx, float* dw,
                           float* scratch, int64_t n);
void rms_norm_backward_row_bf16(const uint16_t* x, const uint16_t* dy, const float* w, float rstd, uint16_t* dx,
                                float* dw, float* scratch, int64_t n);

// SwiGLU's activation, h = silu(g) * u element-wise, and its backward (dg
// and du from dh), in fp32 or on bf16 bits (computed in float, rounded
// once).
void silu_mul(const float* g, const float* u, float* h, int64_t n);
void silu_mul_backward(const float* g, const float* u, const float* dh, float* dg, float* du, int64_t n);
void silu_mul_bf16(const uint16_t* g, const uint16_t* u, uint16_t* h, int64_t n);
void silu_mul_backward_bf16(const uint16_t* g, const uint16_t* u, const uint16_t* dh, uint16_t* dg, uint16_t* du,
                            int64_t n);

// Row-major C (m x n) = alpha op(A) op(B) + beta C, op transposing where
// asked, rows lda, ldb and ldc elements apart (at most 2^31 - 1, like every
// dimension, and each at least its row's width and 1), by the BLAS the
// process has loaded with LibTorch, on the calling thread's terms (one
// thread inside at::parallel_for for MKL and OpenMP BLAS builds):
// sgemm_rows by its sgemm_, gemm_bf16_rows (A and B bf16 bits, C float) by
// MKL's gemm_bf16bf16f32_. Only where *_available(): a LibTorch that
// exposes no such symbol (a static one, or one on another BLAS than MKL
// for bf16) keeps ATen's matmuls.
bool sgemm_available();
bool gemm_bf16_available();
// Tests only: while set, both answer as in a process without these
// symbols, so the ATen path runs where BLAS is present.
void set_blas_hidden_for_testing(bool hidden);
void sgemm_rows(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm_bf16_rows(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
                    int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc);

// y[i] = x[i] rounded to bf16 (nearest, ties to even), for i in [0, n).
void float_to_bf16(const float* x, uint16_t* y, int64_t n);
// The same for a (rows, cols) matrix, rows ldx elements apart in x and
// ldy in y.
void float_to_bf16_rows(const float* x, int64_t ldx, uint16_t* y, int64_t ldy, int64_t rows, int64_t cols);

}  // namespace fsdp::kernels
